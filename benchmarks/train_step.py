"""The reference training loop against the PyTorch loop, and where a NumPy step spends its time.

    python benchmarks/train_step.py profile            # per-phase time of the NumPy trainer's steps
    python benchmarks/train_step.py compare            # tokens/s: NumPy trainer vs torch trainer (c, torch)
    python benchmarks/train_step.py compare --rounds 3 --steps 100 --out results/

``compare`` runs each trainer's own command line on the same configuration (the README's
main job unless told otherwise: ListOps, flex_n, dim 64, 2 blocks, batch 16, sequence 128)
in a fresh subprocess, interleaved over ``--rounds``, and reads ``tokens_per_s`` from each
run's metrics.json (the training loop only: no imports, data set-up or evaluation). Both
trainers start from the same parameters and see the same batches. The NumPy trainer runs as
its command does (NumPy's BLAS on one thread, the kernels on ``--threads``); the torch
trainer with ``--backend c`` calls the same C kernels, with ``--backend torch`` it is pure
PyTorch. Ratios are of medians, pair by pair in the same run.

``profile`` times the phases of ``--steps`` NumPy training steps in this process by wrapping
the layers' methods (attention kernels, the four attention projections, the MLP's linear
layers, GELU, LayerNorm, embedding and positions, the loss, clipping and AdamW, data); what
is left (reshapes, the model's glue, Python) is "other". Wrapping adds a few microseconds
per call; ``ms_per_step`` is measured without it.

torch is needed for ``compare`` only.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attention import _cpu_name as cpu_model  # noqa: E402  (the sweep's machine line)

MAIN_JOB = ["--task", "listops", "--attention", "flex_n"]
TARGETS = [
    "numpy trainer tokens/s >= 0.9x torch trainer --backend c (README main job)",
    "numpy trainer tokens/s >= 1.2x torch trainer --backend torch (README main job)",
]


# --------------------------------------------------------------------------- compare

def _trainer_cmd(which: str, steps: int, threads: int, out: str, extra) -> list:
    common = MAIN_JOB + ["--steps", str(steps), "--eval-batches", "1", "--out", out] + list(extra)
    if which == "numpy":
        return [sys.executable, "-m", "flexformer", "train", "--threads", str(threads), "--quiet"] + common
    backend = which.split("-", 1)[1]
    return [sys.executable, "-m", "flexformer.torch.train", "--backend", backend, "--threads", str(threads),
            "--quiet"] + common


def compare(args) -> dict:
    trainers = ["numpy", "torch-c", "torch-torch"]
    speeds = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for which in trainers:
                out = os.path.join(tmp, f"{which}-{r}")
                cmd = _trainer_cmd(which, args.steps, args.threads, out, args.train_args)
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                env.pop("OPENBLAS_NUM_THREADS", None)  # each trainer's own choice, as a user runs it
                env.pop("FLEXFORMER_NO_REEXEC", None)
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    raise SystemExit(f"{which} failed:\n{done.stderr[-2000:]}")
                with open(os.path.join(out, "metrics.json")) as fh:
                    tok = json.load(fh)["tokens_per_s"]
                speeds[which].append(tok)
                print(f"round {r + 1}/{args.rounds} {which:12s} {tok:9.0f} tokens/s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in speeds.items()}
    ratios = {
        "numpy / torch-c": med["numpy"] / med["torch-c"],
        "numpy / torch-torch": med["numpy"] / med["torch-torch"],
        # pair by pair: round r of one against round r of the other
        "numpy / torch-c per round": [a / b for a, b in zip(speeds["numpy"], speeds["torch-c"])],
        "numpy / torch-torch per round": [a / b for a, b in zip(speeds["numpy"], speeds["torch-torch"])],
    }
    return {"cpu": cpu_model(), "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
            "config": MAIN_JOB + list(args.train_args), "tokens_per_s": dict(speeds),
            "median_tokens_per_s": med, "ratios": ratios,
            "targets": {TARGETS[0]: ratios["numpy / torch-c"] >= 0.9,
                        TARGETS[1]: ratios["numpy / torch-torch"] >= 1.2}}


# --------------------------------------------------------------------------- profile

class _Clock:
    """Accumulates wall time per phase; nested phases are charged to the innermost only."""

    def __init__(self):
        self.total = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.stack = []

    def wrap(self, owner, name: str, phase_of):
        original = getattr(owner, name)
        clock = self

        def timed(obj, *a, **k):
            phase = phase_of(obj)
            t0 = time.perf_counter()
            clock.stack.append(0.0)
            try:
                return original(obj, *a, **k)
            finally:
                spent = time.perf_counter() - t0
                inner = clock.stack.pop()
                clock.total[phase] += spent - inner
                clock.calls[phase] += 1
                if clock.stack:
                    clock.stack[-1] += spent

        setattr(owner, name, timed)
        return original


def profile(args) -> dict:
    # the command line's BLAS choice, made before NumPy loads
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    import numpy as np

    import flexformer
    from flexformer.nn import attention as nn_attention
    from flexformer.nn import core
    from flexformer.registry import AttentionKind
    from flexformer.training import loop, optim

    cfg = loop.TrainConfig(task="listops", attention="flex_n", steps=args.steps, threads=args.threads,
                           diagnostics_every=0)
    flexformer.set_num_threads(args.threads)
    data = loop.build_data(cfg)
    model = loop.build_model(cfg, data)
    role = {}
    for block in model.backbone.blocks:
        for lin in (block.attn.q, block.attn.k, block.attn.v, block.attn.o):
            role[id(lin)] = "attention projections"
        for lin in (block.mlp.fc1, block.mlp.fc2):
            role[id(lin)] = "MLP linear"
    named = model.named_parameters()
    opt = optim.AdamW(named, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def run(steps, start):
        for step in range(start, start + steps):
            batch = loop.batch_for(cfg, data, step)
            model.zero_grad()
            loss, dlogits, _, _ = loop.loss_and_grad(cfg, model, batch)
            model.backward(dlogits)
            optim.clip_global_norm(named, cfg.clip)
            opt.step(optim.lr_at(step, base_lr=cfg.lr, warmup=cfg.warmup, total=cfg.steps))

    run(3, 0)  # warm up
    t0 = time.perf_counter()
    run(args.steps, 3)
    plain = time.perf_counter() - t0

    clock = _Clock()
    fixed = lambda phase: (lambda obj: phase)  # noqa: E731
    clock.wrap(AttentionKind, "forward", fixed("attention kernels"))
    clock.wrap(AttentionKind, "backward", fixed("attention kernels"))
    for meth in ("forward", "backward"):
        clock.wrap(core.Linear, meth, lambda obj: role.get(id(obj), "head linear"))
        clock.wrap(core.LayerNorm, meth, fixed("LayerNorm"))
        clock.wrap(core.GELU, meth, fixed("GELU"))
        clock.wrap(core.Embedding, meth, fixed("embedding and positions"))
        clock.wrap(core.PositionalEncoding, meth, fixed("embedding and positions"))
        clock.wrap(nn_attention.MultiHeadAttention, meth, fixed("attention glue (split, merge)"))
    clock.wrap(optim.AdamW, "step", fixed("optimiser (AdamW, clip, zero_grad)"))
    clock.wrap(core.Module, "zero_grad", fixed("optimiser (AdamW, clip, zero_grad)"))
    optim_clip = optim.clip_global_norm
    loss_fn = core.cross_entropy
    batch_fn = loop.batch_for

    def timed_fn(fn, phase):
        def inner(*a, **k):
            t = time.perf_counter()
            clock.stack.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                spent = time.perf_counter() - t
                clock.total[phase] += spent - clock.stack.pop()
                clock.calls[phase] += 1
                if clock.stack:
                    clock.stack[-1] += spent
        return inner

    optim.clip_global_norm = timed_fn(optim_clip, "optimiser (AdamW, clip, zero_grad)")
    loop.cross_entropy = timed_fn(loss_fn, "loss")
    loop.batch_for = timed_fn(batch_fn, "data")
    t0 = time.perf_counter()
    run(args.steps, 3 + args.steps)
    wrapped = time.perf_counter() - t0
    accounted = sum(clock.total.values())
    phases = dict(sorted(clock.total.items(), key=lambda kv: -kv[1]))
    phases["other (Python, model glue)"] = max(wrapped - accounted, 0.0)
    tokens = cfg.batch_size * cfg.seq_len
    return {"cpu": cpu_model(), "threads": args.threads, "steps": args.steps,
            "ms_per_step": 1e3 * plain / args.steps, "ms_per_step_wrapped": 1e3 * wrapped / args.steps,
            "padded_tokens_per_s": tokens * args.steps / plain,
            "phases_ms_per_step": {k: 1e3 * v / args.steps for k, v in phases.items()},
            "share": {k: v / wrapped for k, v in phases.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="tokens/s of the NumPy trainer against the torch trainer")
    c.add_argument("--steps", type=int, default=100)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", default=None, help="folder for compare.json")
    c.add_argument("train_args", nargs="*", help="extra trainer flags after --, e.g. -- --attention softmax")
    f = sub.add_parser("profile", help="per-phase time of the NumPy trainer's steps")
    f.add_argument("--steps", type=int, default=40)
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--out", default=None, help="folder for profile.json")
    args = p.parse_args(argv)
    result = compare(args) if args.command == "compare" else profile(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.command}.json"), "w") as fh:
            fh.write(text + "\n")
    if args.command == "compare":
        for target, ok in result["targets"].items():
            print(f"{'met' if ok else 'MISSED'}: {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
