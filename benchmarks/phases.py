"""Where the time of one attention call goes: a sampled profile per phase, on each ISA path.
(Not called profile.py: benchmarks/ goes on sys.path in attention.py's workers, where that
name would shadow the standard library's profile module, which torch.compile imports.)

    python benchmarks/phases.py                      # flex_n and flex_s, N=4096, both modes, levels 3 and 4
    python benchmarks/phases.py --levels 4 --kinds flex_n --modes causal

Needs Linux ``perf`` (Debian: linux-perf) and the permission to sample the process
(``kernel.perf_event_paranoid`` <= 2 for user-space samples). For every (ISA level, kind,
mode, pass) a fresh process runs the forward (or the backward) --repeats times under ``perf
record``, bidirectional calls keeping what training keeps (the key state, and flex_s's and
flex_n's projections: the forward writes them, the backward reads them); the
samples in this package's C library, in the C library's memset/memcpy, libm and the kernel's
page clearing are grouped into phases by function name (PHASES below) and shown as shares
of those samples: setup (random inputs, imports) is left out. FLEXFORMER_CPU_LEVEL picks the
path (3: AVX2 + FMA, 4: AVX-512 for sin/cos and the exponential, and the AVX-512 or AVX2
copy of the dense products, whichever the one-time timing chose). Each line gives the
median time of one call in that process (under the profiler) and each phase's share of it;
for the bidirectional passes of flex_n and flex_s also the rate of the dense products where
they run (their multiply-adds over their share of the time), to set beside
``benchmarks/tile_rate.py``'s rate of the same tile alone: the gap between the two is what
the products lose to memory and to the work around them. Writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attention import backward_product_flops, forward_product_flops  # noqa: E402  (one count of the products)

#: (phase, regular expression on the function name), first match wins
PHASES = [
    ("dense products (projections, key sums, read-out: gemm)", r"^gemm"),
    ("sin / cos", r"sincos|^trig"),
    ("feature maps, rest (norms, cos+sin sums, their gradients)", r"_features|featmap|sq_norms"),
    ("key side (state sums, dk, dv)", r"key_state|keys_backward|state_update|segment_key|reverse_sweep"),
    ("query side (outputs, dq, guard)", r"queries|chunk|forward_range|forward_sweep|guarded"),
    ("row passes (scaling, normaliser gradient, row dots, projection gradients)",
     r"^rows_|^dots|_dproj"),
    ("exp", r"exp"),
    ("memory (memset / memcpy / fresh pages / requests for the next block's rows)",
     r"memset|memcpy|memmove|clear_page|page_fault|do_anonymous|projection_spread"),
    ("glue (argument checks, conversion; finiteness of inputs and results)",
     r"attn_|check_|all_finite|^finite_|to_array|prepare"),
]

WORKER = r"""
import json, sys, time
import numpy as np
import flexformer as ff
kind, causal, pas, N, H, d, repeats, threads = sys.argv[1], sys.argv[2] == "1", sys.argv[3], *map(int, sys.argv[4:9])
ff.set_num_threads(threads)
rng = np.random.default_rng(0)
q, k, v, dout = (rng.standard_normal((1, H, N, d)).astype(np.float32) * np.float32(0.3) for _ in range(4))
params = ff.get_attention(kind).init(H, d, num_features=d, rng=1, dtype=np.float32)
spec = ff.get_attention(kind)
# bidirectional: the forward keeps what a training step's forward keeps (nn.MultiHeadAttention)
keep = {} if causal else {"return_key_state": True, "return_projections": spec.projections}
kept = {} if causal else dict(zip(("key_state", "projections"), spec.forward(q, k, v, params, **keep)[1:]))
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    if pas == "fwd":
        spec.forward(q, k, v, params, causal=causal, **keep)
    else:
        spec.backward(dout, q, k, v, params, causal=causal, **kept)
    times.append(time.perf_counter() - t0)
print(json.dumps({"ms": 1e3 * float(np.median(times))}))
"""


def product_flops(kind: str, pas: str, N: int, H: int, d: int) -> float:
    """Multiply-adds x 2 of the dense products of a bidirectional pass ("fwd" or "bwd") at
    d = e = m, as attention.py counts them."""
    count = forward_product_flops if pas == "fwd" else backward_product_flops
    return count(kind, N, H, d, d, d)


def phase_of(symbol: str) -> str:
    for name, pattern in PHASES:
        if re.search(pattern, symbol):
            return name
    return "other"


def profile_one(kind: str, causal: bool, pas: str, level: int, args) -> dict:
    tmp = tempfile.mkdtemp(prefix="flexformer-profile-")
    try:
        data = os.path.join(tmp, "perf.data")
        env = dict(os.environ, FLEXFORMER_CPU_LEVEL=str(level), OMP_NUM_THREADS=str(args.threads),
                   OPENBLAS_NUM_THREADS="1")
        cmd = ["perf", "record", "-q", "-F", "1999", "-o", data, "--", sys.executable, "-c", WORKER, kind,
               "1" if causal else "0", pas, str(args.seq_len), str(args.heads), str(args.head_dim),
               str(args.repeats), str(args.threads)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            return {"error": (run.stderr.strip().splitlines() or ["perf failed"])[-1]}
        ms = json.loads(run.stdout.strip().splitlines()[-1])["ms"]
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "dso,sym", "--percent-limit", "0"],
                             capture_output=True, text=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shares = {}
    for line in rep.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(\S+)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        ours = dso.startswith("_C.") or (dso.startswith(("libc", "libm", "[kernel")) and phase_of(sym) != "other")
        if ours:
            shares[phase_of(sym)] = shares.get(phase_of(sym), 0.0) + pct
    total = sum(shares.values()) or 1.0
    return {"ms": ms, "shares": {name: 100.0 * v / total for name, v in shares.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64, help="d = e = m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=40,
                   help="calls per process (with 10, the page clearing of the inputs' setup was "
                        "11-17%% of the samples on the Zen 4, read as 'memory'; with 40, 0-2%%)")
    p.add_argument("--levels", type=int, nargs="+", default=[3, 4])
    p.add_argument("--kinds", nargs="+", default=["flex_n", "flex_s"])
    p.add_argument("--modes", nargs="+", default=["bidir", "causal"], choices=["bidir", "causal"])
    p.add_argument("--out", default=os.path.join(HERE, "results", "latest"))
    args = p.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    import flexformer as ff

    print(f"N={args.seq_len} H={args.heads} d=e=m={args.head_dim} float32, {args.threads} threads; "
          f"CPU level found: {ff.isa_level()} (FLEXFORMER_CPU_LEVEL caps it per run)")
    rows = []
    for kind in args.kinds:
        for mode in args.modes:
            for pas in ("fwd", "bwd"):
                for level in args.levels:
                    res = profile_one(kind, mode == "causal", pas, level, args)
                    row = {"kind": kind, "mode": mode, "pass": pas, "level": level, **res}
                    if "error" in res:
                        print(f"{kind} {mode} {pas} level {level}: {res['error']}", flush=True)
                        rows.append(row)
                        continue
                    ms, shares = res["ms"], res["shares"]
                    rate = ""
                    products = shares.get(PHASES[0][0], 0.0)
                    if mode == "bidir" and kind in ("flex_n", "flex_s") and products > 0:
                        # the products' own rate where they run, to set beside tile_rate.py's
                        flops = product_flops(kind, pas, args.seq_len, args.heads, args.head_dim)
                        row["products_gflops"] = flops / (ms * 1e-3 * products / 100) * 1e-9
                        rate = f" (products at {row['products_gflops']:.0f} GFLOP/s on {args.threads} threads)"
                    rows.append(row)
                    print(f"{kind} {mode} {pas} level {level}: {ms:.1f} ms{rate}; " + ", ".join(
                        f"{name.split(' (')[0]} {v:.0f}% ({v * ms / 100:.1f} ms)"
                        for name, v in sorted(shares.items(), key=lambda x: -x[1]) if v >= 1), flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "phases.json")
    with open(path, "w") as fh:
        json.dump({"config": vars(args), "phases": [name for name, _ in PHASES] + ["other"], "rows": rows}, fh,
                  indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
