"""Suites of training runs behind ``python -m flexformer compare --suite NAME``.

``lra``: the five Long Range Arena analogues (ListOps, byte-level text classification,
retrieval, Fashion-MNIST as the image task, Pathfinder) for each chosen kind and seed. Every
run is ``python -m flexformer train`` in its own process, writing into
``OUT/<task>-<kind>-seed<S>/``; a finished run is not repeated and a run stopped by Ctrl-C
continues from its checkpoint, so an interrupted suite resumes where it stopped. The result is one markdown table: a row per
kind, a column per task (mean ± standard deviation over seeds) and the average, with the
paper's Table 1 row for reference.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

_QUICK_EVAL = ["--eval-batches", "8"]
#: (table column, train task, full-budget arguments, --quick arguments)
LRA_TASKS: Tuple[Tuple[str, str, List[str], List[str]], ...] = (
    ("ListOps", "listops", ["--seq-len", "128", "--steps", "600"], ["--seq-len", "128", "--steps", "20"] + _QUICK_EVAL),
    ("Text", "text-cls", ["--seq-len", "512", "--steps", "300"], ["--seq-len", "128", "--steps", "20"] + _QUICK_EVAL),
    ("Retrieval", "retrieval", ["--seq-len", "256", "--steps", "400", "--batch-size", "32"],
     ["--seq-len", "64", "--steps", "20"] + _QUICK_EVAL),
    ("Image", "fmnist", ["--steps", "100"], ["--steps", "10"] + _QUICK_EVAL),
    ("Pathfinder", "pathfinder", ["--seq-len", "256", "--steps", "600"], ["--seq-len", "256", "--steps", "20"]
     + _QUICK_EVAL),
)
SUITES = {"lra": LRA_TASKS}
#: the paper's kinds that this package has (Polaformer it has not), and Based's Taylor map
LRA_KINDS = ("flex_n", "flex_s", "hedgehog", "softmax", "rfa", "performer", "taylor")
#: Zhang and Zhou (2026), Table 1: Long Range Arena average accuracy (%), the paper's figures
PAPER_LRA_AVERAGE = {"flex_n": 59.99, "flex_s": 59.11, "hedgehog": 57.47, "softmax": 56.55, "rfa": 51.27,
                     "performer": 50.48}


def check_suite(name: str):
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of: {', '.join(sorted(SUITES))}")
    return SUITES[name]


def _run_dir(out: str, task: str, kind: str, seed: int) -> str:
    return os.path.join(out, f"{task.lower()}-{kind}-seed{seed}")


def _state(folder: str) -> Tuple[str, Optional[dict]]:
    """("done", metrics) for a finished run, ("stopped", metrics) for one interrupted with
    its checkpoint written (``train --resume`` continues it), ("new", None) otherwise (no
    run, or one killed before it wrote metrics: started again from step 0)."""
    path = os.path.join(folder, "metrics.json")
    try:
        with open(path) as fh:
            metrics = json.load(fh)
    except (OSError, ValueError):
        return "new", None
    if metrics.get("interrupted") or "eval_accuracy" not in metrics:
        ok = os.path.exists(os.path.join(folder, "checkpoint.npz"))
        return ("stopped", metrics) if ok else ("new", None)
    return "done", metrics


def _lock_folder(out: str):
    """An open file holding an exclusive lock on OUT/.suite-lock: a second suite on the same
    folder would start the same runs into the same run folders."""
    fh = open(os.path.join(out, ".suite-lock"), "w")
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return fh
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise ValueError(f"--out {out}: another suite is running there; wait for it, or pass a different --out") \
            from None
    return fh


def select_columns(tasks, columns: Optional[Sequence[str]]):
    """The suite's tasks whose column (or train task) is named in ``columns`` (all for
    None), in the suite's order; ValueError naming the choices for an unknown one."""
    if columns is None:
        return tasks
    column_of = {name: t[0] for t in tasks for name in (t[0].lower(), t[1])}
    unknown = [c for c in columns if c.lower() not in column_of]
    if unknown or not columns:
        raise ValueError(f"--columns: unknown column(s) {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(t[0] for t in tasks)}")
    chosen = {column_of[c.lower()] for c in columns}
    return tuple(t for t in tasks if t[0] in chosen)


def run_suite(name: str, kinds: Sequence[str], seeds: int, out: str, *, data_dir: Optional[str],
              fmnist_dir: Optional[str], quick: bool, extra: Sequence[str] = (), jobs: int = 1,
              columns: Optional[Sequence[str]] = None, stream=sys.stderr) -> int:
    """Run (or resume) the suite; print its table on stdout. Returns 0, 1 when a run failed,
    130 when interrupted (every finished run is kept; the same call resumes the rest).

    ``jobs`` runs go at once, each with ``--threads max(1, cpus // jobs)`` unless ``extra``
    sets ``--threads``; ``columns`` runs only those of the suite's columns (by column or
    task name, e.g. ``["Retrieval"]``)."""
    tasks = select_columns(check_suite(name), columns)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a positive int, got {jobs!r}")
    from .data.fmnist import DEFAULT_DIR, HOW_TO_GET
    from .training.loop import TEXT_TASKS
    names = {t[1] for t in tasks}
    if names & set(TEXT_TASKS) and (data_dir is None or not os.path.isdir(data_dir)):
        raise FileNotFoundError(f"the suite's text and retrieval tasks read plain-text files: pass --data-dir "
                                f"with .txt files (e.g. ../shared/data/austen); got {data_dir!r}")
    fmnist_dir = fmnist_dir or DEFAULT_DIR
    if "fmnist" in names and not os.path.isdir(fmnist_dir):
        raise FileNotFoundError(f"the suite's image task reads Fashion-MNIST from {fmnist_dir}, which does not "
                                f"exist: {HOW_TO_GET.replace('--data-dir', '--fmnist-dir')}")
    os.makedirs(out, exist_ok=True)
    lock = _lock_folder(out)  # held until this process ends
    threads = [] if "--threads" in extra else ["--threads", str(max(1, (os.cpu_count() or 1) // jobs))]
    folder_of = {"fmnist": fmnist_dir, **{t: data_dir for t in TEXT_TASKS}}
    results: Dict[Tuple[str, str], List[float]] = {}
    failed = []
    guard = threading.Lock()
    running: Dict[int, subprocess.Popen] = {}
    stop = threading.Event()

    def report(column, kind, seed, folder, why=None):
        with guard:
            state, metrics = _state(folder)
            if why is None and state == "done":
                results.setdefault((column, kind), []).append(100.0 * metrics["eval_accuracy"])
                print(f"{column} {kind} seed {seed}: accuracy {metrics['eval_accuracy']:.4f}", file=stream,
                      flush=True)
            elif not stop.is_set():
                print(f"{column} {kind} seed {seed} failed: {why or 'no finished metrics.json'}", file=stream)
                failed.append(folder)

    runs = []  # (column, kind, seed, folder, train command) of the runs still to do
    for column, task, full, short in tasks:
        data = ["--data-dir", folder_of[task]] if task in folder_of else []
        for kind in kinds:
            for seed in range(seeds):
                folder = _run_dir(out, column, kind, seed)
                state, _ = _state(folder)
                args = (short if quick else full) + data + list(extra)
                if state == "done":
                    report(column, kind, seed, folder)
                    continue
                if state == "stopped":  # continue to the budget of this call (the last --steps given)
                    at = max(i for i, a in enumerate(args) if a == "--steps")
                    cmd = ["--resume", folder, "--steps", args[at + 1]]
                else:
                    cmd = ["--overwrite", "--out", folder, "--attention", kind, "--seed", str(seed), "--task", task] \
                        + args
                runs.append((column, kind, seed, folder,
                             [sys.executable, "-m", "flexformer", "train", "--quiet"] + cmd + threads))

    def execute(run):
        column, kind, seed, folder, cmd = run
        if stop.is_set():
            return None
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        with guard:
            running[proc.pid] = proc
        err = proc.communicate()[1]
        with guard:
            running.pop(proc.pid, None)
        why = None if proc.returncode == 0 else (err.strip().splitlines()[-1] if err.strip() else proc.returncode)
        return report(column, kind, seed, folder, why)

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(execute, r) for r in runs]
    try:
        for f in futures:
            f.result()
    except KeyboardInterrupt:
        stop.set()
        with guard:  # a terminal's Ctrl-C reaches the runs too; a signal sent to the suite alone does not
            for proc in running.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)  # each run checkpoints at its next step and stops
        print(f"interrupted: the finished runs are kept in {out}; the same command resumes the suite "
              f"(interrupted runs continue from their checkpoints)", file=stream)
        return 130
    pool.shutdown()
    lock.close()
    print(suite_table([t[0] for t in tasks], kinds, results, seeds))
    return 1 if failed else 0


def suite_table(columns: Sequence[str], kinds: Sequence[str], results: Dict[Tuple[str, str], List[float]],
                seeds: int) -> str:
    """Markdown: accuracy (%) mean ± std over seeds per kind and task, the average over the
    tasks (of the per-task means; blank if a task has no finished run), and the paper's row."""
    lines = ["| kind | " + " | ".join(columns) + " | average | paper's LRA average (Table 1) |",
             "|---|" + "---|" * (len(columns) + 2)]
    for kind in kinds:
        cells, means = [], []
        for col in columns:
            vals = np.array(results.get((col, kind), []))
            if len(vals):
                means.append(vals.mean())
                note = "" if len(vals) == seeds else f" ({len(vals)}/{seeds} runs)"
                cells.append(f"{vals.mean():.1f} ± {vals.std():.1f}{note}")
            else:
                cells.append("–")
        avg = f"{np.mean(means):.1f}" if len(means) == len(columns) else "–"
        paper = f"{PAPER_LRA_AVERAGE[kind]:.2f}" if kind in PAPER_LRA_AVERAGE else "–"
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {avg} | {paper} |")
    lines.append("")
    lines.append("Ours: accuracy (%) on this package's analogues (mean ± std over seeds). The last column is the "
                 "Flexformer paper's Table 1 average over the real LRA tasks (its figures, not ours; Polaformer, "
                 "57.23, is not in this package).")
    return "\n".join(lines)
