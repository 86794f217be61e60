"""The short convolution on queries, keys and values (``short_conv``): the layer against
np.convolve, model gradients, padding, recurrent decoding, checkpoints and bad input."""
import json
import subprocess
import sys

import numpy as np
import pytest

from flexformer.nn import CausalLM, EncoderClassifier, ShortConv
from flexformer.testing import check_cross_entropy_gradients
from flexformer.training import TrainConfig


def _moved(model, seed=0, size=0.4):
    """Move every convolution tap off its identity start, so the checks see the convolution."""
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if ".conv_" in name:
            p.value[...] += (size * rng.standard_normal(p.value.shape)).astype(p.value.dtype)
    return model


@pytest.mark.parametrize("width,N", [(2, 7), (4, 9), (6, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_matches_np_convolve_and_its_gradient(width, N, dtype):
    rng = np.random.default_rng(width * 10 + N)
    conv = ShortConv(5, width, dtype=dtype)
    conv.w.value[...] = rng.standard_normal((width, 5))
    x = rng.standard_normal((2, N, 5)).astype(dtype)
    x_before = x.copy()
    y = conv.forward(x)
    # independent reference: the full convolution per (batch, channel), cut to the first N
    want = np.stack([np.stack([np.convolve(x[b, :, c].astype(np.float64), conv.w.value[:, c])[:N]
                               for c in range(5)], -1) for b in range(2)])
    np.testing.assert_allclose(y, want, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-6)
    np.testing.assert_array_equal(x, x_before)  # input not mutated
    # backward against central differences (float64 only)
    if dtype == np.float64:
        dy = rng.standard_normal(y.shape)
        conv.w.grad[...] = 0
        dx = conv.backward(dy)
        h = 1e-6
        for idx in [(0, 0, 0), (1, N - 1, 4), (0, N // 2, 2)]:
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            numeric = ((conv._apply(xp) - conv._apply(xm)) * dy).sum() / (2 * h)
            assert abs(numeric - dx[idx]) < 1e-7
        for j in range(width):
            wp = conv.w.value.copy()
            conv.w.value[j, 1] += h
            up = (conv._apply(x) * dy).sum()
            conv.w.value[j, 1] -= 2 * h
            down = (conv._apply(x) * dy).sum()
            conv.w.value[...] = wp
            assert abs((up - down) / (2 * h) - conv.w.grad[j, 1]) < 1e-7


def test_layer_continues_a_sequence_from_its_tail():
    rng = np.random.default_rng(1)
    conv = ShortConv(3, 4, dtype=np.float64)
    conv.w.value[...] = rng.standard_normal((4, 3))
    x = rng.standard_normal((2, 10, 3))
    full = conv.forward(x)
    tail = np.zeros((2, 3, 3))
    parts = []
    for a, b in ((0, 1), (1, 2), (2, 6), (6, 10)):
        parts.append(conv.forward(x[:, a:b], tail))
        tail = conv.next_tail(x[:, a:b], tail)
    np.testing.assert_allclose(np.concatenate(parts, 1), full, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "softmax", "performer", "linformer"])
def test_classifier_gradients_with_padding(kind):
    rng = np.random.default_rng(0)
    ids = rng.integers(7, size=(2, 9))
    mask = np.ones((2, 9), bool)
    mask[1, 6:] = False
    model = _moved(EncoderClassifier(7, 3, dim=8, depth=2, heads=2, max_len=9, attention=kind, num_features=4,
                                     short_conv=3, eps=1e-3 if kind != "softmax" and kind != "linformer" else None,
                                     rng=1, dtype=np.float64))
    report = check_cross_entropy_gradients(model, (ids, mask), np.array([1, 2]))
    for name in ("conv_q", "conv_k", "conv_v"):
        assert f"backbone.blocks.1.attn.{name}.w" in report
    # padded positions enter the window as zeros: changing the padded tokens changes nothing
    other = ids.copy()
    other[1, 6:] = (other[1, 6:] + 3) % 7
    np.testing.assert_array_equal(model.forward(ids, mask), model.forward(other, mask))


@pytest.mark.parametrize("kind", ["flex_n", "softmax"])
def test_language_model_gradients_and_identity_start(kind):
    rng = np.random.default_rng(2)
    ids = rng.integers(11, size=(2, 8))
    common = dict(dim=8, depth=2, heads=2, max_len=8, attention=kind, num_features=4, rng=4, dtype=np.float64)
    plain = CausalLM(11, **common)
    model = CausalLM(11, short_conv=4, **common)
    # the identity start: the same function as the model without the option
    np.testing.assert_array_equal(model.forward(ids), plain.forward(ids))
    _moved(model, 3)
    check_cross_entropy_gradients(model, (ids,), rng.integers(11, size=(2, 8)))
    # causal: the logits of position t do not depend on later tokens
    later = ids.copy()
    later[:, 5:] = (later[:, 5:] + 1) % 11
    np.testing.assert_array_equal(model.forward(ids)[:, :5], model.forward(later)[:, :5])


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "softmax"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_decoding_matches_the_parallel_model(kind, dtype, tol):
    model = _moved(CausalLM(11, dim=16, depth=2, heads=2, max_len=32, attention=kind, short_conv=4,
                            positional="sinusoidal", rng=3, dtype=dtype), 5)
    ids = np.random.default_rng(1).integers(11, size=(2, 20))
    full = model.forward(ids)
    for prompt in (1, 2, 12):  # prompts shorter and longer than the window
        logits, cache = model.prefill(ids[:, :prompt])
        snapshot = cache.copy()
        steps, t = [logits], prompt
        while t < 20:  # one and several tokens per step
            n = 1 if t % 2 else min(3, 20 - t)
            steps.append(model.step(ids[:, t:t + n], cache))
            t += n
        np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=tol, atol=tol)
        assert cache.states[0].tokens == 20 and snapshot.states[0].tokens == prompt
        if kind != "softmax":  # a constant-size state (softmax keeps its keys and values)
            assert cache.nbytes == snapshot.nbytes > 0
        # the copy is independent: continuing it gives the same next logits as the original did
        np.testing.assert_allclose(model.step(ids[:, prompt:prompt + 1], snapshot), full[:, prompt:prompt + 1],
                                   rtol=tol, atol=tol)
    text = model.generate(ids[0, :5], 6, temperature=0)
    assert text.shape == (6,)


def test_a_layer_with_convolutions_refuses_a_plain_state():
    plain = CausalLM(11, dim=8, depth=1, heads=2, max_len=16, attention="flex_n", rng=0)
    conv = CausalLM(11, dim=8, depth=1, heads=2, max_len=16, attention="flex_n", short_conv=2, rng=0)
    _, cache = plain.prefill(np.zeros((1, 3), int))
    with pytest.raises(TypeError, match="ConvDecodeState"):
        conv.step(np.zeros((1, 1), int), cache)


@pytest.mark.parametrize("bad", [1, -1, 2.5, True, "4"])
def test_bad_width_is_refused(bad):
    with pytest.raises((ValueError, TypeError), match="short_conv|width"):
        EncoderClassifier(7, 3, dim=8, depth=1, heads=2, max_len=9, short_conv=bad)
    if not isinstance(bad, (str, float, bool)):
        with pytest.raises(ValueError, match="short_conv must be 0"):
            TrainConfig(short_conv=bad).validate()


def test_command_line_trains_resumes_and_refuses_bad_width(tmp_path):
    run = tmp_path / "run"
    base = [sys.executable, "-m", "flexformer", "train", "--steps", "3", "--dim", "16", "--seq-len", "32",
            "--batch-size", "4", "--eval-batches", "1", "--quiet", "--short-conv", "3", "--out", str(run)]
    proc = subprocess.run(base, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["config"]["short_conv"] == 3
    with np.load(run / "checkpoint.npz") as ck:
        assert any(".conv_k.w" in name for name in ck.files)
    resumed = subprocess.run([sys.executable, "-m", "flexformer", "train", "--resume", str(run), "--steps", "4",
                              "--quiet"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    clash = subprocess.run([sys.executable, "-m", "flexformer", "train", "--resume", str(run), "--steps", "5",
                            "--short-conv", "2", "--quiet"], capture_output=True, text=True)
    assert clash.returncode != 0 and "short-conv" in clash.stderr
    bad = subprocess.run([sys.executable, "-m", "flexformer", "train", "--short-conv", "1", "--out",
                          str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 2 and "short_conv must be 0 (off) or a width >= 2, got 1" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 2

