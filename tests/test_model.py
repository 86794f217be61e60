"""Model layers, the training loop, checkpoints and the command line."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import flexformer as ff
from flexformer.nn import CausalLM, EncoderClassifier
from flexformer.testing import check_cross_entropy_gradients
from flexformer.training import TrainConfig, load_checkpoint, train

AUSTEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "austen")


def tiny_inputs(B=2, N=9, vocab=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(vocab, size=(B, N))
    mask = np.ones((B, N), bool)
    mask[1, 6:] = False
    return ids, mask


@pytest.mark.parametrize("kind", ff.attention_kinds())
def test_whole_classifier_gradients(kind):
    ids, mask = tiny_inputs()
    sharing = "key-value" if kind == "linformer" else "none"
    model = EncoderClassifier(7, 3, dim=8, depth=2, heads=2, max_len=9, attention=kind, num_features=4,
                              linformer_sharing=sharing, rng=1, dtype=np.float64)
    report = check_cross_entropy_gradients(model, (ids, mask), np.array([1, 2]))
    assert len(report) >= 20  # every layer kind took part


@pytest.mark.parametrize("kind", [k for k in ff.attention_kinds() if ff.get_attention(k).causal])
def test_whole_language_model_gradients(kind):
    ids, _ = tiny_inputs(vocab=11)
    model = CausalLM(11, dim=8, depth=1, heads=2, max_len=9, attention=kind, num_features=4,
                     positional="sinusoidal", rng=2, dtype=np.float64)
    check_cross_entropy_gradients(model, (ids[:, :-1],), ids[:, 1:])


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value", "layerwise"])
def test_linformer_sharing_modes(sharing):
    model = EncoderClassifier(7, 3, dim=8, depth=2, heads=2, max_len=9, attention="linformer", num_features=4,
                              linformer_sharing=sharing, rng=3, dtype=np.float64)
    names = [n for n in model.parameters() if ".attn.attn." in n]
    expected = {"none": 4, "headwise": 4, "key-value": 2, "layerwise": 1}[sharing]
    assert len(names) == expected, names
    shapes = {model.parameters()[n].shape for n in names}
    assert shapes == ({(2, 4, 9)} if sharing == "none" else {(4, 9)})
    ids, mask = tiny_inputs()
    check_cross_entropy_gradients(model, (ids, mask), np.array([0, 2]))


def small_config(tmp_path, **kw):
    base = dict(task="listops", attention="flex_n", dim=16, depth=1, heads=2, seq_len=32, steps=20,
                batch_size=8, warmup=4, eval_batches=2, checkpoint_every=5, threads=1, lr=3e-3)
    base.update(kw)
    return TrainConfig(**base)


def test_loss_falls(tmp_path):
    # One run's trajectory is chaotic (a rounding change in a kernel moves its final loss by
    # 0.1-0.15), so this averages three seeds. Measured over seeds 0-2: eval loss 2.33-2.38
    # after one step, 2.00-2.22 after 150 (mean fall 0.24); train loss falls 0.07-0.21.
    kw = dict(dim=32, batch_size=16, warmup=10, eval_batches=8)
    eval_fall, train_fall = [], []
    for seed in range(3):
        metrics = train(small_config(tmp_path, steps=150, seed=seed, **kw), str(tmp_path / f"run{seed}"),
                        progress=False)
        first = train(small_config(tmp_path, steps=1, seed=seed, **kw), str(tmp_path / f"one{seed}"),
                      progress=False)
        eval_fall.append(first["eval_loss"] - metrics["eval_loss"])
        train_fall.append(first["train_loss"] - metrics["train_loss"])
    assert np.mean(eval_fall) > 0.12, eval_fall
    assert np.mean(train_fall) > 0.06, train_fall
    for key in ("task", "attention", "steps", "train_loss", "eval_loss", "eval_accuracy", "tokens_per_s",
                "wall_s", "params"):
        assert key in metrics
    saved = json.load(open(tmp_path / "run0" / "metrics.json"))
    assert saved["steps"] == 150 and 0 <= saved["eval_accuracy"] <= 1


def test_resume_gives_the_same_parameters(tmp_path):
    full = tmp_path / "full"
    train(small_config(tmp_path, steps=20), str(full), progress=False)
    part = tmp_path / "part"
    stopped = train(small_config(tmp_path, steps=20), str(part), progress=False, stop_at=7)
    assert stopped["interrupted"] and stopped["steps"] == 7
    train(small_config(tmp_path, steps=20), str(part), resume=True, progress=False)
    a, _, meta_a = load_checkpoint(str(full / "checkpoint.npz"))
    b, _, meta_b = load_checkpoint(str(part / "checkpoint.npz"))
    assert meta_a["step"] == meta_b["step"] == 20
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_learning_curve_in_evals_jsonl_leaves_the_run_unchanged(tmp_path):
    plain = train(small_config(tmp_path, steps=9), str(tmp_path / "plain"), progress=False)
    curve = train(small_config(tmp_path, steps=9, eval_every=4), str(tmp_path / "curve"), progress=False)
    assert curve["eval_loss"] == plain["eval_loss"]  # evaluating draws from no training stream
    rows = [json.loads(line) for line in open(tmp_path / "curve" / "evals.jsonl")]
    assert [r["step"] for r in rows] == [0, 4, 8, 9]
    assert rows[-1]["eval_loss"] == curve["eval_loss"] and rows[-1]["train_seconds"] == round(curve["train_seconds"], 3)
    seconds = [r["train_seconds"] for r in rows]
    assert seconds[0] < seconds[1] < seconds[2] < seconds[3] <= curve["wall_s"]
    # the loss at step 0 is the untrained model's: about ln(vocabulary) for a uniform guess
    assert rows[0]["eval_loss"] > rows[-1]["eval_loss"]
    assert not (tmp_path / "plain" / "evals.jsonl").exists()
    # resumed, the curve goes on where it stopped and its clock carries over
    part = tmp_path / "part"
    train(small_config(tmp_path, steps=9, eval_every=4), str(part), progress=False, stop_at=5)
    first = [json.loads(line) for line in open(part / "evals.jsonl")]
    resumed = train(None, str(part), resume=True, progress=False)
    rows = [json.loads(line) for line in open(part / "evals.jsonl")]
    assert [r["step"] for r in rows] == [0, 4, 8, 9] and rows[:2] == first
    assert rows[2]["train_seconds"] > rows[1]["train_seconds"]
    assert resumed["eval_loss"] == curve["eval_loss"] == rows[-1]["eval_loss"]


def test_corrupted_checkpoint_is_a_clear_error(tmp_path):
    run = tmp_path / "run"
    train(small_config(tmp_path, steps=5), str(run), progress=False)
    path = run / "checkpoint.npz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable flexformer checkpoint"):
        load_checkpoint(str(path))
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable flexformer checkpoint"):
        train(small_config(tmp_path, steps=10), str(run), resume=True, progress=False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_loss_stops_and_keeps_the_last_checkpoint(tmp_path):
    # an absurd learning rate makes the parameters explode after the first update
    run = tmp_path / "run"
    cfg = small_config(tmp_path, steps=40, lr=1e30, warmup=0, checkpoint_every=1)
    with pytest.raises(FloatingPointError, match="stopped with the last good checkpoint kept"):
        train(cfg, str(run), progress=False)
    params, _, meta = load_checkpoint(str(run / "checkpoint.npz"))
    assert 1 <= meta["step"] < 40
    assert all(np.isfinite(v).all() for v in params.values())


def test_bad_task_attention_and_data(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'cifar'; choose one of: listops"):
        train(small_config(tmp_path, task="cifar"), str(tmp_path / "a"), progress=False)
    with pytest.raises(ValueError, match="choose one of: elu, flex_n"):
        train(small_config(tmp_path, attention="flash"), str(tmp_path / "b"), progress=False)
    with pytest.raises(FileNotFoundError, match="/no/such/folder.*dataset-fashion-mnist"):
        train(small_config(tmp_path, task="fmnist", data_dir="/no/such/folder"), str(tmp_path / "c"), progress=False)
    with pytest.raises(FileNotFoundError, match="/no/such/text"):
        train(small_config(tmp_path, task="text-lm", data_dir="/no/such/text"), str(tmp_path / "d"), progress=False)
    texts = tmp_path / "texts"
    texts.mkdir()
    for name in ("a.txt", "b.txt"):
        (texts / name).write_text("It is a truth universally acknowledged. " * 50)
    with pytest.raises(ValueError, match="has no causal mode"):
        train(small_config(tmp_path, task="text-lm", attention="linformer", data_dir=str(texts)),
              str(tmp_path / "e"), progress=False)
    with pytest.raises(FileNotFoundError, match="at least two .txt files"):
        (texts / "b.txt").unlink()
        train(small_config(tmp_path, task="text-cls", data_dir=str(texts)), str(tmp_path / "f"), progress=False)


def write_idx(path, array):
    import gzip
    import struct
    with gzip.open(path, "wb") as fh:
        fh.write(struct.pack(">HBB", 0, 8, array.ndim))
        fh.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        fh.write(array.astype(np.uint8).tobytes())


def test_fmnist_loader_and_training_on_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 64), ("t10k", 32)):
        labels = rng.integers(10, size=n)
        images = (labels[:, None, None] * 25 + rng.integers(0, 5, (n, 28, 28))).astype(np.uint8)
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
    data = ff.data.FashionMNIST(str(tmp_path))
    ids, mask, labels = data.batch(np.random.default_rng(1), 4)
    assert ids.shape == (4, 784) and mask.all() and labels.shape == (4,)
    metrics = train(small_config(tmp_path, task="fmnist", data_dir=str(tmp_path), steps=3, dim=8, heads=2),
                    str(tmp_path / "run"), progress=False)
    assert "eval_accuracy" in metrics
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        ff.data.FashionMNIST(str(tmp_path))


def test_fmnist_loader_names_a_broken_file(tmp_path):
    """Broken IDX files are one ValueError naming the file or folder (a short header was
    struct.error, a gzip one BadGzipFile, and labels of another count were taken)."""
    import gzip
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 6)

    def folder_with(name, image_bytes=None, label_array=labels, image_array=images):
        folder = tmp_path / name
        folder.mkdir()
        for prefix in ("train", "t10k"):
            images_path = folder / f"{prefix}-images-idx3-ubyte"
            if image_bytes is None:
                write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", image_array)
            else:
                images_path.write_bytes(image_bytes)
            write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", label_array)
        return str(folder)

    header = b"\x00\x00\x08\x03"
    for name, kwargs, message in (
            ("short", dict(image_bytes=header[:3]), r"train-images-idx3-ubyte cannot be read: not an IDX file"),
            ("dims", dict(image_bytes=header + b"\x00\x00"), r"cannot be read: IDX file is truncated: its header names 3"),
            ("body", dict(image_bytes=header + np.array([6, 28, 28], ">u4").tobytes() + bytes(10)),
             r"IDX file is truncated: 10 bytes for shape \(6, 28, 28\)"),
            ("count", dict(label_array=labels[:5]), r"labels in .* must be one per image \(6\), got shape \(5,\)"),
            ("label", dict(label_array=np.full(6, 12)), r"labels in .* must lie in 0\.\.9, got 12"),
            ("size", dict(image_array=images[:, :14, :14]), r"images in .* must be n x 28 x 28, got \(6, 14, 14\)")):
        with pytest.raises(ValueError, match=message):
            ff.data.fmnist.load(folder_with(name, **kwargs))
    bad_gzip = tmp_path / "gz"
    bad_gzip.mkdir()
    (bad_gzip / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz cannot be read: Not a gzipped file"):
        ff.data.fmnist.load(str(bad_gzip))
    with gzip.open(bad_gzip / "train-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(header + np.array([6, 28, 28], ">u4").tobytes() + images.tobytes())
    raw = (bad_gzip / "train-images-idx3-ubyte.gz").read_bytes()
    (bad_gzip / "train-images-idx3-ubyte.gz").write_bytes(raw[:len(raw) // 2])  # cut mid-stream
    with pytest.raises(ValueError, match="cannot be read"):
        ff.data.fmnist.load(str(bad_gzip))


@pytest.mark.skipif(not os.path.isdir(AUSTEN), reason="shared Austen data not present")
def test_text_tasks_on_austen(tmp_path):
    lm = train(small_config(tmp_path, task="text-lm", data_dir=AUSTEN, steps=30, seq_len=64),
               str(tmp_path / "lm"), progress=False)
    assert 0 < lm["eval_bits_per_char"] < 8.5
    cls = train(small_config(tmp_path, task="text-cls", data_dir=AUSTEN, steps=5, seq_len=64),
                str(tmp_path / "cls"), progress=False)
    assert 0 <= cls["eval_accuracy"] <= 1


def test_listops_generator():
    data = ff.data.ListOps(64)
    rng = np.random.default_rng(0)
    ids, mask, labels = data.batch(rng, 32)
    assert ids.shape == (32, 64) and (mask == (ids != 0)).all() and labels.max() <= 9
    from flexformer.data.listops import evaluate
    assert evaluate(("[MAX", [2, 9, ("[MIN", [4, 7]), 0])) == 9
    assert evaluate(("[MED", [3, 1, 4, 1])) == 1  # lower median
    assert evaluate(("[SM", [7, 8, ("[MAX", [1, 5])])) == 0


def _two_texts(folder):
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("It is a truth universally acknowledged. " * 50)
    return str(folder)


DATA_CASES = [
    # (what is called, given a folder of two texts; exception; the message in full)
    (lambda t: ff.data.ListOps(seq_len=4), ValueError, "seq_len must be an int >= 8, got 4"),
    (lambda t: ff.data.ListOps(seq_len=16, min_len=32), ValueError, "min_len must be at most seq_len = 16, got 32"),
    (lambda t: ff.data.ListOps(max_depth=0), ValueError, "max_depth must be an int >= 1, got 0"),
    (lambda t: ff.data.ListOps(max_args=1), ValueError, "max_args must be an int >= 2, got 1"),
    (lambda t: ff.data.ListOps().batch(0, -1), ValueError, "batch_size must be an int >= 0, got -1"),
    (lambda t: ff.data.ListOps().batch("seed", 2), TypeError, "rng must be None, an int seed or a numpy Generator, got str"),
    (lambda t: ff.data.TextLM(t, seq_len=0), ValueError, "seq_len must be an int >= 1, got 0"),
    (lambda t: ff.data.TextLM(t, seq_len=16).batch(0, 2, split="valid"), ValueError,
     "split must be 'train' or 'test', got 'valid'"),
    (lambda t: ff.data.TextClassification(t, seq_len=16, holdout=1.5), ValueError,
     "holdout must be a fraction between 0 and 1 (exclusive), got 1.5"),
    (lambda t: ff.data.TextRetrieval(t, seq_len=16, holdout=0), ValueError,
     "holdout must be a fraction between 0 and 1 (exclusive), got 0"),
    (lambda t: ff.data.TextLM(os.path.join(t, "a.txt")), FileNotFoundError,
     None),  # the message: below
    (lambda t: ff.data.Pathfinder(16).batch(0, 2, split="dev"), ValueError, "split must be 'train' or 'test', got 'dev'"),
]


@pytest.mark.parametrize("call,exc,message", DATA_CASES, ids=[str(i) for i in range(len(DATA_CASES))])
def test_data_loaders_name_the_bad_argument(tmp_path, call, exc, message):
    texts = _two_texts(tmp_path / "texts")
    with pytest.raises(exc) as err:
        call(texts)
    if message is None:
        message = (f"text folder {os.path.join(texts, 'a.txt')} is a file, not a folder: pass --data-dir with "
                   f"plain-text (.txt) files, e.g. ../shared/data/austen")
    assert str(err.value) == message


def test_data_loaders_take_a_seed_as_the_generator_it_seeds(tmp_path):
    texts = _two_texts(tmp_path / "texts")
    for data in (ff.data.ListOps(32), ff.data.TextLM(texts, seq_len=16), ff.data.TextClassification(texts, seq_len=16)):
        for a, b in zip(data.batch(5, 3), data.batch(np.random.default_rng(5), 3)):
            np.testing.assert_array_equal(a, b)


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "flexformer", *args], capture_output=True, text=True, **kw)


def test_cli_help_and_short_run(tmp_path):
    out = run_cli("train", "--help")
    assert out.returncode == 0 and "--attention" in out.stdout and "--resume" in out.stdout
    out = run_cli("train", "--steps", "20", "--seq-len", "32", "--dim", "16", "--batch-size", "4",
                  "--eval-batches", "1", "--out", str(tmp_path / "run"), "--threads", "1")
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["attention"] == "flex_n" and metrics["task"] == "listops"
    assert "tok/s" in out.stderr  # the progress bar
    bad = run_cli("train", "--attention", "flash", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "choose one of" in bad.stderr


def test_ctrl_c_writes_a_checkpoint_and_resume_finishes(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "flexformer", "train", "--steps", "100000", "--seq-len", "32",
                             "--dim", "16", "--batch-size", "4", "--eval-batches", "1", "--checkpoint-every",
                             "100000", "--out", str(run), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.5)
        if proc.poll() is not None:
            break
        if (run / "checkpoint.npz").exists() or time.time() > deadline - 55:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    _, _, meta = load_checkpoint(str(run / "checkpoint.npz"))
    assert meta["step"] >= 1
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["interrupted"] and metrics["steps"] == meta["step"]
    done = run_cli("train", "--resume", str(run), "--steps", str(meta["step"] + 3))
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "metrics.json").read_text())["steps"] == meta["step"] + 3
