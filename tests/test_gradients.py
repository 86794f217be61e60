"""Central finite-difference checks (float64) of every gradient the kernels return."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.testing import gradcheck

from conftest import make_inputs, random_mask


def check_s(x, **kw):
    return gradcheck(
        ff.flex_s_attention, ff.flex_s_attention_backward,
        (x["q"], x["k"], x["v"], x["omega"]), names=("q", "k", "v", "omega"), kwargs=kw,
        rtol=1e-6,
    )


def check_n(x, **kw):
    return gradcheck(
        ff.flex_n_attention, ff.flex_n_attention_backward,
        (x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"]),
        names=("q", "k", "v", "omega1", "omega2", "tau"), kwargs=kw, rtol=1e-6,
    )


@pytest.mark.parametrize("check", [check_s, check_n], ids=["flex_s", "flex_n"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_gradients_small(check, causal, masked, threads):
    x = make_inputs(B=2, H=2, Nq=9, d=3, e=2, m=4, seed=20)
    mask = random_mask(2, 9, seed=21) if masked else None
    report = check(x, causal=causal, key_mask=mask)
    assert max(report.values()) <= 1e-6


@pytest.mark.parametrize("check", [check_s, check_n], ids=["flex_s", "flex_n"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_gradients_across_causal_chunks(check, masked):
    # N = 70 > FF_BLOCK = 64: the inter-chunk prefix state and the reverse suffix state
    # both carry gradient; the mask leaves a whole stretch of early rows without keys.
    x = make_inputs(B=1, H=1, Nq=70, d=2, e=2, m=3, seed=22)
    mask = None
    if masked:
        mask = random_mask(1, 70, seed=23)
        mask[0, :5] = False
    check(x, causal=True, key_mask=mask)


@pytest.mark.parametrize("check", [check_s, check_n], ids=["flex_s", "flex_n"])
def test_gradients_unequal_lengths(check):
    check(make_inputs(B=1, H=2, Nq=5, Nk=68, d=2, e=3, m=3, seed=24))
    check(make_inputs(B=1, H=2, Nq=67, Nk=4, d=2, e=3, m=3, seed=25))


def guard_inputs(dtype=np.float64):
    """One head, m = 1, d = 1, w = 1: f(q).f(k) = cos(q - k), negative when |q - k| ~ pi."""
    q = np.array([0.1, 0.2, 3.3, 0.4, 3.0, 0.25], dtype=dtype).reshape(1, 1, 6, 1)
    k = np.array([0.0, 0.3, 0.15, 0.35, 0.05, 0.2], dtype=dtype).reshape(1, 1, 6, 1)
    v = np.linspace(-1, 1, 12, dtype=dtype).reshape(1, 1, 6, 2)
    omega = np.ones((1, 1, 1), dtype=dtype)
    return q, k, v, omega


@pytest.mark.parametrize("causal", [False, True])
def test_guard_is_counted_finite_and_differentiable(causal):
    q, k, v, omega = guard_inputs()
    out, count = ff.flex_s_attention(q, k, v, omega, causal=causal, return_guard_count=True)
    assert count[0, 0] >= 1 and np.isfinite(out).all()
    _, count_at_eps = ff.flex_s_attention(q, k, v, omega, causal=causal, eps=0.05, return_guard_count=True)
    assert count_at_eps[0, 0] >= 1  # the gradient check below runs through guarded rows
    np.testing.assert_allclose(
        out, ff.reference.flex_s_attention(q, k, v, omega, causal=causal), rtol=1e-12)
    gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, (q, k, v, omega),
              names=("q", "k", "v", "omega"), kwargs={"causal": causal, "eps": 0.05})


@pytest.mark.parametrize("causal", [False, True])
def test_float32_gradients_track_float64(causal):
    x64 = make_inputs(B=1, H=2, Nq=100, d=8, e=4, m=8, seed=26)
    x32 = {key: val.astype(np.float32) for key, val in x64.items()}
    dout = np.random.default_rng(27).standard_normal((1, 2, 100, 4))
    args = ("q", "k", "v", "omega1", "omega2", "tau")
    g64 = ff.flex_n_attention_backward(dout, *(x64[a] for a in args), causal=causal)
    g32 = ff.flex_n_attention_backward(dout.astype(np.float32), *(x32[a] for a in args), causal=causal)
    for name, a, b in zip(("dq", "dk", "dv", "domega1", "domega2", "dtau"), g64, g32):
        assert b.dtype == np.float32, name
        assert np.max(np.abs(a - b)) <= 1e-3 * np.max(np.abs(a)), name


def test_masked_keys_get_zero_gradient():
    x = make_inputs(B=2, H=2, Nq=80, seed=28)
    mask = random_mask(2, 80, seed=29)
    dout = np.ones((2, 2, 80, 4))
    for causal in (False, True):
        _, dk, dv, *_ = ff.flex_n_attention_backward(
            dout, x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"],
            causal=causal, key_mask=mask)
        hidden = ~mask[:, None, :, None]
        assert not np.any(dk * hidden) and not np.any(dv * hidden)
        assert np.any(dk) and np.any(dv)


@pytest.mark.parametrize("check", [check_s, check_n], ids=["flex_s", "flex_n"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_gradients_single_head_split_over_threads(check, causal, threads):
    # B*H = 1 < 2 threads: the sequence is cut into segments (prefix and suffix states
    # combined across segments); N = 140 gives three chunks.
    x = make_inputs(B=1, H=1, Nq=140, d=2, e=2, m=2, seed=30)
    mask = random_mask(1, 140, seed=31)
    mask[0, :70] = False  # the first segment has no visible key at all
    check(x, causal=causal, key_mask=mask)
    check(x, causal=causal)
