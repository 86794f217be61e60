"""Command line: ``python -m flexformer [demo]``.

``demo`` (the default) times Flexformer_n attention forward and forward+backward at a
chosen size, bidirectional and causal, and shows how close the freshly initialised
kernel is to exact softmax attention on the same inputs.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import numpy as np

from . import __version__, flex_n_attention, flex_n_attention_backward, get_num_threads, init
from . import openmp_enabled, reference, set_num_threads


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def demo(args: argparse.Namespace) -> int:
    if args.threads is not None:
        set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    B, H, N, d = 1, args.heads, args.seq_len, args.head_dim
    dtype = np.float32
    print(f"flexformer {__version__}: OpenMP {'on' if openmp_enabled() else 'off'}, "
          f"{get_num_threads()} thread(s)")

    # accuracy of the initial kernel against exact softmax, on a small problem
    n_small = min(N, 256)
    q = rng.standard_normal((1, H, n_small, d)) * 0.3
    k = rng.standard_normal((1, H, n_small, d)) * 0.3
    v = rng.standard_normal((1, H, n_small, d))
    exact = reference.softmax_attention(q, k, v, causal=True)
    print(f"\ninitial Flexformer_n vs exact softmax attention (causal, N={n_small}, d={d}):")
    for m in (16, 64, 256):
        omega1, omega2, tau = init.flex_n_params(H, m, d, rng=rng, orthogonal=True)
        approx = flex_n_attention(q, k, v, omega1, omega2, tau, causal=True)
        err = np.linalg.norm(approx - exact) / np.linalg.norm(exact)
        print(f"  m = {m:4d} features: relative error {err:.4f}")

    # timing at the requested size
    m = args.features
    q = rng.standard_normal((B, H, N, d)).astype(dtype) * 0.3
    k = rng.standard_normal((B, H, N, d)).astype(dtype) * 0.3
    v = rng.standard_normal((B, H, N, d)).astype(dtype)
    dout = rng.standard_normal((B, H, N, d)).astype(dtype)
    omega1, omega2, tau = init.flex_n_params(H, m, d, rng=rng, dtype=dtype)
    print(f"\nFlexformer_n timing, float32, B={B} H={H} N={N} d=e={d} m={m} "
          f"(median of {args.repeats}):")
    for causal in (False, True):
        fwd = _median_seconds(lambda: flex_n_attention(q, k, v, omega1, omega2, tau, causal=causal),
                              args.repeats)
        both = _median_seconds(lambda: (flex_n_attention(q, k, v, omega1, omega2, tau, causal=causal),
                                        flex_n_attention_backward(dout, q, k, v, omega1, omega2, tau,
                                                                  causal=causal)), args.repeats)
        label = "causal" if causal else "bidirectional"
        print(f"  {label:13s}  forward {fwd * 1e3:8.1f} ms   forward+backward {both * 1e3:8.1f} ms")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flexformer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("demo", help="time Flexformer_n attention and compare it with softmax")
    for target in (parser, p):
        target.add_argument("--seq-len", type=int, default=4096, help="sequence length N (default 4096)")
        target.add_argument("--heads", type=int, default=8, help="heads H (default 8)")
        target.add_argument("--head-dim", type=int, default=64, help="head size d = e (default 64)")
        target.add_argument("--features", type=int, default=64, help="frequencies m (default 64)")
        target.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
        target.add_argument("--threads", type=int, default=None, help="kernel threads (default: OpenMP's)")
        target.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("seq_len", "heads", "head_dim", "features", "repeats"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
