"""Markdown tables from the JSON-lines files that run_grid.py writes.

    python experiments/tables.py RESULTS.jsonl [RESULTS2.jsonl ...] [--labels a,b,c]

One row per label: the metric (evaluation accuracy, or bits per character for text-lm)
as mean ± standard deviation over seeds with every seed's value, the evaluation loss,
the runs that failed, and, where the runs wrote diagnostics, the guard share, the
distance from softmax rows and flex_n's pair separation at the first and last record.
"""
import argparse
import collections
import json

import numpy as np


def load(paths):
    rows = collections.OrderedDict()
    for path in paths:
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                key = (r["label"], r["threads"])
                rows.setdefault(key, {})[r["seed"]] = r  # a later file's run replaces an earlier one
    return rows


def _diag(runs, key):
    first = [r["diagnostics"][0]["summary"].get(key) for r in runs if r.get("diagnostics")]
    last = [r["diagnostics"][-1]["summary"].get(key) for r in runs if r.get("diagnostics")]
    if not first or first[0] is None:
        return ""
    return f"{np.mean(first):.3g} → {np.mean(last):.3g}"


def table(rows, labels=None):
    out = ["| run | threads | metric (mean ± std) | per seed | eval loss | failed | guard share | TV from softmax | separation |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (label, threads), by_seed in rows.items():
        if labels and label not in labels:
            continue
        runs = [by_seed[s] for s in sorted(by_seed)]
        ok = [r for r in runs if r["rc"] == 0]
        failed = ", ".join(f"seed {r['seed']}" for r in runs if r["rc"] != 0) or "none"
        if not ok:
            out.append(f"| {label} | {threads} | – | – | – | {failed} | | | |")
            continue
        metric = "eval_accuracy" if "eval_accuracy" in ok[0]["metrics"] else "eval_bits_per_char"
        vals = np.array([r["metrics"][metric] for r in ok])
        loss = np.array([r["metrics"]["eval_loss"] for r in ok])
        name = "acc" if metric == "eval_accuracy" else "bits/char"
        out.append(f"| {label} | {threads} | {name} {vals.mean():.4f} ± {vals.std():.4f} | "
                   f"{' / '.join(f'{v:.3f}' for v in vals)} | {loss.mean():.4f} ± {loss.std():.4f} | {failed} | "
                   f"{_diag(ok, 'guard_fraction')} | {_diag(ok, 'kernel_tv')} | {_diag(ok, 'separation')} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--labels", default=None, help="comma-separated labels to show, in file order")
    args = p.parse_args(argv)
    labels = set(args.labels.split(",")) if args.labels else None
    print(table(load(args.results), labels))


if __name__ == "__main__":
    main()
