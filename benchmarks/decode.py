"""Recurrent decoding: time per generated token and state memory against context length.

    python benchmarks/decode.py            # contexts 256 .. 65536 (about a minute)
    python benchmarks/decode.py --quick    # a seconds-long smoke run (CI)

One attention layer, B=1, H=8, d=e=64, m=64, float32, 2 threads (--threads). The linear
kinds but elu step through the C causal kernel continuing the packed state (one call per
token: feature map, state update at the running log-scale, read-out, guard); the target is
at most 20 us per token per layer, flat from context 256 to 65,536. For each context
length t the state after t tokens is built (a parallel causal prefill for the linear
kinds; for softmax the key-value cache is filled directly, since a quadratic prefill
at 65536 would take minutes and is not what is being measured), then --steps single
tokens are stepped, in blocks of 25 with the contexts taking turns (a slow spell of a shared
machine, which lasts from tens of milliseconds to seconds, then falls on every context
alike), and the median time per token is reported, with the state's size.
The linear kinds keep a fixed (2m x e) state, so their cost per token is flat; softmax
attends over its whole cache, so its cost and memory grow with t. Writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import flexformer as ff
from flexformer.recurrent import KVCacheState, RecurrentAttention

B, H, D, M = 1, 8, 64, 64


def build_state(kind: str, rec: RecurrentAttention, context: int, rng: np.random.Generator):
    q, k, v = (rng.standard_normal((B, H, context, D), dtype=np.float32) * np.float32(0.5) for _ in range(3))
    if kind == "softmax":
        state = KVCacheState.empty(B, H, D, D, np.float32, capacity=context + 1024)
        state.append(k, v, np.ones((B, context), bool))
        return state
    return rec.prefill(q, k, v)[1]


BLOCK = 25  # steps timed per context in one turn, the contexts taking turns


def time_steps(rec: RecurrentAttention, state, steps: int, rng: np.random.Generator) -> list:
    """Seconds of each of `steps` single-token steps (after three untimed ones)."""
    tokens = [tuple(rng.standard_normal((B, H, 1, D), dtype=np.float32) * np.float32(0.5) for _ in range(3))
              for _ in range(steps + 3)]
    for q, k, v in tokens[:3]:  # warm-up
        rec.step(state, q, k, v)
    times = []
    for q, k, v in tokens[3:]:
        t0 = time.perf_counter()
        rec.step(state, q, k, v)
        times.append(time.perf_counter() - t0)
    return times


def time_contexts(rec: RecurrentAttention, states: dict, steps: int, rng: np.random.Generator) -> dict:
    """Median seconds per step for every context's state, the contexts taking turns in
    blocks of BLOCK steps, each turn starting one context later, so that a slow spell of
    the machine falls on all of them alike rather than on whichever context happened to be
    timed then. (A two-thread step on a 2-vCPU host shifts between about 8, 10, 12 and
    14-20 us for flex_s, in spells of tens of milliseconds to seconds, on one build and
    state: with ten long blocks per context, such spells had made one context 1.2-1.3x
    slower than another.)"""
    times = {t: [] for t in states}
    order = list(states)
    rounds = max(1, -(-steps // BLOCK))
    for r in range(rounds):
        block = steps // rounds + (r < steps % rounds)
        for t in order[r % len(order):] + order[: r % len(order)]:
            times[t] += time_steps(rec, states[t], block, rng)
    return {t: float(np.median(x)) for t, x in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="contexts 256 and 1024 only, few steps")
    p.add_argument("--steps", type=int, default=50, help="timed tokens per context (default 50)")
    p.add_argument("--kinds", default="flex_n,flex_s,performer,hedgehog,softmax")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latest"))
    args = p.parse_args(argv)
    ff.set_num_threads(args.threads)
    contexts = [256, 1024] if args.quick else [256, 1024, 4096, 16384, 65536]
    steps = 5 if args.quick else args.steps
    rng = np.random.default_rng(0)
    rows = []
    print(f"time per generated token (ms) and state memory per layer, B={B} H={H} d=e={D} m={M} float32, "
          f"{ff.get_num_threads()} threads, kernel ISA level {ff.isa_level()}, dense copies {ff.dense_paths()}")
    print(f"{'kind':10s} {'context':>8s} {'ms/token':>9s} {'state':>10s}")
    for kind in args.kinds.split(","):
        params = ff.get_attention(kind).init(H, D, num_features=M, rng=0, dtype=np.float32)
        rec = RecurrentAttention(kind, params)
        states = {t: build_state(kind, rec, t, rng) for t in contexts}
        seconds = time_contexts(rec, states, steps, rng)
        for t in contexts:
            sec, nbytes = seconds[t], states[t].nbytes
            rows.append({"kind": kind, "context": t, "ms_per_token": sec * 1e3, "state_bytes": int(nbytes)})
            print(f"{kind:10s} {t:8d} {sec * 1e3:9.4f} {nbytes / 2**20:8.2f} MiB", flush=True)
        del states
    for kind in args.kinds.split(","):
        mine = [r for r in rows if r["kind"] == kind]
        print(f"{kind}: time({mine[-1]['context']}) / time({mine[0]['context']}) = "
              f"{mine[-1]['ms_per_token'] / mine[0]['ms_per_token']:.2f}")
    os.makedirs(args.out, exist_ok=True)
    name = "decode-quick.json" if args.quick else "decode.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump({"machine": os.uname().machine, "isa_level": ff.isa_level(), "dense_paths": ff.dense_paths(), "threads": ff.get_num_threads(),
                   "rows": rows}, fh, indent=1)
    print(f"wrote {os.path.join(args.out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
