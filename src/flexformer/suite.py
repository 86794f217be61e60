"""Suites of training runs behind ``python -m flexformer compare --suite NAME``.

``lra``: the five Long Range Arena analogues (ListOps, byte-level text classification,
retrieval, Fashion-MNIST as the image task, Pathfinder) for each chosen kind and seed. Every
run is ``python -m flexformer train`` in its own process, writing into
``OUT/<task>-<kind>-seed<S>/``; a run whose ``metrics.json`` exists is not repeated, so an
interrupted suite resumes where it stopped. The result is one markdown table: a row per
kind, a column per task (mean ± standard deviation over seeds) and the average, with the
paper's Table 1 row for reference.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

#: (table column, train task, full-budget arguments, --quick arguments)
LRA_TASKS: Tuple[Tuple[str, str, List[str], List[str]], ...] = (
    ("ListOps", "listops", ["--seq-len", "128", "--steps", "600"], ["--seq-len", "128", "--steps", "20"]),
    ("Text", "text-cls", ["--seq-len", "512", "--steps", "300"], ["--seq-len", "128", "--steps", "20"]),
    ("Retrieval", "retrieval", ["--seq-len", "256", "--steps", "300"], ["--seq-len", "64", "--steps", "20"]),
    ("Image", "fmnist", ["--steps", "200"], ["--steps", "10"]),
    ("Pathfinder", "pathfinder", ["--seq-len", "256", "--steps", "600"], ["--seq-len", "256", "--steps", "20"]),
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


def run_suite(name: str, kinds: Sequence[str], seeds: int, out: str, *, data_dir: Optional[str],
              fmnist_dir: Optional[str], quick: bool, extra: Sequence[str] = (), stream=sys.stderr) -> int:
    """Run (or resume) the suite; print its table on stdout. Returns 0, or 1 when a run failed."""
    tasks = check_suite(name)
    if data_dir is None or not os.path.isdir(data_dir):
        raise FileNotFoundError(f"the suite's text and retrieval tasks read plain-text files: pass --data-dir "
                                f"with .txt files (e.g. ../shared/data/austen); got {data_dir!r}")
    from .data.fmnist import DEFAULT_DIR, HOW_TO_GET
    from .training.loop import TEXT_TASKS
    fmnist_dir = fmnist_dir or DEFAULT_DIR
    if not os.path.isdir(fmnist_dir):
        raise FileNotFoundError(f"the suite's image task reads Fashion-MNIST from {fmnist_dir}, which does not "
                                f"exist: {HOW_TO_GET.replace('--data-dir', '--fmnist-dir')}")
    os.makedirs(out, exist_ok=True)
    failed = 0
    results: Dict[Tuple[str, str], List[float]] = {}
    try:
        for column, task, full, short in tasks:
            folder_of = {"fmnist": fmnist_dir, **{t: data_dir for t in TEXT_TASKS}}
            data = ["--data-dir", folder_of[task]] if task in folder_of else []
            for kind in kinds:
                for seed in range(seeds):
                    folder = _run_dir(out, column, kind, seed)
                    metrics = os.path.join(folder, "metrics.json")
                    if not os.path.exists(metrics):
                        cmd = [sys.executable, "-m", "flexformer", "train", "--quiet", "--overwrite", "--out", folder,
                               "--attention", kind, "--seed", str(seed), "--task", task] + (short if quick else full) \
                            + data + list(extra)
                        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                              env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
                        if proc.returncode != 0 or not os.path.exists(metrics):
                            why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode
                            print(f"{column} {kind} seed {seed} failed: {why}", file=stream)
                            failed += 1
                            continue
                    with open(metrics) as fh:
                        m = json.load(fh)
                    results.setdefault((column, kind), []).append(100.0 * m["eval_accuracy"])
                    print(f"{column} {kind} seed {seed}: accuracy {m['eval_accuracy']:.4f}", file=stream)
    except KeyboardInterrupt:
        print(f"interrupted: the finished runs are kept in {out}; the same command resumes the suite",
              file=stream)
        return 130
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
