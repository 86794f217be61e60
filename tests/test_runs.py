"""Run folders, checkpoints and resume under a hostile user: nothing lost, nothing silent.
Each refusal is one error line (exit 2) that names the argument."""
import json
import os
import stat
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import flexformer as ff
from flexformer.training import TrainConfig, load_checkpoint, load_model, train
from flexformer.training import checkpoint as ckpt_mod

TINY = ["--steps", "3", "--seq-len", "32", "--dim", "16", "--heads", "2", "--depth", "1", "--batch-size", "4",
        "--eval-batches", "1", "--threads", "1", "--quiet"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "flexformer", *args], capture_output=True, text=True,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


def one_error_line(done):
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.strip().splitlines() if not ln.startswith("flexformer train:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def small(**kw):
    base = dict(task="listops", dim=16, depth=1, heads=2, seq_len=32, steps=4, batch_size=4, eval_batches=1,
                threads=1, checkpoint_every=2)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "done"
    done = cli("train", *TINY, "--out", str(run))
    assert done.returncode == 0, done.stderr
    return run


def test_a_finished_run_is_never_overwritten(finished, tmp_path):
    before = {f: (finished / f).read_bytes() for f in ("checkpoint.npz", "metrics.json")}
    line = one_error_line(cli("train", *TINY, "--task", "listops", "--out", str(finished)))
    assert "already holds a run" in line and "--resume" in line and "--overwrite" in line
    assert {f: (finished / f).read_bytes() for f in before} == before
    # --overwrite replaces it, on purpose
    copy = tmp_path / "copy"
    copy.mkdir()
    for f, data in before.items():
        (copy / f).write_bytes(data)
    done = cli("train", *TINY, "--seed", "5", "--out", str(copy), "--overwrite")
    assert done.returncode == 0, done.stderr
    assert json.loads((copy / "metrics.json").read_text())["seed"] == 5
    # an empty folder (e.g. from mkdtemp) is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("train", *TINY, "--out", str(empty)).returncode == 0


def test_resume_of_a_finished_run_keeps_its_metrics(finished):
    metrics = (finished / "metrics.json").read_bytes()
    line = one_error_line(cli("train", "--resume", str(finished)))
    assert "is finished (3 of 3 steps)" in line and "--steps" in line
    assert (finished / "metrics.json").read_bytes() == metrics


def test_resume_refuses_contradicting_flags(finished):
    line = one_error_line(cli("train", "--resume", str(finished), "--steps", "5", "--attention", "softmax"))
    assert "--attention softmax" in line and "'flex_n'" in line
    line = one_error_line(cli("train", "--resume", str(finished), "--steps", "5", "--task=text-lm"))
    assert "--task text-lm" in line and "'listops'" in line
    line = one_error_line(cli("train", "--resume", str(finished), "--steps", "5", "--lr", "0.5"))
    assert "--lr 0.5" in line


def test_tau_start_flags(tmp_path, finished):
    """flex_n's tau start: fixed by default, --kernel-init-matched-tau saved as such, the two
    flags exclusive, and a resumed run keeps the start it was trained with."""
    saved = ckpt_mod.load_meta(str(finished / "checkpoint.npz"))["config"]
    assert saved["kernel_init_match_tau"] is False
    matched = tmp_path / "matched"
    done = cli("train", *TINY, "--kernel-init-matched-tau", "--out", str(matched))
    assert done.returncode == 0, done.stderr
    assert json.loads((matched / "metrics.json").read_text())["config"]["kernel_init_match_tau"] is True
    both = cli("train", *TINY, "--kernel-init-fixed-tau", "--kernel-init-matched-tau")
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert "not allowed with argument" in both.stderr.strip().splitlines()[-1]
    line = one_error_line(cli("train", "--resume", str(matched), "--steps", "5", "--kernel-init-fixed-tau"))
    assert "--kernel-init-fixed-tau" in line and "kernel_init_match_tau True" in line


def test_resume_with_matching_flags_and_a_new_total(tmp_path, finished):
    run = tmp_path / "more"
    run.mkdir()
    for f in ("checkpoint.npz", "metrics.json"):
        (run / f).write_bytes((finished / f).read_bytes())
    done = cli("train", "--resume", str(run), "--steps", "5", "--dim", "16", "--threads", "2", "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "metrics.json").read_text())["steps"] == 5


@pytest.mark.parametrize("args, words", [
    (["--steps", "0"], "steps must be >= 1, got 0"),
    (["--checkpoint-every", "0"], "checkpoint_every must be >= 1"),
    (["--weight-decay", "nan"], "weight_decay must be a finite number"),
    (["--warmup", "-1"], "warmup must be >= 0"),
    (["--lr", "inf"], "lr must be a finite number"),
])
def test_bad_training_options_are_one_line(tmp_path, args, words):
    out = tmp_path / "run"
    line = one_error_line(cli("train", *TINY, *args, "--out", str(out)))
    assert words in line
    assert not out.exists()  # and no empty run folder is left behind


@pytest.mark.parametrize("over, exc, message", [
    ({"steps": 1.5}, TypeError, "steps must be an int, got 1.5"),
    ({"batch_size": True}, TypeError, "batch_size must be an int, got True"),
    ({"seed": "a"}, TypeError, "seed must be an int, got 'a'"),
    ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
    ({"threads": -1}, ValueError, "threads must be 0 (OpenMP's default) or 1..4096, got -1"),
    ({"qk_norm": 2}, TypeError, "qk_norm must be a bool, got 2"),
    ({"attention_eps": "x"}, TypeError, "attention_eps must be a number or None, got 'x'"),
    ({"num_features": 2.0}, TypeError, "num_features must be an int or None, got 2.0"),
    ({"data_dir": 3}, TypeError, "data_dir must be a string or None, got 3"),
    ({"dtype": np.float32}, TypeError, "dtype must be a string, got <class 'numpy.float32'>"),
])
def test_a_configuration_of_the_wrong_type_is_refused_by_name(tmp_path, over, exc, message):
    """In Python, where argparse's types do not stand guard (they were NumPy's messages,
    Python's comparison errors, or a run that trained on a float step count)."""
    cfg = TrainConfig(**{"task": "listops", "steps": 1, "seq_len": 16, "batch_size": 2, "eval_batches": 1,
                         "dim": 8, "heads": 2, "depth": 1, **over})
    with pytest.raises(exc) as err:
        train(cfg, str(tmp_path / "run"), progress=False)
    assert str(err.value) == message
    assert not (tmp_path / "run").exists()


def test_a_path_for_the_data_folder_is_kept_as_a_string():
    import pathlib
    cfg = TrainConfig(task="text-lm", data_dir=pathlib.Path("/some/folder"))
    assert cfg.data_dir == "/some/folder" and isinstance(cfg.data_dir, str)
    cfg.validate()


def test_compare_refuses_train_arguments_that_every_run_would_refuse_before_starting_any():
    import time
    t0 = time.perf_counter()
    line = one_error_line(cli("compare", "--kinds", "flex_n"))  # a typo of --attentions
    assert line == ("error: unrecognized arguments: --kinds flex_n (compare passes the arguments it does not "
                    "take to every train run, and train does not take these either)")
    # it ran ten kinds x three seeds, each failing alike, before saying so
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("command", [["demo"], ["generate", "--checkpoint", "x", "--prompt", "a"], ["train"]])
def test_threads_out_of_range_name_the_option(command):
    assert one_error_line(cli(*command, "--threads", "99999")) == \
        "error: --threads must be 0 (OpenMP's default) or 1..4096, got 99999"


def test_compare_refuses_the_train_options_it_sets_for_each_run():
    from flexformer.__main__ import build_parser, check_train_args
    train_parser = build_parser().train_parser
    for given in (["--out", "x"], ["--resume", "x"], ["--quiet"]):
        with pytest.raises(ValueError, match=f"{given[0]} cannot go to the train runs: compare sets them"):
            check_train_args(train_parser, ["--steps", "5"] + given)
    check_train_args(train_parser, ["--steps", "5", "--task", "listops"])


@pytest.mark.parametrize("given, message", [
    (["--seed", "3"], "--seed cannot go to the train runs"),            # was taken as compare's --seeds
    (["--attention", "flex_n"], "--attention cannot go to the train runs"),  # was compare's --attentions
    (["--att", "flex_n"], "unrecognized arguments: --att flex_n"),
])
def test_compare_takes_no_abbreviations(given, message):
    """An abbreviated or near-miss option is not taken for another: argparse's prefix
    matching read --seed 3 as compare's --seeds 3 (the later --seeds won, silently) and
    --att as --attentions."""
    budget = [a for a in TINY if a != "--quiet"]  # compare sets --quiet itself
    line = one_error_line(cli("compare", *given, "--attentions", "elu", "--seeds", "1", *budget))
    assert message in line


def test_train_takes_no_abbreviations():
    done = cli("train", "--step", "1")
    assert done.returncode == 2 and "error: unrecognized arguments: --step 1" in done.stderr


def test_run_folder_problems_are_found_before_training(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "is a file, not a folder" in one_error_line(cli("train", *TINY, "--out", str(afile)))
    line = one_error_line(cli("train", *TINY, "--out", str(afile / "run")))  # a folder inside a file
    assert "cannot write to the run folder" in line
    missing = tmp_path / "nothing"
    assert "no checkpoint.npz" in one_error_line(cli("train", "--resume", str(missing)))
    assert not missing.exists()


def test_a_non_finite_update_is_never_checkpointed(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FloatingPointError, match="last good checkpoint kept"):
        with np.errstate(all="ignore"):
            train(small(steps=30, lr=1e38, warmup=0, checkpoint_every=1), str(run), progress=False)
    if (run / "checkpoint.npz").exists():
        params, _, _ = load_checkpoint(str(run / "checkpoint.npz"))
        assert all(np.isfinite(v).all() for v in params.values())


def test_stale_temporaries_are_removed_and_modes_agree(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".checkpoint-abc123.tmp").write_bytes(b"half a checkpoint")
    train(small(), str(run), progress=False)
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]
    mode = lambda f: stat.S_IMODE(os.stat(run / f).st_mode)  # noqa: E731
    assert mode("checkpoint.npz") == mode("metrics.json")


# ------------------------------------------------------------ untrusted checkpoints

def _write_npz(path, arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _saved(run):
    with np.load(run / "checkpoint.npz") as z:
        return {k: z[k] for k in z.files}


def test_untrusted_checkpoints_are_one_error(tmp_path, finished):
    good = _saved(finished)
    meta = json.loads(str(good["meta"]))
    cases = {}
    cases["npy"] = None
    cases["list meta"] = {**good, "meta": np.array(json.dumps([1, 2]))}
    cases["dim abc"] = {**good, "meta": np.array(json.dumps({**meta, "config": {**meta["config"], "dim": "abc"}}))}
    cases["huge claim"] = {**good, "meta": np.array(json.dumps({**meta, "config": {**meta["config"], "dim": 2048,
                                                                                    "depth": 4}}))}
    cases["no step"] = {**good, "meta": np.array(json.dumps({k: v for k, v in meta.items() if k != "step"}))}
    cases["missing param"] = {k: v for k, v in good.items() if k != "param/head.b"}
    name = next(k for k in good if k.startswith("opt/m/"))
    cases["bad adam shape"] = {**good, name: np.zeros(1)}
    cases["no adam"] = {k: v for k, v in good.items() if not k.startswith("opt/m/")}
    for label, arrays in cases.items():
        run = tmp_path / label.replace(" ", "_")
        run.mkdir()
        if arrays is None:
            np.save(run / "x.npy", np.zeros(3))
            os.replace(run / "x.npy", run / "checkpoint.npz")
        else:
            _write_npz(run / "checkpoint.npz", arrays)
        for args in (["train", "--resume", str(run), "--steps", "6"],
                     ["generate", "--checkpoint", str(run), "--prompt", "a"]):
            if label in ("no step", "bad adam shape", "no adam") and args[0] == "generate":
                continue  # generate needs neither the step nor the optimiser
            done = cli(*args)
            line = one_error_line(done)
            assert str(run) in line, (label, line)


def test_an_array_header_claiming_terabytes(tmp_path, finished):
    good = _saved(finished)
    _write_npz(tmp_path / "checkpoint.npz", good)
    path = tmp_path / "checkpoint.npz"
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    target = "param/head.W.npy"
    data = members[target]
    header_end = data.index(b"\n") + 1
    header = data[:header_end].decode("latin1")
    shape = header[header.index("'shape': (") + 10: header.index(")", header.index("'shape': ("))]
    fake = header.replace(f"'shape': ({shape})", "'shape': (1099511627776,)")
    body = fake[:-1].rstrip(" ")  # the header keeps its length: the padding shrinks
    assert len(body) < len(header) - 1
    fake = body + " " * (len(header) - 1 - len(body)) + "\n"
    members[target] = fake.encode("latin1") + data[header_end:]
    with zipfile.ZipFile(path, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    with pytest.raises(ValueError, match="not a readable flexformer checkpoint"):
        load_checkpoint(str(path))


def test_generate_validates_before_printing(finished, tmp_path):
    done = cli("generate", "--checkpoint", str(finished), "--prompt", "hello", "--temperature", "-1")
    assert one_error_line(done) and done.stdout == ""
    done = cli("generate", "--checkpoint", str(finished), "--prompt", "hello", "--top-k", "0")
    assert "--top-k must be >= 1" in one_error_line(done) and done.stdout == ""
    done = cli("generate", "--checkpoint", str(finished), "--prompt", "hello", "--seed", "-1")
    assert "--seed must be >= 0, got -1" in one_error_line(done) and done.stdout == ""  # was "rng", after the prompt


def test_sampling_at_a_tiny_temperature_is_greedy():
    from flexformer.nn.models import sample_token
    logits = np.array([0.5, 2.0, 1.0, 2.0 - 1e-9])
    rng = np.random.default_rng(0)
    assert {sample_token(logits, 1e-310, None, rng) for _ in range(20)} == {1}
    assert sample_token(logits, 1e-310, 2, rng) == 1


def test_compare_with_no_seeds_or_failed_runs_is_an_error(tmp_path):
    assert "--seeds must be >= 1" in one_error_line(cli("compare", "--seeds", "0"))
    done = cli("compare", "--attentions", "flex_n", "--seeds", "1", "--task", "text-lm", "--data-dir",
               str(tmp_path / "missing"))
    assert done.returncode == 1 and "| flex_n | failed |" in done.stdout
    assert "runs failed for flex_n" in done.stderr


# ------------------------------------------------------------ finite in, finite out (or an error)

def test_the_overflow_check_sees_every_non_finite_entry_on_both_of_its_paths():
    """check_overflow asks the C finiteness pass for C-contiguous float32/float64 results and
    NumPy for any other array; each finds a single inf or NaN anywhere, and lets results
    through whose inputs were not finite."""
    from flexformer._C import all_finite
    from flexformer._checks import check_overflow
    for dtype in (np.float32, np.float64, np.float16):
        for n in (1, 31, 32, 33, 1000):
            for bad in (np.inf, -np.inf, np.nan):
                for at in sorted({0, n // 2, n - 1}):
                    x = np.ones(n, dtype)
                    x[at] = bad
                    for r in (x, np.stack([x, x], 1)[:, 0]):  # contiguous, then strided
                        took = all_finite(r)
                        assert took is (None if dtype == np.float16 or not r.flags.c_contiguous else False)
                        with pytest.raises(FloatingPointError, match="f: the result overflowed"):
                            check_overflow("f", r, (np.ones(2),), "hint")
                        check_overflow("f", r, (np.array([1.0, bad]),), "hint")  # non-finite input: passes
            assert all_finite(np.ones(n, dtype)) is (None if dtype == np.float16 else True)
    assert all_finite([1.0]) is None and all_finite(np.ones((2, 3), np.float32).T) is None


def test_overflow_with_finite_inputs_is_an_error_not_nan():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)).astype(np.float32) for _ in range(3))
    o1, o2, tau = ff.init.flex_n_params(2, 4, 4, rng=0, dtype=np.float32)
    with pytest.raises(FloatingPointError, match="flex_n_attention: the result overflowed float32"):
        ff.flex_n_attention(q, k, v, o1, o2, np.full(2, -88, np.float32))
    with pytest.raises(FloatingPointError, match="softmax_attention: the result overflowed"):
        ff.softmax_attention(q, k, v, scale=1e300)
    with pytest.raises(FloatingPointError, match="softmax_attention: the result overflowed"):
        ff.softmax_attention(q * 1e30, k * 1e30, v)
    with pytest.raises(FloatingPointError, match="flex_n_attention_backward"):
        ff.flex_n_attention_backward(v, q, k, v, o1, o2, np.full(2, -88, np.float32))
    # the same in float64 is finite, and matches the quadratic reference
    got = ff.flex_n_attention(*(a.astype(np.float64) for a in (q, k, v, o1, o2)), np.full(2, -88.0))
    assert np.isfinite(got).all()
    # NaN in an input is not an overflow: it stays in the rows it reaches
    q[0, 1, 3, 0] = np.nan
    out = ff.flex_n_attention(q, k, v, o1, o2, tau)
    assert np.isnan(out[0, 1, 3]).all() and np.isfinite(np.delete(out[0, 1], 3, axis=0)).all()


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "hedgehog", "softmax"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H", [(2, 3), (1, 1)])  # pairs owned by threads; one pair cut in segments
def test_the_kernels_report_exactly_whether_their_results_are_finite(kind, causal, B, H, threads):
    """report_finite=True appends whether every result is finite: the linear kinds check each
    pair's outputs (and the parameter gradients) inside the kernel, softmax in the glue. One
    NaN placed anywhere in an input reaches some results and not others; the flag must
    match NumPy's look at all of them, wherever the NaN lands (first or last pair, first or
    last row)."""
    from flexformer import _C
    N, d = 130, 5
    spec = ff.get_attention(kind)
    params = spec.init(H, d, num_features=4, max_len=N, rng=1, dtype=np.float32)
    names = [n for n in ("omega", "omega1", "omega2", "tau", "W") if n in params]
    P = [params[n] for n in names]
    fwd, bwd = getattr(_C, f"{kind}_forward"), getattr(_C, f"{kind}_backward")
    rng = np.random.default_rng(5)
    clean = [rng.standard_normal((B, H, N, d)).astype(np.float32) * np.float32(0.5) for _ in range(4)]
    spots = [(None, None)] + [(t, (b, h, i, c)) for t in range(4) for (b, h) in {(0, 0), (B - 1, H - 1)}
                              for i in (0, N - 1) for c in (0, d - 1)]
    for tensor, at in spots:
        q, k, v, do = (a.copy() for a in clean)
        if tensor is not None:
            (q, k, v, do)[tensor][at] = np.nan
        *out, finite = fwd(q, k, v, *P, causal=causal, report_finite=True)
        assert finite == bool(np.isfinite(out[0]).all()), (tensor, at)
        *grads, finite = bwd(do, q, k, v, *P, causal=causal, report_finite=True)
        assert finite == all(np.isfinite(g).all() for g in grads), (tensor, at)
        assert (tensor is not None) or finite
    for bad in (1, "yes"):
        with pytest.raises(TypeError, match="report_finite must be a bool"):
            fwd(*clean[:3], *P, report_finite=bad)


def test_the_short_convolution_defaults_per_task_and_a_given_or_saved_one_wins():
    from flexformer.__main__ import build_parser
    from flexformer.training.options import config_from_options
    from flexformer.training import TASK_DEFAULTS, TASKS

    assert tuple(TASK_DEFAULTS) == TASKS
    for task, defaults in TASK_DEFAULTS.items():
        assert TrainConfig(task=task).short_conv == defaults["short_conv"]
        assert config_from_options(build_parser().parse_args(["train", "--task", task])).short_conv == defaults["short_conv"]
    assert TASK_DEFAULTS["text-lm"]["short_conv"] == 4 and TASK_DEFAULTS["listops"]["short_conv"] == 0
    args = build_parser().parse_args(["train", "--task", "text-lm", "--short-conv", "0"])
    assert config_from_options(args).short_conv == 0
    # a text-lm run saved before the option existed loads as it was trained: without convolutions
    assert TrainConfig.from_saved({"task": "text-lm", "lr": 3e-3}).short_conv == 0
    for bad in (1, -2, True, 2.0):
        with pytest.raises(ValueError, match=f"short_conv must be 0 \\(off\\) or a width >= 2, got {bad!r}"):
            TrainConfig(task="text-lm", short_conv=bad).validate()


def test_the_learning_rate_defaults_per_task_and_a_given_or_saved_one_wins():
    from flexformer.__main__ import build_parser
    from flexformer.training.options import config_from_options
    from flexformer.training import TASK_DEFAULT_LR, TASKS

    assert tuple(TASK_DEFAULT_LR) == TASKS
    for task, lr in TASK_DEFAULT_LR.items():
        assert TrainConfig(task=task).lr == lr
        args = build_parser().parse_args(["train", "--task", task])
        assert config_from_options(args).lr == lr
    assert TASK_DEFAULT_LR["text-lm"] != TASK_DEFAULT_LR["listops"]  # the measured exception
    args = build_parser().parse_args(["train", "--task", "text-lm", "--lr", "1e-3"])
    assert config_from_options(args).lr == 1e-3
    # a text-lm run saved before the per-task default resumes at the rate it was trained with
    assert TrainConfig.from_saved({"task": "text-lm", "lr": 1e-3}).lr == 1e-3
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got True"):
        TrainConfig(lr=True).validate()
