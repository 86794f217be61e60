"""benchmarks/long_context.py: the time-to-quality sweep's arithmetic, and its three phases end
to end on a tiny configuration of the Austen novels."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import long_context  # noqa: E402

AUSTEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "austen")


def test_time_to_reach_interpolates_between_evaluations():
    curve = [(0.0, 8.0, 0.0), (10.0, 4.0, 9.0), (20.0, 3.0, 21.0), (30.0, 3.5, 30.0)]
    assert long_context.time_to_reach(curve, 5.0) == pytest.approx(7.5)
    assert long_context.time_to_reach(curve, 3.0) == pytest.approx(20.0)
    assert long_context.time_to_reach(curve, 2.9) is None  # never that low
    assert long_context.time_to_reach(curve, 9.0) == pytest.approx(0.0 + 10.0 * (8.0 - 9.0) / 4.0)


def test_every_length_gets_the_same_bytes_per_step():
    opts = long_context.model_options("flex_n", 4096, 16384, "d")
    assert opts[opts.index("--batch-size") + 1] == "4"
    with pytest.raises(ValueError, match="multiple of the length"):
        long_context.model_options("flex_n", 3000, 16384, "d")


@pytest.mark.skipif(not os.path.isdir(AUSTEN), reason="needs ../shared/data/austen")
def test_sweep_end_to_end(tmp_path, capsys):
    common = ["--out", str(tmp_path), "--kinds", "flex_n", "softmax", "--lengths", "32", "--tokens-per-step", "64"]
    long_context.main(["steps", *common, "--data-dir", AUSTEN, "--seconds", "0.2"])
    rows = json.load(open(tmp_path / "steps.json"))["rows"]
    assert {(r["kind"], r["threads"]) for r in rows} == {(k, t) for k in ("flex_n", "softmax") for t in (1, 2)}
    assert all(r["step_s"] > 0 and r["peak_rss_mib"] >= r["base_rss_mib"] > 0 for r in rows)
    budget = ["--budget", "0.3", "--seeds", "0", "1"]
    long_context.main(["train", *common, *budget, "--data-dir", AUSTEN, "--points", "3", "--eval-batches", "1"])
    for kind in ("flex_n", "softmax"):
        step_s = {r["threads"]: r["step_s"] for r in rows if r["kind"] == kind}[2]
        for seed in (0, 1):
            folder = tmp_path / "runs" / f"{kind}-32-seed{seed}"
            metrics = json.load(open(folder / "metrics.json"))
            assert metrics["steps"] == max(1, int(0.3 / step_s))  # the budget over the 2-thread step time
            assert metrics["config"]["threads"] == 1 and metrics["config"]["batch_size"] == 2
            evals = [json.loads(line) for line in open(folder / "evals.jsonl")]
            assert evals[0]["step"] == 0 and evals[-1]["step"] == metrics["steps"]
            assert evals[-1]["eval_bits_per_char"] == metrics["eval_bits_per_char"]
    capsys.readouterr()
    try:
        import matplotlib  # noqa: F401  (the plot is optional)
        plot = ["--plot", str(tmp_path / "curve.png")]
    except ImportError:
        plot = []
    long_context.main(["report", *common, *budget, *plot])
    text = capsys.readouterr().out
    assert "| flex_n |" in text and "| softmax |" in text and "(2) |" in text
    assert not plot or (tmp_path / "curve.png").stat().st_size > 0
