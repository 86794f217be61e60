"""ReBased (kind "rebased") against an independent quadratic form: the attention weights
(y_q . y_k)^2, y = gamma * LN(x) + beta, formed literally and normalised; parameter
gradients by central finite differences of that form."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.registry import features, num_features

KIND = ff.get_attention("rebased")


def layer_norm_affine(x, gamma, beta):
    """gamma * (x - mean) / sqrt(var + 1e-5) + beta over the last axis; gamma, beta (H, d)."""
    centred = x - x.mean(-1, keepdims=True)
    return gamma[:, None, :] * centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) + beta[:, None, :]


def quadratic_rebased(q, k, v, p, *, causal=False, key_mask=None, eps=ff.DEFAULT_EPS):
    """out_i = sum_j w_ij v_j / sum_j w_ij with w_ij = (y_qi . y_kj)^2 over the visible keys,
    with the documented denominator guard: in units of |phi_qi| = |y_qi|^2, a row whose
    denominator is below eps * R_i, R_i = sum_j |phi_kj| over the visible keys, is divided by
    eps * R_i instead."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    gamma, beta = (np.asarray(p[n], np.float64) for n in ("gamma", "beta"))
    yq, yk = layer_norm_affine(q, gamma, beta), layer_norm_affine(k, gamma, beta)
    w = (yq @ np.swapaxes(yk, -1, -2)) ** 2
    visible = np.ones(w.shape, bool)
    if causal:
        visible &= np.tril(visible)
    if key_mask is not None:
        visible &= np.asarray(key_mask, bool)[:, None, None, :]
    w = np.where(visible, w, 0)
    norm_q = (yq * yq).sum(-1, keepdims=True)
    den = w.sum(-1, keepdims=True) / norm_q
    R = np.where(visible, (yk * yk).sum(-1)[..., None, :], 0).sum(-1, keepdims=True)
    den = np.where(den < eps * R, eps * R, den)
    return np.where(R > 0, (w @ v) / norm_q / np.where(R > 0, den, 1), 0)


def _inputs(B=2, H=3, Nq=9, Nk=9, d=5, e=4, dtype=np.float64, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((B, H, Nq, d)).astype(dtype), r.standard_normal((B, H, Nk, d)).astype(dtype),
            r.standard_normal((B, H, Nk, e)).astype(dtype))


def _params(H=3, d=5, dtype=np.float64, seed=1):
    """Away from the start (gamma = 1, beta = 0), so that every term of the map matters."""
    r = np.random.default_rng(seed)
    return {"gamma": (1 + 0.3 * r.standard_normal((H, d))).astype(dtype),
            "beta": (0.5 * r.standard_normal((H, d))).astype(dtype)}


def test_init_is_layer_norm_without_affine():
    p = KIND.init(4, 6, rng=0)
    assert set(p) == {"gamma", "beta"} and p["gamma"].shape == p["beta"].shape == (4, 6)
    np.testing.assert_array_equal(p["gamma"], 1)
    np.testing.assert_array_equal(p["beta"], 0)
    assert KIND.learnable == ("gamma", "beta") and KIND.layouts == ("(H, d)", "(H, d)")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [2, 3, 8, 16])
def test_forward_matches_the_quadratic_form(causal, d):
    q, k, v = _inputs(d=d, Nq=40, Nk=40)
    p = _params(d=d)
    mask = np.random.default_rng(1).random((2, 40)) > 0.3
    for key_mask in (None, mask):
        out = KIND.forward(q, k, v, p, causal=causal, key_mask=key_mask)
        np.testing.assert_allclose(out, quadratic_rebased(q, k, v, p, causal=causal, key_mask=key_mask),
                                   rtol=1e-10, atol=1e-12)


def test_float32_and_more_keys_than_queries():
    q, k, v = _inputs(Nq=7, Nk=33, d=16, dtype=np.float32)
    p = _params(d=16, dtype=np.float32)
    out = KIND.forward(q, k, v, p)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, quadratic_rebased(q, k, v, p), rtol=2e-4, atol=2e-5)


def test_a_row_with_no_features_adds_nothing():
    """beta = 0 and a constant key row: LN gives 0, so y = 0 and phi = 0; that key gets no
    weight, as (y_q . 0)^2 = 0 in the quadratic form, and its gradients are zero."""
    q, k, v = _inputs(B=1, H=1, Nq=5, Nk=6, d=4)
    k[0, 0, 2] = 0.7
    p = {"gamma": np.full((1, 4), 1.3), "beta": np.zeros((1, 4))}
    out = KIND.forward(q, k, v, p)
    np.testing.assert_allclose(out, quadratic_rebased(q, k, v, p), rtol=1e-10, atol=1e-12)
    _, dk, _, _ = KIND.backward(np.ones_like(out), q, k, v, p)
    assert np.all(dk[0, 0, 2] == 0) and np.all(np.isfinite(dk))


@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_finite_differences_of_the_quadratic_form(causal):
    q, k, v = _inputs(B=1, H=2, Nq=6, Nk=6, d=3, e=2, seed=5)
    p = _params(H=2, d=3)
    mask = np.array([[True, True, False, True, True, True]])
    g = np.random.default_rng(6).standard_normal((1, 2, 6, 2))
    dq, dk, dv, dparams = KIND.backward(g, q, k, v, p, causal=causal, key_mask=mask)
    inputs = {"q": q, "k": k, "v": v, **p}

    def loss(arrays):
        return float((quadratic_rebased(arrays["q"], arrays["k"], arrays["v"], arrays, causal=causal,
                                        key_mask=mask) * g).sum())

    h = 1e-6
    for name, grad in (("q", dq), ("k", dk), ("v", dv), ("gamma", dparams["gamma"]), ("beta", dparams["beta"])):
        fd = np.zeros_like(inputs[name])
        for idx in np.ndindex(fd.shape):
            plus, minus = dict(inputs), dict(inputs)
            plus[name], minus[name] = inputs[name].copy(), inputs[name].copy()
            plus[name][idx] += h
            minus[name][idx] -= h
            fd[idx] = (loss(plus) - loss(minus)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8, err_msg=name)
    assert np.all(dk[0, :, 2] == 0) and np.all(dv[0, :, 2] == 0)  # the masked key


def test_feature_twin_gives_the_kernel_its_size_and_its_parameter_gradient():
    q, k, _ = _inputs(d=6)
    p = _params(d=6)
    fq, sq = features("rebased", q, p)
    fk, sk = features("rebased", k, p)
    assert fq.shape[-1] == num_features("rebased", p, 6) == 36
    np.testing.assert_allclose(np.linalg.norm(fq, axis=-1), 1, rtol=1e-12)
    w = (fq @ np.swapaxes(fk, -1, -2)) * np.exp(sq[..., None] + sk[..., None, :])
    want = (layer_norm_affine(q, p["gamma"], p["beta"]) @ np.swapaxes(layer_norm_affine(k, p["gamma"], p["beta"]),
                                                                     -1, -2)) ** 2
    np.testing.assert_allclose(w, want, rtol=1e-10, atol=1e-12)
    # the twin's parameter gradient against finite differences of sum(df * f + ds * s)
    r = np.random.default_rng(3)
    df, ds = r.standard_normal(fq.shape), r.standard_normal(sq.shape)
    grads = KIND.feature_grad(q, p, df, ds)
    h = 1e-6
    for name in ("gamma", "beta"):
        fd = np.zeros_like(p[name])
        for idx in np.ndindex(fd.shape):
            plus, minus = {n: a.copy() for n, a in p.items()}, {n: a.copy() for n, a in p.items()}
            plus[name][idx] += h
            minus[name][idx] -= h
            fp, sp = features("rebased", q, plus)
            fm, sm = features("rebased", q, minus)
            fd[idx] = ((df * (fp - fm)).sum() + (ds * (sp - sm)).sum()) / (2 * h)
        np.testing.assert_allclose(grads[name], fd, rtol=1e-6, atol=1e-8, err_msg=name)


def test_key_state_round_trip_is_bit_exact():
    q, k, v = _inputs(Nq=20, Nk=20, d=4)
    p = _params(d=4)
    g = np.random.default_rng(2).standard_normal((2, 3, 20, 4))
    out, state = KIND.forward(q, k, v, p, return_key_state=True)
    assert state.shape == (2, 3, 96)  # F e + F + 2 = 82 for F = 16, e = 4, zero-padded to a multiple of 16
    assert not state[..., 82:].any()
    with_state = KIND.backward(g, q, k, v, p, key_state=state)
    without = KIND.backward(g, q, k, v, p)
    for a, b in zip(with_state[:3], without[:3]):
        np.testing.assert_array_equal(a, b)
    for name in ("gamma", "beta"):
        np.testing.assert_array_equal(with_state[3][name], without[3][name])


def test_bad_inputs_name_the_argument():
    q, k, v = _inputs()
    p = _params()
    with pytest.raises(ValueError, match="gamma"):
        KIND.forward(q, k, v, {"gamma": p["gamma"][:, :2], "beta": p["beta"]})
    with pytest.raises(ValueError, match="beta"):
        KIND.forward(q, k, v, {"gamma": p["gamma"], "beta": p["beta"][:2]})
    with pytest.raises(ValueError, match="params for rebased must hold gamma, beta; missing beta"):
        KIND.forward(q, k, v, {"gamma": p["gamma"]})
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        KIND.forward(q, k[:, :, :4], v[:, :, :4], p, causal=True)
    with pytest.raises(TypeError, match="float32 or float64"):
        KIND.forward(q.astype(np.float16), k, v, p)


def test_rows_on_the_guard_follow_the_documented_rule():
    """(y_q . y_k)^2 can be near zero for every visible key (the first causal rows): those
    rows are counted and divided by eps * R_i, and no other row is."""
    q, k, v = _inputs(Nq=40, Nk=40, d=3)
    p = _params(d=3)
    out, guard = KIND.forward(q, k, v, p, causal=True, return_guard_count=True)
    assert guard.sum() > 0
    np.testing.assert_allclose(out, quadratic_rebased(q, k, v, p, causal=True), rtol=1e-10, atol=1e-12)
    unguarded = quadratic_rebased(q, k, v, p, causal=True, eps=0.0)
    differs = ~np.isclose(out, unguarded, rtol=1e-9, atol=0).all(-1)
    np.testing.assert_array_equal(differs.sum(-1), guard)
