"""The comparison family: parity with quadratic references, gradients, masks, errors."""
import numpy as np
import pytest

import flexformer as ff
from flexformer import reference as ref
from flexformer.testing import gradcheck

from conftest import random_mask


def inputs(B=2, H=3, Nq=150, Nk=None, d=6, e=4, dtype=np.float64, seed=0, scale=0.5):
    Nk = Nq if Nk is None else Nk
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, H, Nq, d)) * scale).astype(dtype)
    k = (rng.standard_normal((B, H, Nk, d)) * scale).astype(dtype)
    v = rng.standard_normal((B, H, Nk, e)).astype(dtype)
    return q, k, v


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def performer_params(H, d, m=8, dtype=np.float64, seed=1):
    return (ff.init.performer_omega(H, m, d, rng=seed, dtype=dtype),)


def hedgehog_params(H, d, m=5, dtype=np.float64, seed=1):
    return (ff.init.hedgehog_weights(H, d, m, rng=seed, dtype=dtype),)


# name, C forward, C backward, reference, parameter maker (H, d, dtype) -> tuple
LINEAR_KINDS = {
    "performer": (ff.performer_attention, ff.performer_attention_backward, ref.performer_attention,
                  lambda H, d, dt: performer_params(H, d, dtype=dt)),
    "hedgehog": (ff.hedgehog_attention, ff.hedgehog_attention_backward, ref.hedgehog_attention,
                 lambda H, d, dt: hedgehog_params(H, d, dtype=dt)),
}


def rel_err(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


@pytest.mark.parametrize("kind", sorted(LINEAR_KINDS))
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["f64", "f32"])
def test_feature_kinds_match_reference(kind, causal, masked, dtype, tol):
    fwd, _, reference, make = LINEAR_KINDS[kind]
    q, k, v = inputs(dtype=dtype, seed=2)
    params = make(3, 6, dtype)
    mask = random_mask(2, 150) if masked else None
    got = fwd(q, k, v, *params, causal=causal, key_mask=mask)
    assert got.dtype == dtype
    assert rel_err(got, reference(q, k, v, *params, causal=causal, key_mask=mask)) <= tol


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["f64", "f32"])
def test_generic_core_matches_reference(causal, masked, dtype, tol):
    q, k, v = inputs(dtype=dtype, seed=3)
    pq, pk = elu1(q).astype(dtype), elu1(k).astype(dtype) * 1e3  # scale does not matter
    mask = random_mask(2, 150) if masked else None
    got = ff.linear_attention(pq, pk, v, causal=causal, key_mask=mask)
    assert rel_err(got, ref.linear_attention(pq, pk, v, causal=causal, key_mask=mask)) <= tol


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["f64", "f32"])
def test_softmax_matches_reference(causal, masked, dtype, tol, threads):
    q, k, v = inputs(dtype=dtype, seed=4, scale=1.0)
    mask = random_mask(2, 150) if masked else None
    got = ff.softmax_attention(q, k, v, causal=causal, key_mask=mask)
    assert rel_err(got, ref.softmax_attention(q, k, v, causal=causal, key_mask=mask)) <= tol
    got = ff.softmax_attention(q, k, v, causal=causal, key_mask=mask, scale=0.3)
    assert rel_err(got, ref.softmax_attention(q, k, v, causal=causal, key_mask=mask, scale=0.3)) <= tol


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["f64", "f32"])
def test_linformer_matches_reference(per_head, masked, dtype, tol):
    q, k, v = inputs(Nq=90, Nk=130, dtype=dtype, seed=5)
    H = 3 if per_head else None
    E = ff.init.linformer_projections(16, 200, H, rng=1, dtype=dtype)
    F = ff.init.linformer_projections(16, 200, H, rng=2, dtype=dtype)
    mask = random_mask(2, 130) if masked else None
    got = ff.linformer_attention(q, k, v, E, F, key_mask=mask)
    assert rel_err(got, ref.linformer_attention(q, k, v, E, F, key_mask=mask)) <= tol


@pytest.mark.parametrize("Nq,Nk", [(5, 70), (70, 3), (1, 1)])
def test_unequal_lengths(Nq, Nk):
    q, k, v = inputs(B=1, H=2, Nq=Nq, Nk=Nk, seed=6)
    np.testing.assert_allclose(ff.softmax_attention(q, k, v), ref.softmax_attention(q, k, v), rtol=1e-10)
    (W,) = hedgehog_params(2, 6)
    np.testing.assert_allclose(ff.hedgehog_attention(q, k, v, W), ref.hedgehog_attention(q, k, v, W), rtol=1e-10)


# ----------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_gradients_feature_kinds(causal, masked, threads):
    q, k, v = inputs(B=2, H=2, Nq=70, d=3, e=2, seed=7)
    mask = random_mask(2, 70, seed=8) if masked else None
    kw = dict(causal=causal, key_mask=mask)
    (omega,) = performer_params(2, 3, m=4)
    gradcheck(lambda q, k, v: ff.performer_attention(q, k, v, omega, **kw),
              lambda do, q, k, v: ff.performer_attention_backward(do, q, k, v, omega, **kw),
              (q, k, v), names=("q", "k", "v"))
    (W,) = hedgehog_params(2, 3, m=4)
    gradcheck(ff.hedgehog_attention, ff.hedgehog_attention_backward, (q, k, v, W),
              names=("q", "k", "v", "W"), kwargs=kw)
    pq, pk = elu1(q), elu1(k)
    gradcheck(ff.linear_attention, ff.linear_attention_backward, (pq, pk, v),
              names=("phi_q", "phi_k", "v"), kwargs=kw)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_gradients_softmax(causal, masked, threads):
    q, k, v = inputs(B=2, H=2, Nq=70, d=3, e=2, seed=9, scale=1.0)
    mask = random_mask(2, 70, seed=10) if masked else None
    gradcheck(ff.softmax_attention, ff.softmax_attention_backward, (q, k, v), names=("q", "k", "v"),
              kwargs=dict(causal=causal, key_mask=mask))
    gradcheck(ff.softmax_attention, ff.softmax_attention_backward, (q, k, v), names=("q", "k", "v"),
              kwargs=dict(causal=causal, key_mask=mask, scale=0.7))


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("kp", [4, 3])  # 3: each thread's workspace is padded to a whole line
def test_gradients_linformer(per_head, masked, kp, threads):
    q, k, v = inputs(B=2, H=2, Nq=10, Nk=70, d=3, e=2, seed=11)
    H = 2 if per_head else None
    E = ff.init.linformer_projections(kp, 80, H, rng=12)
    F = ff.init.linformer_projections(kp, 80, H, rng=13)
    mask = random_mask(2, 70, seed=14) if masked else None
    gradcheck(ff.linformer_attention, ff.linformer_attention_backward, (q, k, v, E, F),
              names=("q", "k", "v", "E", "F"), kwargs=dict(key_mask=mask))
    _, _, _, dE, dF = ff.linformer_attention_backward(np.ones((2, 2, 10, 2)), q, k, v, E, F, key_mask=mask)
    assert not dE[..., 70:].any() and not dF[..., 70:].any()  # columns past Nk are unused
    if masked:
        hidden = ~mask.any(0)  # keys masked in every batch element
        assert not dE[..., :70][..., hidden].any()


def test_linformer_key_value_sharing_sums_gradients():
    q, k, v = inputs(B=1, H=2, Nq=6, Nk=20, d=3, e=3, seed=15)
    P = ff.init.linformer_projections(4, 20, rng=16)

    def shared(q, k, v, P):
        return ff.linformer_attention(q, k, v, P, P)

    def shared_backward(do, q, k, v, P):
        dq, dk, dv, dE, dF = ff.linformer_attention_backward(do, q, k, v, P, P)
        return dq, dk, dv, dE + dF

    gradcheck(shared, shared_backward, (q, k, v, P), names=("q", "k", "v", "P"))


def test_linformer_refuses_causal():
    q, k, v = inputs(B=1, H=1, Nq=8, seed=17)
    E = ff.init.linformer_projections(4, 8, rng=1)
    with pytest.raises(ValueError, match="future keys"):
        ff.linformer_attention(q, k, v, E, E, causal=True)
    with pytest.raises(ValueError, match="future keys"):
        ff.linformer_attention_backward(np.ones((1, 1, 8, 4)), q, k, v, E, E, causal=True)
    assert not ff.get_attention("linformer").causal


def test_softmax_long_sequence_without_quadratic_buffer():
    # N = 16384: an (N, N) float64 matrix alone would be 2 GiB; peak memory of a fresh
    # process must stay far below that.
    import subprocess
    import sys
    code = (
        "import resource, numpy as np, flexformer as ff\n"
        "rng = np.random.default_rng(0)\n"
        "q, k, v = (rng.standard_normal((1, 1, 16384, 8)) for _ in range(3))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = ff.softmax_attention(q, k, v, causal=True)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "assert np.isfinite(out).all()\n"
        "print((after - before) // 1024)\n"
    )
    grown_mib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.strip())
    assert grown_mib < 64


# ----------------------------------------------------------------------------- edges

def test_fully_masked_rows_and_masked_values_not_read():
    q, k, v = inputs(B=2, H=2, Nq=100, seed=18)
    mask = np.ones((2, 100), dtype=bool)
    mask[0] = False
    mask[1, 30:] = False
    v_nan = v.copy()
    v_nan[1, :, 30:] = np.nan
    k_nan = k.copy()
    k_nan[1, :, 30:] = np.nan
    (W,) = hedgehog_params(2, 6)
    (omega,) = performer_params(2, 6)
    E = ff.init.linformer_projections(8, 100, rng=1)
    for fn in (lambda k, v: ff.softmax_attention(q, k, v, key_mask=mask),
               lambda k, v: ff.hedgehog_attention(q, k, v, W, key_mask=mask),
               lambda k, v: ff.performer_attention(q, k, v, omega, key_mask=mask),
               lambda k, v: ff.linformer_attention(q, k, v, E, E, key_mask=mask)):
        clean = fn(k, v)
        assert np.isfinite(clean).all()
        np.testing.assert_array_equal(fn(k_nan, v_nan), clean)
    assert not ff.softmax_attention(q, k, v, key_mask=mask)[0].any()


def test_performer_large_norms_stay_finite():
    q, k, v = inputs(B=1, H=2, Nq=100, d=16, seed=19, scale=6.0)
    (omega,) = performer_params(2, 16, m=16)
    for causal in (False, True):
        out32 = ff.performer_attention(*(a.astype(np.float32) for a in (q, k, v)), omega.astype(np.float32),
                                       causal=causal)
        assert np.isfinite(out32).all()
        out = ff.performer_attention(q, k, v, omega, causal=causal)
        np.testing.assert_allclose(out, ref.performer_attention(q, k, v, omega, causal=causal), rtol=1e-8, atol=1e-10)


def test_generic_core_zero_rows():
    q, k, v = inputs(B=1, H=1, Nq=10, seed=20)
    pq, pk = elu1(q), elu1(k)
    pq[0, 0, 3] = 0.0
    pk[0, 0, 5] = 0.0
    out = ff.linear_attention(pq, pk, v)
    assert not out[0, 0, 3].any() and np.isfinite(out).all()
    dpq, dpk, dv = ff.linear_attention_backward(np.ones_like(out), pq, pk, v)
    assert not dpq[0, 0, 3].any() and not dpk[0, 0, 5].any() and not dv[0, 0, 5].any()


def test_performer_redraw_and_hedgehog_identity():
    omega = ff.init.performer_omega(2, 8, 4, rng=0, dtype=np.float32)
    new = ff.init.redraw(omega, rng=1)
    assert new.shape == omega.shape and new.dtype == np.float32 and not np.array_equal(new, omega)
    np.testing.assert_array_equal(ff.init.redraw(omega, rng=1), new)
    W = ff.init.hedgehog_weights(3, 5)
    np.testing.assert_array_equal(W, np.broadcast_to(np.eye(5), (3, 5, 5)))
    assert ff.init.hedgehog_weights(3, 5, 7, rng=0).shape == (3, 5, 7)


# ----------------------------------------------------------------------------- bad input

Q, K, V = inputs(B=2, H=3, Nq=6, d=4, e=5, seed=21)
BAD = [
    (lambda: ff.performer_attention(Q, K, V, np.zeros((3, 2, 3))), ValueError, "omega must have shape"),
    (lambda: ff.hedgehog_attention(Q, K, V, np.zeros((3, 5, 2))), ValueError, "W must have shape"),
    (lambda: ff.hedgehog_attention(Q, K, V, np.zeros((3, 4, 2), np.float32)), TypeError, "W must have dtype float64"),
    (lambda: ff.hedgehog_attention(Q, K, V, np.full((3, 4, 2), np.nan)), ValueError, "W must be finite"),
    (lambda: ff.linear_attention(Q, K[..., :3], V), ValueError, "phi_k must have shape"),
    (lambda: ff.linear_attention(Q.astype(int), K, V), TypeError, "phi_q must have dtype"),
    (lambda: ff.linear_attention(Q[..., :0], K[..., :0], V), ValueError, "feature size F >= 1"),
    (lambda: ff.softmax_attention(Q, K, V[:, :2]), ValueError, "v must have shape"),
    (lambda: ff.softmax_attention(Q, K, V, scale=0.0), ValueError, "scale must be"),
    (lambda: ff.softmax_attention(Q, K, V, scale="x"), TypeError, "scale must be"),
    (lambda: ff.softmax_attention(Q, K[:, :, :4], V[:, :, :4], causal=True), ValueError, "causal=True needs"),
    (lambda: ff.softmax_attention(Q, K, V, key_mask=np.ones((2, 5), bool)), ValueError, "key_mask must have shape"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros((4, 5)), np.zeros((4, 5))), ValueError, "E must have shape"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros((4, 8)), np.zeros((3, 8))), ValueError, "F must have shape"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros((4, 8)), np.zeros((3, 4, 8))), ValueError, "both"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros((2, 4, 8)), np.zeros((2, 4, 8))), ValueError, "E must have shape"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros((0, 8)), np.zeros((0, 8))), ValueError, "kp >= 1"),
    (lambda: ff.linformer_attention(Q, K, V, np.zeros(8), np.zeros(8)), ValueError, "E must be a 3-d array"),
    (lambda: ff.get_attention("flash"), ValueError, "choose one of: elu, flex_n"),
    (lambda: ff.get_attention("linformer").init(2, 4), ValueError, "max_len"),
]


@pytest.mark.parametrize("call,exc,msg", BAD, ids=[b[2] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_input(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
