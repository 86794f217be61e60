"""The Long Range Arena analogues added beside ListOps, Fashion-MNIST and text-cls:
retrieval (two byte windows, same book or not) with its two-tower model, and Pathfinder
through the training loop (the generator itself: tests/test_pathfinder.py)."""
import json
import os

import numpy as np
import pytest

import flexformer as ff
from flexformer.data import TextRetrieval
from flexformer.nn import TwoTowerClassifier
from flexformer.testing import check_cross_entropy_gradients
from flexformer.training import TrainConfig, load_model, train

AUSTEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "austen")
needs_austen = pytest.mark.skipif(not os.path.isdir(AUSTEN), reason="needs ../shared/data/austen")


@needs_austen
def test_retrieval_pairs_come_from_the_books_they_claim():
    data = TextRetrieval(AUSTEN, seq_len=64)
    books = data._books
    ids, mask, labels = data.batch(np.random.default_rng(0), 64)
    assert ids.shape == (64, 2, 64) and mask.all() and set(labels) == {0, 1}
    for split, parts in (("train", books.train), ("test", books.test)):
        ids, _, labels = data.batch(np.random.default_rng(1), 32, split)
        for pair, label in zip(ids, labels):
            # an independent search: which book holds each window (and no other book does)
            where = []
            for window in pair:
                needle = window.astype(np.uint8).tobytes()
                hits = [i for i, part in enumerate(parts) if needle in part.tobytes()]
                assert len(hits) == 1
                where.append(hits[0])
            assert (where[0] == where[1]) == bool(label)


@pytest.mark.parametrize("kind", ["flex_n", "softmax", "taylor"])
def test_two_tower_gradients(kind):
    rng = np.random.default_rng(0)
    ids = rng.integers(7, size=(2, 2, 9))
    mask = np.ones((2, 2, 9), bool)
    mask[1, 0, 6:] = False
    mask[0, 1, 4:] = False
    model = TwoTowerClassifier(7, 2, dim=8, depth=1, heads=2, max_len=9, attention=kind, num_features=4, rng=1,
                               dtype=np.float64)
    report = check_cross_entropy_gradients(model, (ids, mask), np.array([1, 0]))
    assert any(name.startswith("mix.") for name in report) and any(name.startswith("head.") for name in report)


@pytest.mark.parametrize("kind", ["flex_n", "softmax"])
def test_cosine_head_gradients_on_designated_and_on_all_pairs(kind):
    """The cosine head's gradients by finite differences, on the designated pairs
    (forward) and on every pair of a batch of windows with class-balanced weights (the
    loop's all-pairs loss), with masks."""
    from flexformer.nn import cross_entropy
    from flexformer.testing import check_model_gradients

    rng = np.random.default_rng(0)
    ids = rng.integers(7, size=(2, 2, 9))
    mask = np.ones((2, 2, 9), bool)
    mask[1, 0, 6:] = False
    model = TwoTowerClassifier(7, 2, dim=8, depth=1, heads=2, max_len=9, attention=kind, num_features=4, rng=1,
                               head="cosine", dtype=np.float64)
    model.scale.value[...] = [3.0, 0.5]
    report = check_cross_entropy_gradients(model, (ids, mask), np.array([1, 0]))
    assert "scale" in report and "head.W" in report and not any(name.startswith("mix.") for name in report)

    windows, wmask = ids.reshape(4, 9), mask.reshape(4, 9)
    first, second = np.triu_indices(4, 1)
    labels = np.array([1, 0, 0, 0, 1, 0])
    weights = np.where(labels == 1, 1 / 2, 1 / 4)

    def loss_and_backward():
        model.zero_grad()
        loss, dlogits = cross_entropy(model.forward_pairs(windows, wmask, first, second), labels, weights)
        model.backward(dlogits)
        return loss

    check_model_gradients(loss_and_backward, model.named_parameters())


def test_cosine_head_scores_a_pair_by_the_cosine_of_its_projections():
    """Independent twin: the same-logit is a cos(u P, v P) + b with u, v the masked means
    of the encoder's output, computed here from the backbone alone."""
    rng = np.random.default_rng(3)
    ids = rng.integers(7, size=(5, 9))
    mask = rng.random((5, 9)) > 0.3
    mask[:, 0] = True
    model = TwoTowerClassifier(7, 2, dim=8, depth=1, heads=2, max_len=9, attention="flex_s", rng=1,
                               head="cosine", dtype=np.float64)
    first, second = np.array([0, 4, 2]), np.array([1, 1, 2])
    logits = model.forward_pairs(ids, mask, first, second)
    h = model.backbone.forward(ids, mask)
    pooled = np.array([h[i][mask[i]].mean(0) for i in range(5)])
    z = pooled @ model.head.W.value
    cos = [z[i] @ z[j] / np.linalg.norm(z[i]) / np.linalg.norm(z[j]) for i, j in zip(first, second)]
    np.testing.assert_allclose(logits[:, 0], 0)
    np.testing.assert_allclose(logits[:, 1], 5 * np.array(cos) - 2, rtol=1e-10)
    np.testing.assert_allclose(logits[2, 1], 3, rtol=1e-12)  # a window against itself: cos = 1
    with pytest.raises(ValueError, match="head must be one of concat, cosine"):
        TwoTowerClassifier(7, 2, dim=8, depth=1, heads=2, max_len=9, head="dot")
    with pytest.raises(ValueError, match="num_classes must be 2"):
        TwoTowerClassifier(7, 3, dim=8, depth=1, heads=2, max_len=9, head="cosine")
    with pytest.raises(ValueError, match="first and second must index the 5 sequences"):
        model.forward_pairs(ids, mask, np.array([0]), np.array([5]))


def test_two_tower_encodes_each_sequence_alone():
    """Swapping the two sequences changes u and v but not the shared encoder: the pair
    features [u, v, u v, u - v] of a swapped pair are the original's with u, v exchanged."""
    rng = np.random.default_rng(2)
    ids = rng.integers(7, size=(3, 2, 9))
    model = TwoTowerClassifier(7, 2, dim=8, depth=1, heads=2, max_len=9, attention="flex_s", rng=1,
                               dtype=np.float64)
    model.forward(ids)
    u, v = model._u.copy(), model._v.copy()
    model.forward(ids[:, ::-1])
    np.testing.assert_allclose(model._u, v, rtol=1e-12)
    np.testing.assert_allclose(model._v, u, rtol=1e-12)
    with pytest.raises(ValueError, match=r"ids must have shape \(B, 2, N\)"):
        model.forward(ids[:, 0])


@needs_austen
def test_retrieval_and_pathfinder_train_resume_and_load(tmp_path):
    for task, extra in (("retrieval", dict(data_dir=AUSTEN, seq_len=64)), ("pathfinder", dict(seq_len=256))):
        cfg = TrainConfig(task=task, attention="flex_n", dim=16, depth=1, heads=2, steps=6, batch_size=4,
                          eval_batches=2, checkpoint_every=3, **extra)
        out = tmp_path / task
        metrics = train(cfg, str(out), progress=False)
        assert 0 <= metrics["eval_accuracy"] <= 1 and np.isfinite(metrics["train_loss"])
        model, saved, _ = load_model(str(out))
        assert saved.task == task
        with open(out / "metrics.json") as fh:
            assert json.load(fh)["task"] == task


def test_pathfinder_needs_a_square_sequence_length():
    with pytest.raises(ValueError, match=r"--seq-len must be size\^2 with size >= 16"):
        TrainConfig(task="pathfinder", seq_len=128).validate()
    TrainConfig(task="pathfinder", seq_len=1024).validate()


def test_retrieval_needs_a_data_folder(tmp_path):
    with pytest.raises(ValueError, match="task retrieval reads plain-text files: pass --data-dir"):
        train(TrainConfig(task="retrieval", steps=1), str(tmp_path / "r"), progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextRetrieval(str(tmp_path / "missing"))


def _tiny_fmnist(folder):
    """Fashion-MNIST-shaped IDX files with random pixels (the suite's image task reads them)."""
    import struct
    rng = np.random.default_rng(0)
    folder.mkdir()
    for prefix, n in (("train", 64), ("t10k", 32)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">HBB", 0, 8, 3)
                                                            + struct.pack(">III", n, 28, 28) + images.tobytes())
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", n)
                                                            + labels.tobytes())
    return folder


@needs_austen
def test_lra_suite_writes_one_table_and_resumes_without_repeating(tmp_path):
    import subprocess
    import sys
    fm = _tiny_fmnist(tmp_path / "fm")
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "flexformer", "compare", "--suite", "lra", "--quick", "--attentions", "elu",
           "--seeds", "1", "--data-dir", AUSTEN, "--fmnist-dir", str(fm), "--out", str(out),
           "--steps", "2", "--eval-batches", "1", "--dim", "16", "--heads", "2", "--depth", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    rows = [line for line in first.stdout.splitlines() if line.startswith("| elu |")]
    assert len(rows) == 1 and rows[0].count("±") == 5
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == sorted(f"{t}-elu-seed0" for t in ("listops", "text", "retrieval", "image", "pathfinder"))
    stamp = {r: (out / r / "metrics.json").stat().st_mtime_ns for r in runs}
    (out / "pathfinder-elu-seed0" / "metrics.json").unlink()  # as if stopped during that run
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    for r in runs:
        same = (out / r / "metrics.json").stat().st_mtime_ns == stamp[r]
        assert same == (r != "pathfinder-elu-seed0"), r  # only the unfinished run ran again
    assert [line for line in second.stdout.splitlines() if line.startswith("| elu |")] == rows


@needs_austen
def test_lra_suite_interrupted_keeps_finished_runs_and_continues_the_stopped_one(tmp_path):
    import json
    import signal
    import subprocess
    import sys
    import time
    fm = _tiny_fmnist(tmp_path / "fm")
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "flexformer", "compare", "--suite", "lra", "--quick", "--attentions", "elu",
           "--seeds", "2", "--jobs", "2", "--data-dir", AUSTEN, "--fmnist-dir", str(fm), "--out", str(out),
           "--steps", "100000", "--eval-batches", "1", "--dim", "8", "--heads", "1", "--depth", "1",
           "--batch-size", "2"]
    # SIGINT at its default in the suite whatever pytest inherited (a shell's background job
    # starts with SIGINT ignored, and an ignored signal stays ignored across exec)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ckpt = out / "listops-elu-seed0" / "checkpoint.npz"
    deadline = time.time() + 300
    while not ckpt.exists() and time.time() < deadline:  # the first checkpoint: step 100
        time.sleep(0.2)
    assert ckpt.exists()
    proc.send_signal(signal.SIGINT)  # the suite alone: it must pass the interrupt on to its runs
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "resumes" in stderr and "| elu |" not in stdout
    stopped = {seed: json.loads((out / f"listops-elu-seed{seed}" / "metrics.json").read_text()) for seed in (0, 1)}
    assert all(m["interrupted"] for m in stopped.values()) and stopped[0]["steps"] >= 100
    # the same command continues the stopped runs from their checkpoints (to a short total here)
    total = max(m["steps"] for m in stopped.values()) + 2
    again = [str(total) if a == "100000" else a for a in cmd]
    resumed = subprocess.run(again, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert len([line for line in resumed.stdout.splitlines() if line.startswith("| elu |")]) == 1
    for seed in (0, 1):
        final = json.loads((out / f"listops-elu-seed{seed}" / "metrics.json").read_text())
        assert not final["interrupted"] and final["steps"] == total and "eval_accuracy" in final


def test_a_second_suite_on_the_same_folder_is_refused(tmp_path, capsys):
    import fcntl
    from flexformer.__main__ import main
    fm = _tiny_fmnist(tmp_path / "fm")
    out = tmp_path / "suite"
    out.mkdir()
    with open(out / ".suite-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running suite holds it
        code = main(["compare", "--suite", "lra", "--quick", "--data-dir", str(tmp_path), "--fmnist-dir", str(fm),
                     "--out", str(out)])
    assert code == 2 and "another suite is running" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [".suite-lock"]  # nothing started


def test_suite_bad_input():
    from flexformer.__main__ import main
    assert main(["compare", "--suite", "lrb"]) == 2
    assert main(["compare", "--suite", "lra", "--data-dir", "/no/such/folder"]) == 2
    assert main(["compare", "--quick"]) == 2
    assert main(["compare", "--jobs", "2"]) == 2
    assert main(["compare", "--suite", "lra", "--jobs", "0", "--data-dir", AUSTEN]) == 2


@needs_austen
def test_lra_suite_runs_only_the_columns_asked_for(tmp_path):
    """--columns Retrieval,listops: those two columns (by column or task name), in the suite's
    order, and no Fashion-MNIST folder needed when the image task is not asked for."""
    import subprocess
    import sys
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "flexformer", "compare", "--suite", "lra", "--quick", "--attentions", "elu",
           "--seeds", "1", "--data-dir", AUSTEN, "--fmnist-dir", str(tmp_path / "no-fmnist"), "--out", str(out),
           "--columns", "Retrieval,listops", "--steps", "2", "--eval-batches", "1", "--dim", "16", "--heads", "2",
           "--depth", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    header = [line for line in done.stdout.splitlines() if line.startswith("| kind |")]
    assert header and header[0].startswith("| kind | ListOps | Retrieval | average |")
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["listops-elu-seed0", "retrieval-elu-seed0"]


def test_suite_tasks_bad_input(capsys):
    from flexformer.__main__ import main
    from flexformer.suite import LRA_TASKS, select_columns
    assert main(["compare", "--suite", "lra", "--columns", "Retrival", "--data-dir", AUSTEN]) == 2
    assert "--columns: unknown column(s) Retrival; choose from ListOps, Text, Retrieval, Image, Pathfinder" \
        in capsys.readouterr().err
    assert main(["compare", "--columns", "Retrieval"]) == 2
    assert "--columns belongs to --suite runs" in capsys.readouterr().err
    assert [t[0] for t in select_columns(LRA_TASKS, ["pathfinder", "TEXT", "text-cls"])] == ["Text", "Pathfinder"]
