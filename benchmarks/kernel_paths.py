"""Optimised kernel paths against their plain reference paths, in one run.

Builds the extension once per variant into a temporary folder (compile-time switches in
csrc/: FF_PLAIN_DENSE = plain triple-loop products, FF_PLAIN_TRIG = libm sin/cos per
element, FF_PLAIN_EXP = libm expf per element, FF_NO_CLONES = no x86-64-v3/v4 copies) and
times Flexformer_n forward and forward+backward, and Performer's and Hedgehog's forward +
backward (the kinds whose feature maps take an exponential), in a fresh subprocess per
variant, with the same inputs and threads.

    python benchmarks/kernel_paths.py [--seq-len 4096] [--heads 8] [--threads 2]

Prints medians and each variant's time as a ratio of the default build's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "default": "",
    "plain dense": "-DFF_PLAIN_DENSE",
    "plain trig": "-DFF_PLAIN_TRIG",
    "plain exp": "-DFF_PLAIN_EXP",
    "no cpu clones": "-DFF_NO_CLONES",
    "all plain": "-DFF_PLAIN_DENSE -DFF_PLAIN_TRIG -DFF_PLAIN_EXP -DFF_NO_CLONES",
}

TIMER = r"""
import json, sys, time
import numpy as np
import flexformer as ff
N, H, d, m, repeats, threads = (int(a) for a in sys.argv[1:7])
ff.set_num_threads(threads)
rng = np.random.default_rng(0)
q, k, v, dout = (rng.standard_normal((1, H, N, d)).astype(np.float32) * 0.3 for _ in range(4))
o1, o2, tau = ff.init.flex_n_params(H, m, d, rng=1, dtype=np.float32)
def median(fn):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return float(np.median(times))
res = {}
for causal in (False, True):
    fwd = lambda: ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
    both = lambda: (fwd(), ff.flex_n_attention_backward(dout, q, k, v, o1, o2, tau, causal=causal))
    key = "causal" if causal else "bidir"
    res[key + " fwd"] = median(fwd)
    res[key + " fwd+bwd"] = median(both)
for kind in ("performer", "hedgehog"):
    spec = ff.get_attention(kind)
    params = spec.init(H, d, num_features=m, rng=1, dtype=np.float32)
    res[kind + " fwd+bwd"] = median(lambda: (spec.forward(q, k, v, params), spec.backward(dout, q, k, v, params)))
print(json.dumps(res))
"""


def build(flags: str, dest: str) -> None:
    env = dict(os.environ, CFLAGS=flags)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", dest,
                    "--build-temp", os.path.join(dest, "tmp"), "--force"],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the Python package beside the fresh extension, subpackages included (copying only the
    # top level's modules left `import flexformer` failing on its subpackages)
    shutil.copytree(os.path.join(ROOT, "flexformer"), os.path.join(dest, "flexformer"),
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="flexformer-paths-") as tmp:
        for name, flags in VARIANTS.items():
            dest = os.path.join(tmp, name.replace(" ", "_"))
            build(flags, dest)
            out = subprocess.run(
                [sys.executable, "-c", TIMER, str(args.seq_len), str(args.heads), str(args.head_dim),
                 str(args.features), str(args.repeats), str(args.threads)],
                env=dict(os.environ, PYTHONPATH=dest), cwd=tmp, check=True, capture_output=True, text=True)
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    cols = list(results["default"])
    print(f"flex_n (and performer, hedgehog: bidirectional) float32, B=1 H={args.heads} N={args.seq_len} "
          f"d=e={args.head_dim} m={args.features}, "
          f"{args.threads} threads, median of {args.repeats} (ms; ratio to default)")
    print(f"{'variant':15s}" + "".join(f"{c:>24s}" for c in cols))
    for name, res in results.items():
        cells = "".join(f"{res[c] * 1e3:13.1f} ({res[c] / results['default'][c]:5.2f}x)  " for c in cols)
        print(f"{name:15s}{cells}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": vars(args), "seconds": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
