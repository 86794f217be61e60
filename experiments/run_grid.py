"""Run a grid of training configurations x seeds, a few processes at a time, and collect
each run's metrics.json into one JSON-lines file (resumable: finished runs are skipped).

    python experiments/run_grid.py GRID.json --out results.jsonl [--jobs 2] [--threads 1]

GRID.json is {"seeds": [0, 1, 2], "runs": {"label": ["--task", "listops", ...], ...}};
every run gets ``--seed S --threads T --quiet --out DIR`` added. Each process runs with
OPENBLAS_NUM_THREADS=1, as ``python -m flexformer train`` itself does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid")
    p.add_argument("--out", required=True, help="JSON-lines file of results (appended)")
    p.add_argument("--jobs", type=int, default=2, help="processes at once (default 2)")
    p.add_argument("--threads", type=int, default=1, help="kernel threads per process (default 1)")
    p.add_argument("--runs-dir", default=None, help="keep run folders here (default: temporary)")
    args = p.parse_args(argv)
    with open(args.grid) as fh:
        grid = json.load(fh)
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as fh:
            for line in fh:
                r = json.loads(line)
                done.add((r["label"], r["seed"], r["threads"]))
    todo = [(label, seed, extra) for label, extra in grid["runs"].items() for seed in grid["seeds"]
            if (label, seed, args.threads) not in done]
    root = args.runs_dir or tempfile.mkdtemp(prefix="flexformer-grid-")
    running = []
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    while todo or running:
        while todo and len(running) < args.jobs:
            label, seed, extra = todo.pop(0)
            out = os.path.join(root, f"{label}-s{seed}-t{args.threads}")
            cmd = [sys.executable, "-m", "flexformer", "train", *extra, "--seed", str(seed), "--threads",
                   str(args.threads), "--quiet", "--out", out, "--overwrite"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            running.append((proc, label, seed, out, extra, time.time()))
        time.sleep(0.5)
        for item in list(running):
            proc, label, seed, out, extra, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            err = proc.stderr.read()
            rec = {"label": label, "seed": seed, "threads": args.threads, "args": extra, "rc": proc.returncode,
                   "wall": time.time() - t0}
            if proc.returncode == 0:
                with open(os.path.join(out, "metrics.json")) as fh:
                    rec["metrics"] = {k: v for k, v in json.load(fh).items() if k != "config"}
                diag = os.path.join(out, "diagnostics.jsonl")
                if os.path.exists(diag):
                    with open(diag) as fh:
                        rec["diagnostics"] = [json.loads(x) for x in fh]
            else:
                rec["error"] = err.strip().splitlines()[-1] if err.strip() else ""
            with open(args.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            m = rec.get("metrics", {})
            print(f"{label} seed {seed}: rc {proc.returncode} " + " ".join(
                f"{k} {m[k]:.4f}" for k in ("eval_accuracy", "eval_bits_per_char", "eval_loss") if k in m),
                flush=True)


if __name__ == "__main__":
    main()
