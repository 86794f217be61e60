"""Two builds of flexformer, A and B, timed against each other in one process, call by call.

On a host whose speed drifts with its neighbours' load (stretches of seconds 30% slower),
timing each build in its own process mixes the host's phases into the ratio. Here both
builds are imported under two names (each checkout's ``flexformer/`` folder, with its
compiled extension, linked into a temporary folder as ``build_a`` and ``build_b``), and
the bidirectional forward + backward of a training step (the forward keeps its key state
and projections) is called alternately, A B, B A, A B, ...: a slow stretch falls on both
calls of a pair. The ratio reported is the median over pairs of B's time / A's, with its
interquartile range; an A/A run (the same checkout twice) reads 1.00 within about 1%. Two
different builds can read up to about 1.5% apart when swapped (on a Zen 4, 2026-12-06: both
orders of one pair of builds read "B faster"), so run it in both orders (--both-orders: a
second process with the checkouts swapped), and take a difference below about 2% as noise.

    python benchmarks/ab_builds.py CHECKOUT_A CHECKOUT_B [--kinds flex_n flex_s] [--pairs 100]
                                   [--seq-len 4096] [--threads 2] [--both-orders]
    python benchmarks/ab_builds.py CHECKOUT_A CHECKOUT_B --decode --threads 1 --pairs 200

With --decode the calls are one-token recurrent steps instead (a call: 100 steps of one
layer continuing a 256-token state, as benchmarks/decode.py times them), reported in
microseconds per token.

Each checkout must have its extension built in place (``python setup.py build_ext
--inplace``). B = 8 heads, d = e = m = 64, float32, seed 0.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HEADS, DIM = 8, 64


def products(build) -> str:
    """The build's product copy, and how it takes rows off a cache line where it says (older
    builds do not)."""
    paths = build.dense_paths()
    rows = paths.get("off_line_rows")
    return paths["products"] + (f" ({rows.replace('_', ' ')})" if rows else "")


def load(checkout: str, name: str, folder: str):
    """The package in ``checkout``/flexformer imported as ``name``."""
    package = os.path.join(os.path.abspath(checkout), "flexformer")
    if not os.path.isfile(os.path.join(package, "__init__.py")):
        raise SystemExit(f"{checkout}: no flexformer/ package there")
    os.symlink(package, os.path.join(folder, name))
    return importlib.import_module(name)


def layer(ff, kind: str):
    """The kind's registry entry and its initial parameters for one layer (seed 1), the
    same for both builds and both modes."""
    spec = ff.get_attention(kind)
    return spec, spec.init(HEADS, DIM, num_features=DIM, rng=1, dtype=np.float32)


def training_step(ff, kind: str, inputs):
    """The forward + backward of one bidirectional layer call, as the layers run it (the
    kind's registry entry: its initial parameters, forward and backward)."""
    q, k, v, dout = inputs
    spec, params = layer(ff, kind)

    def step():
        _, key_state, kept = spec.forward(q, k, v, params, return_key_state=True,
                                          return_projections=spec.projections)
        spec.backward(dout, q, k, v, params, key_state=key_state, projections=kept)

    return step


DECODE_CONTEXT, DECODE_TOKENS = 256, 100  # --decode: the prefilled context, steps per timed call


def decode_steps(ff, kind: str, tokens, prefix):
    """DECODE_TOKENS one-token recurrent steps of one layer (decode.py's layer: the kind's
    initial parameters), continuing a state prefilled with DECODE_CONTEXT tokens; each call
    of the returned function steps through the same tokens again from where it is."""
    params = layer(ff, kind)[1]
    recurrent = importlib.import_module(ff.__name__ + ".recurrent").RecurrentAttention(kind, params)
    state = recurrent.prefill(*prefix)[1]

    def steps():
        for q, k, v in tokens:
            recurrent.step(state, q, k, v)

    return steps


def compare(step_a, step_b, pairs: int) -> dict:
    for _ in range(3):  # warm-up: buffers, thread pool, the product tile's calibration
        step_a()
        step_b()
    times = {step_a: [], step_b: []}
    for i in range(pairs):
        for step in ((step_a, step_b) if i % 2 == 0 else (step_b, step_a)):
            start = time.perf_counter()
            step()
            times[step].append(1e3 * (time.perf_counter() - start))
    ta, tb = times[step_a], times[step_b]
    ratios = sorted(b / a for a, b in zip(ta, tb))
    return {"a_ms": statistics.median(ta), "b_ms": statistics.median(tb), "ratio": statistics.median(ratios),
            "q1": ratios[len(ratios) // 4], "q3": ratios[(3 * len(ratios)) // 4]}


def option_args(args: argparse.Namespace, skip) -> list:
    """The command-line options that give ``args`` again (every option but those in skip),
    so that a new option reaches the second order's process without being listed here."""
    out = []
    for dest, value in vars(args).items():
        if dest in skip or value is None or value is False:
            continue
        out.append("--" + dest.replace("_", "-"))
        if value is not True:
            out += [str(x) for x in value] if isinstance(value, list) else [str(value)]
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout_a")
    ap.add_argument("checkout_b")
    ap.add_argument("--kinds", nargs="+", default=["flex_n", "flex_s"], choices=["flex_n", "flex_s"])
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", action="store_true",
                    help=f"time one-token recurrent steps instead (B = 1, a {DECODE_CONTEXT}-token context, "
                         f"{DECODE_TOKENS} steps per call; --seq-len unused): microseconds per token")
    ap.add_argument("--both-orders", action="store_true",
                    help="then run again in a fresh process with the checkouts swapped (B as A)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.pairs < 4:
        ap.error("--pairs must be at least 4")
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, folder)
        build_a = load(args.checkout_a, "build_a", folder)
        build_b = load(args.checkout_b, "build_b", folder)
        for build in (build_a, build_b):
            build.set_num_threads(args.threads)
        rng = np.random.default_rng(0)
        if args.decode:
            def rows(n):
                return (0.5 * rng.standard_normal((1, HEADS, n, DIM))).astype(np.float32)
            prefix = [rows(DECODE_CONTEXT) for _ in range(3)]
            tokens = [tuple(rows(1) for _ in range(3)) for _ in range(DECODE_TOKENS)]
            what, unit, scale = f"one-token steps after {DECODE_CONTEXT}", "us per token", 1e3 / DECODE_TOKENS
            make = {kind: [decode_steps(b, kind, tokens, prefix) for b in (build_a, build_b)] for kind in args.kinds}
        else:
            inputs = [(0.3 * rng.standard_normal((1, HEADS, args.seq_len, DIM))).astype(np.float32) for _ in range(4)]
            what, unit, scale = f"N = {args.seq_len}", "ms", 1.0
            make = {kind: [training_step(b, kind, inputs) for b in (build_a, build_b)] for kind in args.kinds}
        print(f"A = {args.checkout_a}, B = {args.checkout_b}; {what}, {args.threads} thread{'s' if args.threads != 1 else ''}, "
              f"{args.pairs} pairs, kernel ISA level {build_a.isa_level()}; products: A "
              f"{products(build_a)}, B {products(build_b)}")
        for kind in args.kinds:
            r = compare(*make[kind], args.pairs)
            print(f"{kind}: A {r['a_ms'] * scale:.2f} {unit}, B {r['b_ms'] * scale:.2f} {unit} (medians); B / A "
                  f"per pair: median {r['ratio']:.3f}, interquartile {r['q1']:.3f}-{r['q3']:.3f}")
    if args.both_orders:
        # the second order in its own process: which build loads first is part of the order
        swapped = [args.checkout_b, args.checkout_a, *option_args(args, skip=("checkout_a", "checkout_b", "both_orders"))]
        sys.stdout.flush()
        return subprocess.run([sys.executable, os.path.abspath(__file__), *swapped]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
