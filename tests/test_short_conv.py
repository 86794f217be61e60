"""The short convolution on queries, keys and values (``short_conv``): the layer against
np.convolve, model gradients, padding, recurrent decoding, checkpoints and bad input."""
import json
import subprocess
import sys

import numpy as np
import pytest

import flexformer as ff
from flexformer import _C
from flexformer.nn import CausalLM, EncoderClassifier, ShortConv
from flexformer.nn.core import short_conv_reference
from flexformer.testing import check_cross_entropy_gradients
from flexformer.training import TrainConfig


def _moved(model, seed=0, size=0.4):
    """Move every convolution tap off its identity start, so the checks see the convolution."""
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if ".conv_" in name:
            p.value[...] += (size * rng.standard_normal(p.value.shape)).astype(p.value.dtype)
    return model


@pytest.mark.parametrize("width,N", [(2, 7), (4, 9), (6, 3), (1, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_match_np_convolve_and_the_numpy_twin(width, N, dtype, threads):
    rng = np.random.default_rng(width * 10 + N)
    w = rng.standard_normal((width, 5)).astype(dtype)
    x = rng.standard_normal((2, N, 5)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    before = (x.copy(), w.copy(), dy.copy())
    y = _C.short_conv_forward(x, w)
    dx, dw = _C.short_conv_backward(dy, x, w)
    for a, b in zip((x, w, dy), before):  # inputs not mutated
        np.testing.assert_array_equal(a, b)
    assert y.dtype == dx.dtype == dw.dtype == dtype and dw.shape == w.shape
    tol = 2e-6 if dtype == np.float32 else 1e-13
    # independent reference: the full convolution per (batch, channel), cut to the first N
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    want = np.stack([np.stack([np.convolve(x64[b, :, c], w64[:, c])[:N] for c in range(5)], -1)
                     for b in range(2)])
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)
    # the backward is the convolution's transpose: <dy, conv(x)> = <conv^T(dy), x>, and for w
    # the correlation of dy with x, both through np.correlate
    dx_want = np.stack([np.stack([np.correlate(dy64[b, :, c], w64[:, c], "full")[width - 1:width - 1 + N]
                                  for c in range(5)], -1) for b in range(2)])
    np.testing.assert_allclose(dx, dx_want, rtol=tol, atol=tol * 10)
    dw_want = np.array([[sum(np.dot(dy64[b, j:, c], x64[b, :N - j, c]) for b in range(2)) if j < N else 0.0
                         for c in range(5)] for j in range(width)])
    np.testing.assert_allclose(dw, dw_want, rtol=tol, atol=tol * 10)
    # and the NumPy twin
    ry, rdx, rdw = short_conv_reference(x64, w64, dy64)
    for got, ref in ((y, ry), (dx, rdx), (dw, rdw)):
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * 10)


def test_layer_backward_by_central_differences():
    rng = np.random.default_rng(3)
    conv = ShortConv(5, 4, dtype=np.float64)
    conv.w.value[...] = rng.standard_normal((4, 5))
    x = rng.standard_normal((2, 9, 5))
    dy = rng.standard_normal(x.shape)
    conv.forward(x)
    dx = conv.backward(dy)
    h = 1e-6
    for idx in [(0, 0, 0), (1, 8, 4), (0, 4, 2), (1, 6, 1)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        numeric = ((_C.short_conv_forward(xp, conv.w.value) - _C.short_conv_forward(xm, conv.w.value)) * dy).sum()
        assert abs(numeric / (2 * h) - dx[idx]) < 1e-7
    for j in range(4):
        w = conv.w.value.copy()
        wp, wm = w.copy(), w.copy()
        wp[j, 1] += h
        wm[j, 1] -= h
        numeric = ((_C.short_conv_forward(x, wp) - _C.short_conv_forward(x, wm)) * dy).sum() / (2 * h)
        assert abs(numeric - conv.w.grad[j, 1]) < 1e-7


def test_large_inputs_take_the_parallel_path_with_the_same_results():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 520, 230)).astype(np.float32)  # 1.08 M elements: over the threshold
    dy = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.standard_normal((4, 230)).astype(np.float32)
    before = ff.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            ff.set_num_threads(n)
            out.append((_C.short_conv_forward(x, w),) + _C.short_conv_backward(dy, x, w))
    finally:
        ff.set_num_threads(before)
    np.testing.assert_array_equal(out[0][0], out[1][0])  # sequences owned by one thread
    np.testing.assert_array_equal(out[0][1], out[1][1])
    np.testing.assert_allclose(out[0][2], out[1][2], rtol=1e-6)  # dw: partial sums in another order
    np.testing.assert_allclose(out[0][0], short_conv_reference(x.astype(np.float64), w.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)


def test_kernels_refuse_bad_arguments():
    x, w = np.zeros((2, 5, 3)), np.ones((4, 3))
    with pytest.raises(ValueError, match=r"x must be a 3-d array of shape \(B, N, C\), got 2-d"):
        _C.short_conv_forward(x[0], w)
    with pytest.raises(ValueError, match=r"w must have shape \(W, C\) with W >= 1 and x's C = 3 channels, got \(4, 2\)"):
        _C.short_conv_forward(x, w[:, :2])
    with pytest.raises(ValueError, match=r"W >= 1 .* got \(0, 3\)"):
        _C.short_conv_forward(x, w[:0])
    with pytest.raises(TypeError, match="x must have dtype float32 or float64"):
        _C.short_conv_forward(x.astype(np.int32), w)
    with pytest.raises(TypeError, match="w must have dtype float64"):
        _C.short_conv_forward(x, w.astype(np.float32))
    with pytest.raises(ValueError, match=r"dy must have x's shape \(2, 5, 3\)"):
        _C.short_conv_backward(np.zeros((2, 4, 3)), x, w)
    with pytest.raises(TypeError, match="dy must have dtype float64"):
        _C.short_conv_backward(x.astype(np.float32), x, w)
    for empty in (np.zeros((0, 5, 3)), np.zeros((2, 0, 3)), np.zeros((2, 5, 0))):
        ew = np.ones((4, empty.shape[2]))
        assert _C.short_conv_forward(empty, ew).shape == empty.shape
        dx, dw = _C.short_conv_backward(empty, empty, ew)
        assert dx.shape == empty.shape and (dw == 0).all()
    # non-contiguous and Fortran-ordered inputs are read as their values
    xs = np.random.default_rng(0).standard_normal((2, 10, 3))[:, ::2]
    np.testing.assert_allclose(_C.short_conv_forward(xs, w), short_conv_reference(xs, w), rtol=1e-13)
    np.testing.assert_allclose(_C.short_conv_forward(np.asfortranarray(xs), w), short_conv_reference(xs, w),
                               rtol=1e-13)


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

