"""The kernels beside NumPy's BLAS in one script: what each library's idle threads cost the other.

    python benchmarks/neighbours.py            # about a minute
    python benchmarks/neighbours.py --quick    # a seconds-long smoke run (CI)

A script that projects with NumPy and then attends with flexformer runs two thread pools
on the same cores. After a call, each pool's threads poll for more work before they sleep:
the kernels' OpenMP threads for ``GOMP_SPINCOUNT`` polls (flexformer sets 50,000 while
loading libgomp; libgomp's own default is 300,000), NumPy's OpenBLAS threads for
2^``OPENBLAS_THREAD_TIMEOUT`` cycles (OpenBLAS's default exponent is 28). Each setting
below runs in its own process, the settings taking turns over --rounds rounds:

* ``cpu ms after a call``: CPU time the process burns in a 0.5 s pause after an attention
  call, or after a NumPy product (median of 3): the polling, which a neighbour on the core
  pays for;
* ``layer ms``: one layer as a script writes it, q, k, v = x @ W (float32, OpenBLAS's
  threads) and then Flexformer_n attention (B = 1, 2 threads), median of 20 after 3.

Settings: ``libgomp default`` (GOMP_SPINCOUNT=300000, the kernels before flexformer
bounded it), ``flexformer`` (nothing set), ``+ OPENBLAS_THREAD_TIMEOUT=20`` (what a script
can set before importing NumPy). Writes neighbours.json into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SETTINGS = [
    ("libgomp default", {"GOMP_SPINCOUNT": "300000"}),
    ("flexformer", {}),
    ("+ OPENBLAS_THREAD_TIMEOUT=20", {"OPENBLAS_THREAD_TIMEOUT": "20"}),
]

WORKER = r"""
import json, sys
import numpy as np
import flexformer as ff
from flexformer._timing import idle_cpu_ms, median_seconds
H, N, d, repeats = map(int, sys.argv[1:5])
ff.set_num_threads(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((N, 512)).astype(np.float32)
W = rng.standard_normal((512, 3 * H * d)).astype(np.float32) * np.float32(0.05)
omega1, omega2, tau = ff.init.flex_n_params(H, 64, d, rng=1, dtype=np.float32)

def layer():
    qkv = np.ascontiguousarray((x @ W).reshape(N, 3, H, d).transpose(1, 2, 0, 3)[:, None])  # (3, 1, H, N, d)
    return ff.flex_n_attention(qkv[0], qkv[1], qkv[2], omega1, omega2, tau)

q, k, v = (rng.standard_normal((1, H, 256, d)).astype(np.float32) * np.float32(0.3) for _ in range(3))
product = rng.standard_normal((256, 256))
record = {"cpu_ms_after_attention": idle_cpu_ms(lambda: ff.flex_n_attention(q, k, v, omega1, omega2, tau), 0.5, 3),
          "cpu_ms_after_numpy_product": idle_cpu_ms(lambda: product @ product, 0.5, 3)}
record["layer_ms"] = median_seconds(layer, repeats) * 1e3
print(json.dumps(record))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20, help="timed layers per process")
    parser.add_argument("--quick", action="store_true", help="one small size, one round, 3 layers")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latest"),
                        help="folder for neighbours.json")
    args = parser.parse_args()
    sizes = [(2, 512)] if args.quick else [(2, 512), (8, 4096)]
    rounds, repeats = (1, 3) if args.quick else (args.rounds, args.repeats)
    base = {name: value for name, value in os.environ.items()
            if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS")}
    records = {(label, size): [] for label, _ in SETTINGS for size in sizes}
    for _ in range(rounds):
        for H, N in sizes:
            for label, env in SETTINGS:
                out = subprocess.run([sys.executable, "-c", WORKER, str(H), str(N), "64", str(repeats)],
                                     capture_output=True, text=True, env=dict(base, **env), check=True)
                records[(label, (H, N))].append(json.loads(out.stdout))
    rows = []
    print(f"{'setting':30s} {'H':>2s} {'N':>5s}  {'layer ms':>9s}  {'/ flexformer':>12s}  "
          f"{'cpu ms after attention':>22s}  {'after a NumPy product':>21s}")
    for H, N in sizes:
        ours = statistics.median(r["layer_ms"] for r in records[("flexformer", (H, N))])
        for label, env in SETTINGS:
            got = records[(label, (H, N))]
            row = {"setting": label, "env": env, "H": H, "N": N,
                   **{key: statistics.median(r[key] for r in got) for key in got[0]},
                   "layer_ms_rounds": [r["layer_ms"] for r in got]}
            rows.append(row)
            print(f"{label:30s} {H:2d} {N:5d}  {row['layer_ms']:9.2f}  {row['layer_ms'] / ours:11.2f}x  "
                  f"{row['cpu_ms_after_attention']:22.1f}  {row['cpu_ms_after_numpy_product']:21.1f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "neighbours.json")
    with open(path, "w") as f:
        json.dump({"rounds": rounds, "repeats": repeats, "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
