"""Issue 15's speed targets (and issue 45's margin), measured on this machine in one command, with a verdict per cell.

    python benchmarks/targets.py                    # everything (needs torch; 16-21 min on a Zen 4, Inductor cache warm)
    python benchmarks/targets.py --no-causal-16384  # skip Inductor's long compile of the causal form at 16384
    python benchmarks/targets.py --from DIR         # judge the JSON of an earlier run in DIR again

Runs the commands docs/performance.md quotes, each writing its JSON into its own folder under
--out, then reads them back and judges every target of issue 15:

1. ``attention.py --impls ff_flex_n torch_compile_flex_n ff_flex_s torch_compile_flex_s
   --sizes 4096 --rounds R`` and the same at ``--sizes 16384`` (``--rounds R16``): the
   C kernels at least 1.5x faster than ``torch.compile`` of the same math, forward +
   backward, bidirectional and causal, at both sizes; issue 45's margin, bidirectional at
   4096 at least 1.8x with no round below 1.5x; flex_n bidirectional forward +
   backward at 60% or more of NumPy's float32 matmul rate measured in the same run;
2. ``attention.py --impls ff_flex_n torch_flex_n ff_flex_s torch_flex_s --sizes 4096
   --rounds R``: at least 2x faster than the same math in PyTorch eager;
3. ``decode.py --steps S --threads 2`` and ``--threads 1``: a one-token recurrent step
   of flex_n and flex_s at most 20 us per layer (B = 1, H = 8, d = m = e = 64) at every
   context from 256 to 65,536, and flat: time(65,536) / time(256) at most FLAT.

A ratio is the ratio of the medians over the interleaved rounds (attention.py); the
rounds' own range is shown beside it, since one round can land in a slow phase of a
shared host. Cells a run did not measure say so instead of passing. Writes targets.json
and targets.md into --out; exits 1 when a measured cell misses, 2 when no cell was measured.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("flex_n", "flex_s")
MODES = ("bidir", "causal")
COMPILE_RATIO = 1.5   # torch.compile time / ours, at least
MARGIN_RATIO = 1.8    # issue 45: torch.compile / ours, bidirectional N = 4096, at least ...
MARGIN_FLOOR = 1.5    # ... with every round at least this
EAGER_RATIO = 2.0     # PyTorch eager time / ours, at least
SGEMM_SHARE = 0.60    # flex_n bidirectional forward + backward rate / NumPy's float32 matmul rate
DECODE_US = 20.0      # one-token step, us per layer
FLAT = 1.2            # decode time(longest context) / time(shortest), at most

# (folder under --out, the command's arguments after the script); {R}, {R16}, {S}, {MODES16} filled in main
RUNS = {
    "compile-4096": ["attention.py", "--impls", "ff_flex_n", "torch_compile_flex_n", "ff_flex_s",
                     "torch_compile_flex_s", "--sizes", "4096", "--rounds", "{R}"],
    "compile-16384": ["attention.py", "--impls", "ff_flex_n", "torch_compile_flex_n", "ff_flex_s",
                      "torch_compile_flex_s", "--sizes", "16384", "--rounds", "{R16}", "--modes", "{MODES16}"],
    "eager-4096": ["attention.py", "--impls", "ff_flex_n", "torch_flex_n", "ff_flex_s", "torch_flex_s",
                   "--sizes", "4096", "--rounds", "{R}"],
    "decode-2-threads": ["decode.py", "--kinds", "flex_n,flex_s", "--steps", "{S}", "--threads", "2"],
    "decode-1-thread": ["decode.py", "--kinds", "flex_n,flex_s", "--steps", "{S}", "--threads", "1"],
}
STEP_TARGET = f"one-token step <= {DECODE_US:g} us per layer"
FLAT_TARGET = f"decode flat: time(longest context) / time(shortest) <= {FLAT:g}"


def _cell(target: str, case: str, measured, threshold: float, holds, unit: str, detail: str = "") -> dict:
    """One judged cell; unit ("x", "%", "us" or "") says how `measured` reads."""
    return {"target": target, "case": case, "measured": measured, "threshold": threshold,
            "holds": holds, "unit": unit, "detail": detail}


def _ratio(record, peer_prefix: str, kind: str, mode: str, N: int):
    """The peer's time over ours for one case of an attention.py record, and its rounds
    (None, None when the record lacks the case; rounds None when it kept none)."""
    ratios = (record or {}).get("ratios", {})
    key = f"{peer_prefix}{kind}/ff_{kind} fwd+bwd {mode} N={N}"
    return ratios.get(key), ratios.get(key + " per round")


def _rounds_detail(rounds) -> str:
    return f"rounds {min(rounds):.2f}-{max(rounds):.2f}x" if rounds else ""


def _ratio_cells(record, target: str, peer_prefix: str, threshold: float, N: int) -> list:
    """One cell per kind and mode: the peer's time over ours at size N, from an attention.py record."""
    cells = []
    for kind in KINDS:
        for mode in MODES:
            case = f"{kind} {mode} N={N}"
            ratio, rounds = _ratio(record, peer_prefix, kind, mode, N)
            if ratio is None:
                cells.append(_cell(target, case, None, threshold, None, "x", "not measured in this run"))
                continue
            cells.append(_cell(target, case, ratio, threshold, ratio >= threshold, "x", _rounds_detail(rounds)))
    return cells


def _margin_cells(record) -> list:
    """Issue 45's margin: the bidirectional N = 4096 ratio to torch.compile at MARGIN_RATIO
    or more, and no round below MARGIN_FLOOR."""
    target = (f"torch.compile / ours, bidirectional N=4096 >= {MARGIN_RATIO:g}x, "
              f"every round >= {MARGIN_FLOOR:g}x")
    cells = []
    for kind in KINDS:
        ratio, rounds = _ratio(record, "torch_compile_", kind, "bidir", 4096)
        if ratio is None or not rounds:
            cells.append(_cell(target, kind, None, MARGIN_RATIO, None, "x", "not measured in this run"))
            continue
        holds = ratio >= MARGIN_RATIO and min(rounds) >= MARGIN_FLOOR
        cells.append(_cell(target, kind, ratio, MARGIN_RATIO, holds, "x", _rounds_detail(rounds)))
    return cells


def _share_cells(record, N: int) -> list:
    target = f"flex_n bidirectional fwd+bwd >= {SGEMM_SHARE:.0%} of NumPy's float32 matmul rate"
    rate = (record or {}).get("flex_n_rates", {}).get(f"fwdbwd N={N}")
    sgemm = (record or {}).get("matmul_gflops")
    case = f"N={N}"
    if not rate or not sgemm:
        return [_cell(target, case, None, SGEMM_SHARE, None, "%", "not measured in this run")]
    share = rate["gflops"] / sgemm
    return [_cell(target, case, share, SGEMM_SHARE, share >= SGEMM_SHARE, "%",
                  f"{rate['gflop']:.2f} GFLOP at {rate['gflops']:.1f} GFLOP/s; matmul {sgemm:.1f} GFLOP/s")]


def _decode_cells(record, threads_label: str) -> list:
    cells = []
    for kind in KINDS:
        rows = sorted((r for r in (record or {}).get("rows", []) if r["kind"] == kind), key=lambda r: r["context"])
        case = f"{kind}, {threads_label}"
        if not rows:
            cells += [_cell(STEP_TARGET, case, None, DECODE_US, None, "us", "not measured in this run"),
                      _cell(FLAT_TARGET, case, None, FLAT, None, "", "not measured in this run")]
            continue
        us = [r["ms_per_token"] * 1e3 for r in rows]
        contexts = f"contexts {rows[0]['context']}-{rows[-1]['context']}"
        worst = max(us)
        cells.append(_cell(STEP_TARGET, case, worst, DECODE_US, worst <= DECODE_US, "us",
                           f"{min(us):.1f}-{worst:.1f} us over {contexts}"))
        flat = us[-1] / us[0]
        cells.append(_cell(FLAT_TARGET, case, flat, FLAT, flat <= FLAT, "", contexts))
    return cells


def evaluate(records: dict) -> list:
    """Every target's cells from the runs' JSON records (keys of RUNS; a missing run gives
    cells that say "not measured"). Each cell: target, case, measured, threshold, holds
    (True, False, or None when not measured), unit and a detail."""
    cells = []
    for N, name in ((4096, "compile-4096"), (16384, "compile-16384")):
        cells += _ratio_cells(records.get(name), f"torch.compile / ours >= {COMPILE_RATIO:g}x",
                              "torch_compile_", COMPILE_RATIO, N)
    cells += _margin_cells(records.get("compile-4096"))
    cells += _ratio_cells(records.get("eager-4096"), f"PyTorch eager / ours >= {EAGER_RATIO:g}x", "torch_",
                          EAGER_RATIO, 4096)
    for N, name in ((4096, "compile-4096"), (16384, "compile-16384")):
        cells += _share_cells(records.get(name), N)
    cells += _decode_cells(records.get("decode-2-threads"), "2 threads")
    cells += _decode_cells(records.get("decode-1-thread"), "1 thread")
    return cells


def _machine(records: dict) -> str:
    for rec in records.values():
        cfg = (rec or {}).get("config")
        if cfg:
            return (f"{cfg.get('cpu')}, kernel ISA level {cfg.get('isa_level')}, dense copies "
                    f"{cfg.get('dense_paths')}, {cfg.get('threads')} threads, torch {cfg.get('torch')}")
    return "unknown (no attention.py record)"


def _fmt(cell) -> str:
    x, unit = cell["measured"], cell["unit"]
    if x is None:
        return "-"
    return {"%": f"{x:.0%}", "us": f"{x:.1f} us", "x": f"{x:.2f}x"}.get(unit, f"{x:.2f}")


def report(cells: list, machine: str) -> str:
    verdict = {True: "holds", False: "MISSES", None: "not measured"}
    lines = [f"Machine: {machine}", "", "| target | case | measured | verdict | detail |", "|---|---|---:|---|---|"]
    for c in cells:
        lines.append(f"| {c['target']} | {c['case']} | {_fmt(c)} | {verdict[c['holds']]} | {c['detail']} |")
    held = sum(c["holds"] is True for c in cells)
    missed = sum(c["holds"] is False for c in cells)
    unmeasured = sum(c["holds"] is None for c in cells)
    lines += ["", f"{held} cells hold, {missed} miss, {unmeasured} not measured."]
    return "\n".join(lines)


def _load(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(HERE, "results", "latest", "targets"))
    p.add_argument("--from", dest="source", help="judge the records already in this folder (no runs)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the N = 4096 runs (default 5)")
    p.add_argument("--rounds-16384", type=int, default=3, help="rounds of the N = 16384 run (default 3)")
    p.add_argument("--steps", type=int, default=3000, help="timed tokens per context in decode.py (default 3000)")
    p.add_argument("--no-causal-16384", action="store_true",
                   help="bidirectional only at 16384 (Inductor compiles the causal form for many minutes)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.rounds_16384 < 1 or args.steps < 1:
        p.error("--rounds, --rounds-16384 and --steps must be >= 1")
    folder = args.source or args.out
    if not args.source:
        fill = {"{R}": str(args.rounds), "{R16}": str(args.rounds_16384), "{S}": str(args.steps),
                "{MODES16}": "bidir" if args.no_causal_16384 else "bidir causal"}
        for name, cmd in RUNS.items():
            argv_run = []
            for a in cmd:
                argv_run += fill[a].split() if a in fill else [a]
            out = os.path.join(folder, name)
            full = [sys.executable, os.path.join(HERE, argv_run[0])] + argv_run[1:] + ["--out", out]
            print(f"$ {' '.join(['python', 'benchmarks/' + argv_run[0]] + argv_run[1:])}", flush=True)
            rc = subprocess.call(full)
            if rc != 0:
                print(f"  (exit {rc}: its cells are judged from what it wrote)", flush=True)
    # each script writes <its name>.json into its --out folder
    records = {name: _load(os.path.join(folder, name, cmd[0].replace(".py", ".json"))) for name, cmd in RUNS.items()}
    cells = evaluate(records)
    machine = _machine(records)
    text = report(cells, machine)
    print("\n" + text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "targets.json"), "w") as fh:
        json.dump({"machine": machine, "cells": cells}, fh, indent=1)
    with open(os.path.join(args.out, "targets.md"), "w") as fh:
        fh.write(text + "\n")
    print(f"wrote {os.path.join(args.out, 'targets.md')}")
    if any(c["holds"] is False for c in cells):
        return 1
    return 0 if any(c["holds"] for c in cells) else 2  # nothing measured is not a pass


if __name__ == "__main__":
    sys.exit(main())
