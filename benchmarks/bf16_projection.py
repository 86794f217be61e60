"""Would a bfloat16-input, float32-accumulate product make the Fourier kinds' projections
faster, and at what error? (the measurement behind an optional bf16 mode; nothing in the
package uses bf16)

Speed: u = x W^T (x: N x d queries or keys of one head, W: m x d frequencies) with one
register tile, 8 rows x 32 columns in 16 zmm accumulators, written twice in
benchmarks/bf16_projection.c: float32 FMAs, and AVX512_BF16's VDPBF16PS on bf16 inputs
(two products per lane and instruction); where the CPU has amx_bf16 (and Linux grants the
tile state), also AMX's TDPBF16PS on the same bf16 inputs, a 32 x 32 block of u in four
tiles. The bf16 times "with conversions" include converting x (every call) and W. NumPy's
float32 matmul (its BLAS, one thread) is the peer. Medians over interleaved rounds, one
thread.

Error, in float64 against the exact projection and attention:
* the projection: |u_bf16 - u| / sum_t |x_t w_t|, whose bound for round-to-nearest-even
  inputs is 2^-8 + 2^-16 (each factor's relative error at most 2^-9), plus float32's
  accumulation;
* the attention output of Flexformer_n (Flexformer_s) when only the projections' inputs
  are rounded to bf16 (q, k and the frequencies; the norm factor, the features and the
  sums in float32 or better), as |out - out_exact| / max |v|, beside the float32 kernel's
  own error at the same inputs. The angle error, and so the feature error, grows with
  |x| |w|: a projection of 20 radians has about 2^-8 * 20 = 0.08 radians of error.

    python benchmarks/bf16_projection.py [--seq-len 4096] [--head-dim 64] [--features 64 128]
                                         [--rounds 7] [--out FILE.json]

Needs x86-64 with avx512_bf16 (/proc/cpuinfo) and a C compiler; elsewhere it says so and
exits 0.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the peer on one thread, as the tile
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "bf16_projection.c")
BF16_BOUND = 2.0 ** -8 + 2.0 ** -16


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def build(folder: str) -> ctypes.CDLL:
    lib = os.path.join(folder, "bf16_projection.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O3", "-shared", "-fPIC", SOURCE, "-o", lib], check=True)
    dll = ctypes.CDLL(lib)
    size, ptr = ctypes.c_size_t, ctypes.c_void_p
    dll.fp32_projection.argtypes = [ptr, ptr, ptr, size, size, size]
    dll.bf16_projection.argtypes = [ptr, ptr, ptr, size, size, size]
    dll.fp32_to_bf16_rows.argtypes = [ptr, ptr, size]
    dll.frequencies_to_bf16_pairs.argtypes = [ptr, ptr, size, size]
    dll.amx_projection.argtypes = [ptr, ptr, ptr, size, size, size]
    dll.fp32_projection.restype = dll.bf16_projection.restype = dll.amx_projection.restype = ctypes.c_int
    dll.amx_request.restype = ctypes.c_int
    return dll


def amx_available(dll) -> bool:
    """amx_bf16 in /proc/cpuinfo and the kernel grants this process the tile state."""
    return "amx_bf16" in cpu_flags() and dll.amx_request() == 0


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), returned as float32 (NumPy has no bf16)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def speed(dll, N: int, d: int, m: int, rounds: int, rng, amx: bool) -> dict:
    x = (0.5 * rng.standard_normal((N, d))).astype(np.float32)
    w = (rng.standard_normal((m, d)) / np.sqrt(np.sqrt(d))).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    u32, ubf, uamx = (np.empty((N, m), np.float32) for _ in range(3))
    x2 = np.empty(N * d, np.uint16)
    w2 = np.empty((d // 2) * m, np.uint32)
    p = lambda a: a.ctypes.data  # noqa: E731

    def fp32():
        assert dll.fp32_projection(p(u32), p(x), p(wt), N, d, m) == 0

    def bf16_runs(product, u):
        """The bf16 product into u: with converting x and W first, and alone."""
        def with_conversions():
            dll.frequencies_to_bf16_pairs(p(w2), p(w), m, d)
            dll.fp32_to_bf16_rows(p(x2), p(x), N * d)
            product_only()

        def product_only():
            assert product(p(u), p(x2), p(w2), N, d, m) == 0

        return with_conversions, product_only

    bf16, bf16_product_only = bf16_runs(dll.bf16_projection, ubf)
    amx_with_conversions, amx_product_only = bf16_runs(dll.amx_projection, uamx)

    def numpy_matmul():
        np.matmul(x, w.T, out=u32)

    runs = {"float32 tile": fp32, "bf16 tile, with conversions": bf16, "bf16 tile, product only": bf16_product_only}
    if amx:
        runs.update({"AMX bf16, with conversions": amx_with_conversions, "AMX bf16, product only": amx_product_only})
    runs["NumPy float32 matmul"] = numpy_matmul
    for fn in runs.values():  # warm-up, and the buffers the product-only run reads
        for _ in range(3):
            fn()
    times = {name: [] for name in runs}
    for _ in range(rounds):  # interleaved: a slow phase of the host hits every variant
        for name, fn in runs.items():
            times[name].append(median_ms(fn, 5))
    fp32()  # the matmul peer wrote into u32 last; ubf still holds the bf16 product of x and w
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64)
    flops = 2.0 * N * d * m
    out = {name: {"ms": float(np.median(t)), "rounds_ms": t, "gflops": flops / np.median(t) / 1e6}
           for name, t in times.items()}
    out["error"] = {
        "float32 tile": float((np.abs(u32 - exact) / scale).max()),
        "bf16 tile": float((np.abs(ubf - exact) / scale).max()),
        **({"AMX bf16": float((np.abs(uamx - exact) / scale).max())} if amx else {}),
        "bound": BF16_BOUND,
        "max |u| (radians)": float(np.abs(exact).max()),
    }
    return out


def attention_error(kind: str, N: int, d: int, m: int, input_scale: float, rng) -> dict:
    """The attention output with only the projections' inputs rounded to bf16, against the
    exact float64 output; the float32 kernel's own error beside it. q, k, v ~
    ``input_scale`` N(0, 1), the kind's initial parameters."""
    import flexformer as ff
    from flexformer import reference

    spec = ff.get_attention(kind)
    q, k, v = (input_scale * rng.standard_normal((1, 2, N, d)) for _ in range(3))
    params = spec.init(2, d, num_features=m, rng=1)
    exact = ff.attention(kind, q, k, v, params)

    # the directions f from bf16-rounded x and frequencies; the keys' norm factor s from k itself
    # (the queries' cancels in the ratio)
    p16 = {n: (to_bf16(a.astype(np.float32)).astype(np.float64) if a.ndim == 3 else a) for n, a in params.items()}
    fq, fk = (spec.feature_map(to_bf16(x.astype(np.float32)).astype(np.float64), p16)[0] for x in (q, k))
    _, sk = spec.feature_map(k, params)
    shift = sk.max(-1, keepdims=True)
    phi_q, phi_k = fq, fk * np.exp(sk - shift)[..., None]
    out_bf16, _ = reference.kernel_attention(phi_q, phi_k, v, np.ones(q.shape[:-1]), np.exp(sk - shift))
    out_f32 = ff.attention(kind, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                           {n: a.astype(np.float32) for n, a in params.items()})
    vmax = np.abs(v).max()
    largest = max(np.abs(np.einsum("bhnd,hmd->bhnm", x, w)).max() for x in (q, k)
                  for w in params.values() if w.ndim == 3)
    return {"bf16 projections": float(np.abs(out_bf16 - exact).max() / vmax),
            "float32 kernel": float(np.abs(out_f32 - exact).max() / vmax), "max |u| (radians)": float(largest)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--features", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64") or "avx512_bf16" not in cpu_flags():
        print("skipped: this CPU has no avx512_bf16 (x86-64 with AVX512_BF16 needed)")
        return 0
    if args.seq_len % 32 or args.head_dim % 32 or any(m % 32 for m in args.features):
        ap.error("--seq-len, --head-dim and --features must be multiples of 32")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        dll = build(folder)
        amx = amx_available(dll)
        result = {"cpu": cpu_model(), "amx": amx, "seq_len": args.seq_len, "head_dim": args.head_dim, "rounds": args.rounds,
                  "speed": {}, "attention_error": {}}
        print(f"{result['cpu']}; u = x W^T, N = {args.seq_len}, d = {args.head_dim}, one thread, "
              f"medians of {args.rounds} interleaved rounds")
        for m in args.features:
            r = speed(dll, args.seq_len, args.head_dim, m, args.rounds, rng, amx)
            result["speed"][str(m)] = r
            base = r["float32 tile"]["ms"]
            print(f"\nm = {m}:")
            for name in (n for n in r if n != "error"):
                lo, hi = min(r[name]["rounds_ms"]), max(r[name]["rounds_ms"])
                print(f"  {name:30s} {r[name]['ms']:7.3f} ms ({lo:.3f}-{hi:.3f})  {r[name]['gflops']:6.1f} GFLOP/s  "
                      f"float32 tile / it {base / r[name]['ms']:.2f}x")
            e = r["error"]
            amx_error = f", AMX {e['AMX bf16']:.2e}" if amx else ""
            print(f"  projection error / sum|x w|: float32 {e['float32 tile']:.2e}, bf16 {e['bf16 tile']:.2e}{amx_error} "
                  f"(bound {e['bound']:.2e}); largest |u| {e['max |u| (radians)']:.1f} rad")
    n_err = min(args.seq_len, 512)  # the quadratic-form reference is O(N^2)
    print(f"\nattention output, N = {n_err}, m = {args.features[0]}, initial parameters, q, k, v ~ s N(0, 1): "
          "max |out - exact| / max |v|")
    for kind in ("flex_s", "flex_n"):
        for input_scale in (0.5, 1.0, 2.0):
            err = attention_error(kind, n_err, args.head_dim, args.features[0], input_scale, np.random.default_rng(1))
            result["attention_error"][f"{kind}, s = {input_scale}"] = err
            print(f"  {kind:7s} s = {input_scale:3.1f}: bf16 projections {err['bf16 projections']:.2e}, "
                  f"float32 kernel {err['float32 kernel']:.2e} (largest |u| {err['max |u| (radians)']:.0f} rad)")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
