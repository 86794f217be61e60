"""Time to quality at long context: a character language model on the Austen novels at
1,024-16,384 bytes per sequence, each attention kind given the same training time.

    python benchmarks/long_context.py steps --data-dir ../shared/data/austen --out runs/long
    python benchmarks/long_context.py train --data-dir ../shared/data/austen --out runs/long
    python benchmarks/long_context.py report --out runs/long --plot docs/long_context.png

``steps`` times a training step for every kind, length and thread count (1 and 2) in a
fresh process each, one process at a time, and records the process's peak resident memory
(``ru_maxrss``) beside the resident memory of a process that has only imported flexformer
and read the data: ``steps.json``. Every configuration trains on the same number of bytes per
step (``--tokens-per-step``, 16,384: batch 16 at 1,024, batch 1 at 16,384), so a step costs
the same data whatever the length.

``train`` gives every kind ``--budget`` seconds: a run's step count is the budget over its
2-thread step time from ``steps.json``, its warmup a tenth of that, and it evaluates on the
held-out novel (``--eval-batches`` batches of ``--tokens-per-step`` bytes) at about
``--points`` evenly spaced steps (``evals.jsonl``). Runs are ``flexformer train`` commands
with the kernels on ``--threads`` threads (default 1), ``--jobs`` at a time: a run's results
do not depend on what else the machine does, so the runs can share the machine while the
clock they are compared on comes from the quiet ``steps`` phase. (The thread count can
change the rounding of the parameter-gradient sums and so a trajectory; ``--threads 2`` runs
go to folders of their own.) Runs already finished are kept; runs that fail are listed.

``report`` places each evaluation at step x (2-thread step time) seconds, averages the seeds,
and writes ``report.md`` (bits per character at the budget, the time each kind takes to reach
a level, step times at both thread counts, peak memory) and, with ``--plot``, bits per
character against seconds, one panel per length.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attention import _cpu_name as cpu_model  # noqa: E402  (the sweep's machine line)

KINDS = ("flex_n", "flex_s", "performer", "hedgehog", "taylor", "softmax")
LENGTHS = (1024, 4096, 16384)
THREADS = (1, 2)


def model_options(kind: str, length: int, tokens_per_step: int, data_dir: str) -> list:
    """The ``flexformer train`` options every phase shares (the text-lm task's defaults
    otherwise: width 64, 2 blocks, 4 heads, lr 3e-3, short convolutions of width 4)."""
    if tokens_per_step % length:
        raise ValueError(f"--tokens-per-step {tokens_per_step} is not a multiple of the length {length}")
    return ["--task", "text-lm", "--attention", kind, "--seq-len", str(length),
            "--batch-size", str(tokens_per_step // length), "--data-dir", data_dir, "--diagnostics-every", "0"]


# --------------------------------------------------------------------------- steps

def _resident_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_one(kind: str, length: int, threads: int, tokens_per_step: int, data_dir: str, seconds: float) -> dict:
    """In this (fresh) process: the mean step time over a run of about ``seconds`` after a
    two-step warm-up run, and the peak resident memory."""
    from flexformer.__main__ import build_parser
    from flexformer.training import train
    from flexformer.training.loop import build_data
    from flexformer.training.options import config_from_options

    args = build_parser().parse_args(["train"] + model_options(kind, length, tokens_per_step, data_dir)
                                     + ["--threads", str(threads), "--eval-batches", "1", "--warmup", "1"])
    cfg = config_from_options(args)
    build_data(cfg)
    base = _resident_mib()
    with tempfile.TemporaryDirectory() as tmp:
        cfg.steps = cfg.checkpoint_every = 2
        warm = train(cfg, os.path.join(tmp, "warm"), progress=False)
        cfg.steps = cfg.checkpoint_every = max(3, min(30, math.ceil(seconds / (warm["train_seconds"] / 2))))
        run = train(cfg, os.path.join(tmp, "run"), progress=False)
    return {"kind": kind, "length": length, "threads": threads, "steps_timed": cfg.steps,
            "step_s": run["train_seconds"] / cfg.steps, "peak_rss_mib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024, "base_rss_mib": base}


def steps_phase(args) -> None:
    path = os.path.join(args.out, "steps.json")
    rows = json.load(open(path))["rows"] if os.path.exists(path) else []
    done = {(r["kind"], r["length"], r["threads"]) for r in rows}
    for length in args.lengths:
        for kind in args.kinds:
            for threads in THREADS:
                if (kind, length, threads) in done:
                    continue
                proc = subprocess.run([sys.executable, __file__, "_time", kind, str(length), str(threads),
                                       "--tokens-per-step", str(args.tokens_per_step), "--data-dir", args.data_dir,
                                       "--seconds", str(args.seconds)], capture_output=True, text=True,
                                      env=dict(os.environ, OPENBLAS_NUM_THREADS="1", FLEXFORMER_NO_REEXEC="1"))
                if proc.returncode:
                    print(f"{kind} {length} {threads} threads failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"{kind:>9} N={length:<6} {threads} threads: {row['step_s']:.3f} s/step, peak "
                      f"{row['peak_rss_mib']:.0f} MiB", flush=True)
                os.makedirs(args.out, exist_ok=True)
                with open(path, "w") as fh:
                    json.dump({"cpu": cpu_model(), "tokens_per_step": args.tokens_per_step, "rows": rows}, fh,
                              indent=1)


def step_times(out: str) -> dict:
    with open(os.path.join(out, "steps.json")) as fh:
        return {(r["kind"], r["length"], r["threads"]): r for r in json.load(fh)["rows"]}


# --------------------------------------------------------------------------- train

def run_dir(out: str, kind: str, length: int, seed: int, threads: int = 1) -> str:
    return os.path.join(out, "runs", f"{kind}-{length}-seed{seed}" + (f"-threads{threads}" if threads != 1 else ""))


def plan(args, times: dict) -> list:
    """(kind, length, seed, command) for every run, seed by seed (an interrupted sweep has
    whole seeds)."""
    todo = []
    for seed in args.seeds:
        for length in args.lengths:
            for kind in args.kinds:
                steps = max(1, int(args.budget / times[kind, length, 2]["step_s"]))
                every = max(1, math.ceil(steps / args.points))
                cmd = [sys.executable, "-m", "flexformer", "train", *model_options(
                    kind, length, args.tokens_per_step, args.data_dir), "--steps", str(steps),
                    "--warmup", str(max(1, steps // 10)), "--eval-every", str(every), "--eval-batches",
                    str(args.eval_batches), "--checkpoint-every", str(steps), "--seed", str(seed),
                    "--threads", str(args.threads), "--quiet", "--out",
                    run_dir(args.out, kind, length, seed, args.threads)]
                todo.append((kind, length, seed, cmd))
    return todo


def train_phase(args) -> None:
    times = step_times(args.out)
    todo = [t for t in plan(args, times)
            if not os.path.exists(os.path.join(run_dir(args.out, *t[:3], args.threads), "metrics.json"))]
    running, failed = [], []
    while todo or running:
        while todo and len(running) < args.jobs:
            kind, length, seed, cmd = todo.pop(0)
            folder = run_dir(args.out, kind, length, seed, args.threads)
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            log = open(folder + ".log", "w")
            running.append(((kind, length, seed), subprocess.Popen(cmd + ["--overwrite"], stdout=log,
                                                                   stderr=subprocess.STDOUT), log))
            print(f"start {kind} N={length} seed {seed}: {cmd[cmd.index('--steps') + 1]} steps", flush=True)
        time.sleep(1)
        for item in list(running):
            name, proc, log = item
            if proc.poll() is not None:
                running.remove(item)
                log.close()
                if proc.returncode:
                    failed.append(name)
                print(f"{'FAILED' if proc.returncode else 'done'} {name}", flush=True)
    if failed:
        print(f"failed runs (logs beside their folders): {failed}", file=sys.stderr)


# --------------------------------------------------------------------------- report

def curves(args, times: dict) -> dict:
    """{(kind, length): {seed: [(seconds, bits per char, measured train seconds, step)]}}"""
    out = {}
    for kind in args.kinds:
        for length in args.lengths:
            step_s = times[kind, length, 2]["step_s"]
            for seed in args.seeds:
                folder = run_dir(args.out, kind, length, seed, args.threads)
                if not os.path.exists(os.path.join(folder, "metrics.json")):
                    continue
                path = os.path.join(folder, "evals.jsonl")
                rows = [json.loads(line) for line in open(path)]
                out.setdefault((kind, length), {})[seed] = [
                    (r["step"] * step_s, r["eval_bits_per_char"], r["train_seconds"], r["step"]) for r in rows]
    return out


def time_to_reach(curve, level: float):
    """The first seconds at which a curve's bits per char is <= level (linear between
    evaluations), or None."""
    for (t0, b0, *_), (t1, b1, *_) in zip(curve, curve[1:]):
        if b1 <= level:
            return t1 if b0 == b1 else t0 + (t1 - t0) * (b0 - level) / (b0 - b1)
    return None


def mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0), len(values)


def report(args) -> str:
    times = step_times(args.out)
    runs = curves(args, times)
    lines = [f"Machine: {cpu_model()}. Budget {args.budget:g} s of 2-thread training time per run, "
             f"{args.tokens_per_step:,} bytes per step, seeds {', '.join(map(str, args.seeds))}, runs on "
             f"{args.threads} kernel thread(s).", ""]
    for length in args.lengths:
        kinds = [k for k in args.kinds if (k, length) in runs]
        if not kinds:
            continue
        finals = {k: [c[-1][1] for c in runs[k, length].values()] for k in kinds}
        best_linear = min((statistics.mean(v), k) for k, v in finals.items() if k != "softmax")
        levels = sorted({round(statistics.mean(finals["softmax"]), 2)} if "softmax" in finals else set())
        levels.append(round(best_linear[0] + 0.1, 2))
        head = " | ".join(f"s to {lv:.2f} bpc" for lv in levels)
        lines += [f"### {length:,} bytes per sequence", "",
                  f"| kind | steps | bits/char at {args.budget:g} s (mean ± sd, runs) | {head} | s/step 1 thread "
                  "| s/step 2 threads | peak RSS MiB |",
                  "|---|---:|---:|" + "---:|" * len(levels) + "---:|---:|---:|"]
        for k in kinds:
            m, sd, n = mean_sd(finals[k])
            reach = []
            for lv in levels:
                rm, rsd, rn = mean_sd([time_to_reach(c, lv) for c in runs[k, length].values()])
                reach.append("not reached" if rm is None else f"{rm:.0f} ± {rsd:.0f}" +
                             ("" if rn == n else f" ({rn} of {n})"))
            steps = next(iter(runs[k, length].values()))[-1][3]
            lines.append(f"| {k} | {steps} | {m:.3f} ± {sd:.3f} ({n}) | " + " | ".join(reach) +
                         f" | {times[k, length, 1]['step_s']:.2f} | {times[k, length, 2]['step_s']:.2f} | "
                         f"{times[k, length, 2]['peak_rss_mib']:.0f} |")
        lines.append("")
    base = statistics.median(r["base_rss_mib"] for r in times.values())
    lines.append(f"Peak RSS is the whole process's; one that has imported flexformer and read the novels holds "
                 f"{base:.0f} MiB.")
    text = "\n".join(lines) + "\n"
    name = "report.md" if args.threads == 1 else f"report-threads{args.threads}.md"
    with open(os.path.join(args.out, name), "w") as fh:
        fh.write(text)
    if args.plot:
        plot(args, runs, args.plot)
    return text


def plot(args, runs: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [n for n in args.lengths if any((k, n) in runs for k in args.kinds)]
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.6 * len(lengths), 3.8), squeeze=False)
    for ax, length in zip(axes[0], lengths):
        for kind in args.kinds:
            seeds = runs.get((kind, length))
            if not seeds:
                continue
            width = min(len(c) for c in seeds.values())
            xs = [statistics.mean(c[i][0] for c in seeds.values()) for i in range(width)]
            ys = [statistics.mean(c[i][1] for c in seeds.values()) for i in range(width)]
            ax.plot(xs, ys, marker="o", markersize=3, label=kind)
        ax.set_title(f"{length:,} bytes per sequence")
        ax.set_xlabel("training seconds (2 threads)")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out bits per character")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- command line

def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="phase", required=True)
    for name in ("steps", "train", "report"):
        q = sub.add_parser(name)
        q.add_argument("--out", required=True, help="the sweep's folder")
        q.add_argument("--kinds", nargs="+", default=list(KINDS))
        q.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
        q.add_argument("--tokens-per-step", type=int, default=16384)
        if name != "report":
            q.add_argument("--data-dir", required=True, help="the novels, e.g. ../shared/data/austen")
        if name == "steps":
            q.add_argument("--seconds", type=float, default=15.0, help="timed seconds per configuration")
        if name != "steps":
            q.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
            q.add_argument("--budget", type=float, default=90.0, help="2-thread training seconds per run")
        if name != "steps":
            q.add_argument("--threads", type=int, default=1, help="kernel threads of the runs (the clock is "
                           "the 2-thread step time either way)")
        if name == "train":
            q.add_argument("--points", type=int, default=6, help="evaluations per run (about)")
            q.add_argument("--eval-batches", type=int, default=4)
            q.add_argument("--jobs", type=int, default=2, help="runs at a time")
        if name == "report":
            q.add_argument("--plot", help="write the plot here (needs matplotlib)")
    t = sub.add_parser("_time")  # one configuration in a fresh process (used by `steps`)
    t.add_argument("kind")
    t.add_argument("length", type=int)
    t.add_argument("threads", type=int)
    t.add_argument("--tokens-per-step", type=int, required=True)
    t.add_argument("--data-dir", required=True)
    t.add_argument("--seconds", type=float, required=True)
    args = p.parse_args(argv)
    if args.phase == "_time":
        print(json.dumps(time_one(args.kind, args.length, args.threads, args.tokens_per_step, args.data_dir,
                                  args.seconds)))
    elif args.phase == "steps":
        steps_phase(args)
    elif args.phase == "train":
        train_phase(args)
    else:
        print(report(args), end="")


if __name__ == "__main__":
    main()
