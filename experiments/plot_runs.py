"""Plot evaluation loss and the guard share against steps, per run label, from the
JSON-lines files of run_grid.py (runs that wrote diagnostics.jsonl; mean over seeds).
Runs whose records carry no held-out loss (written before it was recorded) show the
training batch's loss instead, and the panel says so.

    python experiments/plot_runs.py RESULTS.jsonl --out docs/training.png [--title TEXT]
"""
import argparse
import collections
import json

import numpy as np


def curves(path):
    by_label = collections.OrderedDict()
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            if r.get("rc") == 0 and r.get("diagnostics"):
                by_label.setdefault(r["label"], []).append(r["diagnostics"])
    out = {}
    for label, runs in by_label.items():
        steps = [d["step"] for d in runs[0]]
        n = min(len(d) for d in runs)
        held_out = all("eval_loss_after" in d[0] for d in runs)
        key = "eval_loss_after" if held_out else "loss"
        ev = [[d[i][key] for i in range(n)] for d in runs]
        guard = [[d[i]["summary"].get("guard_fraction", 0.0) for i in range(n)] for d in runs]
        out[label] = (np.array(steps[:n]), np.mean(ev, axis=0), np.mean(guard, axis=0), held_out)
    return out


def main(argv=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    fig, axes = plt.subplots(len(args.results), 2, figsize=(11, 3.4 * len(args.results)), squeeze=False)
    for row, path in enumerate(args.results):
        held_out = True
        for label, (steps, ev, guard, held) in curves(path).items():
            held_out &= held
            axes[row, 0].plot(steps, ev, marker=".", label=label)
            axes[row, 1].plot(steps, guard, marker=".", label=label)
        what = "held-out loss (4 batches)" if held_out else "training-batch loss"
        axes[row, 0].set_title(f"{path.rsplit('/', 1)[-1]}: {what}, mean of seeds")
        axes[row, 1].set_title("share of rows on the denominator guard")
        for ax in axes[row]:
            ax.set_xlabel("step")
        axes[row, 0].legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
