"""benchmarks/targets.py judges issue 15's cells from the benchmarks' JSON: thresholds on the
right side, missing runs reported as not measured rather than passed."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import targets  # noqa: E402


def attention_record(N, ratios, rate=None, sgemm=None):
    """An attention.py record holding the given peer/ours ratios at size N."""
    rec = {"config": {"cpu": "Test CPU", "isa_level": 4, "dense_paths": {}, "threads": 2, "torch": "x"},
           "ratios": {}, "flex_n_rates": {}, "matmul_gflops": sgemm}
    for (peer, kind, mode), value in ratios.items():
        key = f"{peer}{kind}/ff_{kind} fwd+bwd {mode} N={N}"
        rec["ratios"][key] = value
        rec["ratios"][key + " per round"] = [value * 0.9, value, value * 1.1]
    if rate:
        rec["flex_n_rates"][f"fwdbwd N={N}"] = {"gflop": 6.44, "gflops": rate}
    return rec


def decode_record(us_by_kind):
    return {"rows": [{"kind": kind, "context": t, "ms_per_token": us / 1e3}
                     for kind, series in us_by_kind.items() for t, us in series]}


def by_case(cells, target_part):
    return {c["case"]: c for c in cells if target_part in c["target"]}


def test_ratio_cells_hold_at_the_threshold_and_miss_below():
    ratios = {("torch_compile_", "flex_n", "bidir"): 1.5, ("torch_compile_", "flex_n", "causal"): 1.49,
              ("torch_compile_", "flex_s", "bidir"): 2.0}
    cells = by_case(targets.evaluate({"compile-4096": attention_record(4096, ratios)}), "torch.compile")
    assert cells["flex_n bidir N=4096"]["holds"] is True
    assert cells["flex_n causal N=4096"]["holds"] is False
    assert cells["flex_s bidir N=4096"]["holds"] is True
    assert cells["flex_s bidir N=4096"]["detail"] == "rounds 1.80-2.20x"
    # flex_s causal is absent from the record, and N = 16384 was not run at all
    assert cells["flex_s causal N=4096"]["holds"] is None
    assert all(cells[f"{k} {m} N=16384"]["holds"] is None for k in ("flex_n", "flex_s") for m in ("bidir", "causal"))


def test_margin_cells_need_the_median_and_every_round():
    # attention_record's rounds are 0.9x, 1x and 1.1x the median
    ratios = {("torch_compile_", "flex_n", "bidir"): 1.8, ("torch_compile_", "flex_s", "bidir"): 1.79}
    cells = by_case(targets.evaluate({"compile-4096": attention_record(4096, ratios)}), "every round")
    assert cells["flex_n"]["holds"] is True and cells["flex_n"]["detail"] == "rounds 1.62-1.98x"
    assert cells["flex_s"]["holds"] is False
    rec = attention_record(4096, {("torch_compile_", "flex_n", "bidir"): 2.0})
    rec["ratios"]["torch_compile_flex_n/ff_flex_n fwd+bwd bidir N=4096 per round"] = [1.49, 2.0, 2.5]
    cells = by_case(targets.evaluate({"compile-4096": rec}), "every round")
    assert cells["flex_n"]["holds"] is False  # one round below 1.5x
    assert cells["flex_s"]["holds"] is None
    assert by_case(targets.evaluate({}), "every round")["flex_n"]["holds"] is None


def test_eager_cells_read_the_eager_peers_only():
    rec = attention_record(4096, {("torch_compile_", "flex_n", "bidir"): 3.0, ("torch_", "flex_n", "bidir"): 1.9})
    cells = by_case(targets.evaluate({"eager-4096": rec}), "eager")
    assert cells["flex_n bidir N=4096"]["holds"] is False
    assert cells["flex_n bidir N=4096"]["measured"] == pytest.approx(1.9)


def test_sgemm_share():
    cells = targets.evaluate({"compile-4096": attention_record(4096, {}, rate=120.0, sgemm=200.0),
                              "compile-16384": attention_record(16384, {}, rate=110.0, sgemm=200.0)})
    share = by_case(cells, "matmul rate")
    assert share["N=4096"]["measured"] == pytest.approx(0.60) and share["N=4096"]["holds"] is True
    assert share["N=16384"]["measured"] == pytest.approx(0.55) and share["N=16384"]["holds"] is False


def test_decode_cells_take_the_worst_context_and_the_flatness():
    rec = decode_record({"flex_n": [(256, 15.0), (65536, 19.9)], "flex_s": [(256, 12.0), (1024, 20.5), (65536, 12.5)]})
    cells = targets.evaluate({"decode-2-threads": rec})
    step = by_case(cells, "us per layer")
    assert step["flex_n, 2 threads"]["holds"] is True
    assert step["flex_s, 2 threads"]["holds"] is False and step["flex_s, 2 threads"]["measured"] == pytest.approx(20.5)
    assert step["flex_n, 1 thread"]["holds"] is None
    flat = by_case(cells, "flat")
    assert flat["flex_n, 2 threads"]["holds"] is False  # 19.9 / 15.0 = 1.33 > 1.2
    assert flat["flex_s, 2 threads"]["holds"] is True


def test_from_folder_writes_the_report_and_exits_1_on_a_miss(tmp_path):
    src = tmp_path / "runs"
    (src / "compile-4096").mkdir(parents=True)
    rec = attention_record(4096, {("torch_compile_", "flex_n", "bidir"): 1.2})
    (src / "compile-4096" / "attention.json").write_text(json.dumps(rec))
    out = tmp_path / "out"
    assert targets.main(["--from", str(src), "--out", str(out)]) == 1
    text = (out / "targets.md").read_text()
    assert "Test CPU" in text and "| flex_n bidir N=4096 | 1.20x | MISSES |" in text
    assert json.loads((out / "targets.json").read_text())["cells"][0]["holds"] is False
    # nothing measured is neither a miss nor a pass
    assert targets.main(["--from", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "0 cells hold, 0 miss" in (out / "targets.md").read_text()
