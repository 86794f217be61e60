"""Based's Taylor kernel (kind "taylor") against an independent quadratic form: the
attention weights 1 + t + t^2/2, t = q.k / sqrt d, formed literally and normalised."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.registry import features, num_features

KIND = ff.get_attention("taylor")


def quadratic_taylor(q, k, v, *, causal=False, key_mask=None):
    """out_i = sum_j w_ij v_j / sum_j w_ij with w_ij = 1 + t + t^2/2 over the visible keys."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    t = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    w = 1 + t + 0.5 * t * t
    if causal:
        w = np.tril(w)
    if key_mask is not None:
        w = w * np.asarray(key_mask, bool)[:, None, None, :]
    den = w.sum(-1, keepdims=True)
    return np.where(den > 0, (w @ v) / np.where(den > 0, den, 1), 0)


def _inputs(B=2, H=3, Nq=9, Nk=9, d=5, e=4, dtype=np.float64, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((B, H, Nq, d)).astype(dtype), r.standard_normal((B, H, Nk, d)).astype(dtype),
            r.standard_normal((B, H, Nk, e)).astype(dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [1, 3, 8, 16])
def test_forward_matches_the_quadratic_form(causal, d):
    q, k, v = _inputs(d=d, Nq=40, Nk=40)
    mask = np.random.default_rng(1).random((2, 40)) > 0.3
    for key_mask in (None, mask):
        out = KIND.forward(q, k, v, {}, causal=causal, key_mask=key_mask)
        np.testing.assert_allclose(out, quadratic_taylor(q, k, v, causal=causal, key_mask=key_mask),
                                   rtol=1e-11, atol=1e-12)


def test_float32_and_more_keys_than_queries():
    q, k, v = _inputs(Nq=7, Nk=33, d=16, dtype=np.float32)
    out = KIND.forward(q, k, v, {})
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, quadratic_taylor(q, k, v), rtol=2e-5, atol=2e-6)


def test_the_kernel_is_positive_so_no_row_reaches_the_guard():
    q, k, v = _inputs(Nq=64, Nk=64, d=8, seed=3)
    q, k = 4 * q, 4 * k  # large |t|: 1 + t + t^2/2 >= 1/2 still
    for causal in (False, True):
        _, guard = KIND.forward(q, k, v, {}, causal=causal, return_guard_count=True)
        assert guard.sum() == 0


@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_finite_differences_of_the_quadratic_form(causal):
    q, k, v = _inputs(B=1, H=2, Nq=6, Nk=6, d=3, e=2, seed=5)
    mask = np.array([[True, True, False, True, True, True]])
    g = np.random.default_rng(6).standard_normal((1, 2, 6, 2))
    dq, dk, dv, dparams = KIND.backward(g, q, k, v, {}, causal=causal, key_mask=mask)
    assert dparams == {}

    def loss(q_, k_, v_):
        return float((quadratic_taylor(q_, k_, v_, causal=causal, key_mask=mask) * g).sum())

    h = 1e-6
    for name, x, grad in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            args_p = {"q": q, "k": k, "v": v, name: xp}
            args_m = {"q": q, "k": k, "v": v, name: xm}
            fd[idx] = (loss(**{a + "_": b for a, b in args_p.items()})
                       - loss(**{a + "_": b for a, b in args_m.items()})) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8, err_msg=name)
    assert np.all(dk[0, :, 2] == 0) and np.all(dv[0, :, 2] == 0)  # the masked key


def test_feature_twin_gives_the_kernel_and_its_size():
    q, k, _ = _inputs(d=6)
    fq, sq = features("taylor", q, {})
    fk, sk = features("taylor", k, {})
    assert fq.shape[-1] == num_features("taylor", {}, 6) == 1 + 6 + 36
    np.testing.assert_allclose(np.linalg.norm(fq, axis=-1), 1, rtol=1e-12)
    w = (fq @ np.swapaxes(fk, -1, -2)) * np.exp(sq[..., None] + sk[..., None, :])
    t = q @ np.swapaxes(k, -1, -2) / np.sqrt(6)
    np.testing.assert_allclose(w, 1 + t + t * t / 2, rtol=1e-12)


def test_key_state_round_trip_is_bit_exact():
    q, k, v = _inputs(Nq=20, Nk=20, d=4)
    g = np.random.default_rng(2).standard_normal((2, 3, 20, 4))
    out, state = KIND.forward(q, k, v, {}, return_key_state=True)
    assert state.shape == (2, 3, 112)  # F e + F + 2 = 107 for F = 1 + 4 + 16, e = 4, zero-padded to a multiple of 16
    assert not state[..., 107:].any()
    with_state = KIND.backward(g, q, k, v, {}, key_state=state)
    without = KIND.backward(g, q, k, v, {})
    for a, b in zip(with_state[:3], without[:3]):
        np.testing.assert_array_equal(a, b)


def test_bad_inputs_name_the_argument():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="q must have a head size d >= 1"):
        KIND.forward(q[..., :0], k[..., :0], v, {})
    with pytest.raises(ValueError, match="k"):
        KIND.forward(q, k[..., :2], v, {})
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        KIND.forward(q, k[:, :, :4], v[:, :, :4], {}, causal=True)
    with pytest.raises(TypeError, match="float32 or float64"):
        KIND.forward(q.astype(np.float16), k, v, {})
    with pytest.raises(ValueError, match="eps"):
        KIND.forward(q, k, v, {}, eps=0.0)
