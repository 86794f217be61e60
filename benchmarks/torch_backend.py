"""The PyTorch bridge's backends against each other and against exact attention, in one run.

    python benchmarks/torch_backend.py                      # CPU, N = 4096 (about 2 minutes)
    python benchmarks/torch_backend.py --device cuda        # the same on a GPU (skips without one)
    python benchmarks/torch_backend.py --quick              # seconds (CI smoke run)

Times ``flexformer.torch.attention("flex_n", ..., causal=True)`` forward + backward
(median of --repeats after three warm-up calls), B = 1, H = 8, d = e = m = 64, each
configuration in a fresh process with --threads threads, --rounds rounds interleaved:

* ``c``: the C kernels (CPU float32 only);
* ``torch``: the PyTorch backend in float32: chunks processed together (a prefix over the
  chunks' own sums carries the state; ``_causal_chunked``), its backward written out;
* ``torch_compile``: the same PyTorch backend under ``torch.compile(fullgraph=True)``
  (compiled during the warm-up calls);
* ``torch_loop``: the plain reference form, one chunk after another in a Python loop
  (``_causal_loop``), differentiated by autograd;
* ``torch_bf16``: the PyTorch backend on bfloat16 inputs (features, sums and state in float32);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (exact causal softmax), float32;
* ``baseline`` (with ``--baseline DIR``): the PyTorch backend of the flexformer package found
  in DIR (another version's source folder, built in place), float32: an A/B across versions.

Prints each configuration's time and its ratio to ``torch`` per round, and writes JSON into
--out. Every row is checked against the float64 C kernels (relative error on the output).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("c", "torch", "torch_compile", "torch_loop", "torch_bf16", "sdpa")

WORKER = r"""
import json, sys
import numpy as np, torch
import flexformer as ff
from flexformer.torch import attention
from flexformer.torch import functional as F
impl, N, H, d, repeats, threads, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
torch.set_num_threads(threads)
ff.set_num_threads(threads)
if impl == "torch_loop":
    F._causal_chunked = F._causal_loop
dtype = torch.bfloat16 if impl == "torch_bf16" else torch.float32
gen = np.random.default_rng(0)
q, k, v = (0.3 * gen.standard_normal((1, H, N, d)) for _ in range(3))
init = ff.get_attention("flex_n").init(H, d, rng=0)
want = ff.flex_n_attention(q, k, v, init["omega1"], init["omega2"], init["tau"], causal=True)
def leaf(x):
    return torch.tensor(x, dtype=dtype, device=device, requires_grad=True)
tq, tk, tv = leaf(q), leaf(k), leaf(v)
params = {n: leaf(p) for n, p in init.items()}
dout = torch.ones(1, H, N, d, dtype=dtype, device=device)
backend = "c" if impl == "c" else "torch"  # baseline: the torch backend of the other version
def attend(q, k, v, params):
    return attention("flex_n", q, k, v, params, causal=True, backend=backend)
if impl == "torch_compile":
    attend = torch.compile(attend, fullgraph=True)
def run():
    if impl == "sdpa":
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    else:
        out = attend(tq, tk, tv, params)
    out.backward(dout)
    if device == "cuda":
        torch.cuda.synchronize()
    return out
out = run()
err = None
if impl != "sdpa":
    got = out.detach().double().cpu().numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
from flexformer._timing import median_seconds
print(json.dumps({"impl": impl, "seconds": median_seconds(run, repeats, warmup=2), "rel_err": err}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=4096, help="N (default 4096)")
    p.add_argument("--heads", type=int, default=8, help="H (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="d = e = m (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per configuration (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--threads", type=int, default=2, help="threads for every library (default 2)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, help="configurations to time")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="a folder holding another version's flexformer package (built): its torch backend "
                        "is timed as 'baseline'")
    p.add_argument("--quick", action="store_true", help="N = 256, one round, two repeats (smoke run)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "latest"), help="folder for the JSON")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: pip install '.[bench]'", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: --device cuda, but torch sees no GPU here")
        return 0
    impls = [i for i in args.impls if not (i == "c" and args.device != "cpu")]
    if args.baseline:
        impls.append("baseline")
    if args.quick:
        args.seq_len, args.rounds, args.repeats = 256, 1, 2
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS="1")
    rounds = []
    for r in range(args.rounds):
        row = {}
        for impl in impls:
            run_env = dict(env, PYTHONPATH=os.path.abspath(args.baseline)) if impl == "baseline" else env
            done = subprocess.run([sys.executable, "-c", WORKER, impl, str(args.seq_len), str(args.heads),
                                   str(args.head_dim), str(args.repeats), str(args.threads), args.device],
                                  env=run_env, capture_output=True, text=True, check=True,
                                  cwd=os.path.abspath(args.baseline) if impl == "baseline" else None)
            row[impl] = json.loads(done.stdout.strip().splitlines()[-1])
        rounds.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{i} {row[i]['seconds'] * 1e3:.1f} ms" for i in impls), flush=True)
    print(f"\ncausal flex_n forward + backward, B=1 H={args.heads} N={args.seq_len} d=e=m={args.head_dim}, "
          f"{args.device}, {args.threads} threads; median over {args.rounds} rounds")
    print(f"{'configuration':12s} {'ms':>9s} {'torch / it':>12s} {'per round':>18s} {'rel. error':>11s}")
    summary = {}
    for impl in impls:
        ms = statistics.median(row[impl]["seconds"] for row in rounds) * 1e3
        ratios = [row["torch"]["seconds"] / row[impl]["seconds"] for row in rounds] if "torch" in impls else []
        ratio = statistics.median(ratios) if ratios else float("nan")
        err = rounds[0][impl]["rel_err"]
        summary[impl] = {"ms": ms, "torch_over_this": ratio, "rounds": ratios, "rel_err": err}
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
        print(f"{impl:12s} {ms:9.1f} {ratio:11.2f}x {spread:>18s} {'' if err is None else f'{err:.1e}':>11s}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "torch_backend.json")
    with open(path, "w") as fh:
        json.dump({"args": vars(args), "rounds": rounds, "summary": summary,
                   "torch": torch.__version__}, fh, indent=2)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
