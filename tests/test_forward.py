"""Forward parity of the C kernels with the quadratic-form NumPy reference."""
import numpy as np
import pytest

import flexformer as ff
from flexformer import reference as ref

from conftest import layout, make_inputs, random_mask


def rel_err(got, want):
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)


def run_s(x, **kw):
    return ff.flex_s_attention(x["q"], x["k"], x["v"], x["omega"], **kw)


def run_n(x, **kw):
    return ff.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"], **kw)


def ref_s(x, **kw):
    return ref.flex_s_attention(x["q"], x["k"], x["v"], x["omega"], **kw)


def ref_n(x, **kw):
    return ref.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"], **kw)


VARIANTS = [("flex_s", run_s, ref_s), ("flex_n", run_n, ref_n)]


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["f64", "f32"])
def test_matches_quadratic_reference(name, run, reference, causal, masked, dtype, tol, threads):
    # N = 150 spans three causal chunks (FF_BLOCK = 64), the last one partial
    x = make_inputs(B=2, H=3, Nq=150, d=6, e=5, m=8, dtype=dtype, seed=3)
    mask = random_mask(2, 150) if masked else None
    got, guard = run(x, causal=causal, key_mask=mask, return_guard_count=True)
    want = reference(x, causal=causal, key_mask=mask)
    assert got.dtype == dtype and got.shape == (2, 3, 150, 5)
    assert guard.shape == (2, 3) and guard.dtype == np.int64
    assert rel_err(got, want) <= tol


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("Nq,Nk", [(7, 130), (130, 9), (1, 1), (65, 64)])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_bidirectional_unequal_lengths(name, run, reference, Nq, Nk, masked):
    x = make_inputs(B=2, H=2, Nq=Nq, Nk=Nk, seed=4)
    mask = random_mask(2, Nk, seed=5) if masked else None
    assert rel_err(run(x, key_mask=mask), reference(x, key_mask=mask)) <= 1e-10


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_non_contiguous_and_fortran_inputs(name, run, reference):
    x = make_inputs(B=2, H=2, Nq=40, seed=6)
    want = run(x, causal=True)
    y = {key: np.asfortranarray(val) for key, val in x.items()}
    y["q"] = np.ascontiguousarray(np.swapaxes(np.swapaxes(x["q"], 2, 3).copy(), 2, 3)[:, :, :, :])
    big = np.zeros((2, 2, 80, x["k"].shape[3]))
    big[:, :, ::2] = x["k"]
    y["k"] = big[:, :, ::2]  # strided view
    assert not y["k"].flags.c_contiguous
    got = run(y, causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_inputs_in_the_other_byte_order(name, run, reference, dtype):
    """Arrays stored in the non-native byte order are converted, not read as they lie (the
    glue takes native, C-ordered, aligned arrays in place and converts the rest)."""
    x = make_inputs(B=2, H=2, Nq=70, dtype=dtype, seed=8)
    y = {key: layout(val, "other byte order") for key, val in x.items()}
    assert not y["q"].dtype.isnative
    for causal in (False, True):
        np.testing.assert_array_equal(run(y, causal=causal), run(x, causal=causal))


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_read_only_inputs_and_no_mutation(name, run, reference):
    x = make_inputs(B=1, H=2, Nq=70, seed=7)
    mask = random_mask(1, 70)
    copies = {key: val.copy() for key, val in x.items()}
    mask_copy = mask.copy()
    for val in list(x.values()) + [mask]:
        val.setflags(write=False)
    run(x, causal=True, key_mask=mask)
    run(x, causal=False, key_mask=mask)
    for key in x:
        np.testing.assert_array_equal(x[key], copies[key])
    np.testing.assert_array_equal(mask, mask_copy)


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("causal", [False, True])
def test_empty_sizes(name, run, reference, causal):
    for shape in [dict(B=0), dict(H=0), dict(Nq=0), dict(e=0)]:
        x = make_inputs(**{**dict(B=2, H=2, Nq=5, e=3), **shape})
        out = run(x, causal=causal)
        assert out.shape == x["q"].shape[:3] + (x["v"].shape[3],)
    x = make_inputs(B=1, H=2, Nq=4, Nk=0)
    out = run(x)
    assert out.shape == (1, 2, 4, 4) and not out.any()


@pytest.mark.parametrize("name,run,reference", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_fully_masked_rows_are_zero(name, run, reference):
    x = make_inputs(B=2, H=2, Nq=100, seed=8)
    mask = np.ones((2, 100), dtype=bool)
    mask[0] = False  # batch 0: every key masked
    mask[1, :70] = False  # batch 1, causal: rows < 70 see no key
    out = run(x, key_mask=mask)
    assert np.all(out[0] == 0) and np.isfinite(out).all()
    out_c = run(x, key_mask=mask, causal=True)
    assert np.all(out_c[0] == 0) and np.all(out_c[1, :, :70] == 0)
    np.testing.assert_allclose(out_c, reference(x, key_mask=mask, causal=True), rtol=1e-10, atol=1e-12)


def test_masked_keys_are_not_read():
    x = make_inputs(B=1, H=2, Nq=90, seed=9)
    mask = random_mask(1, 90, seed=2)
    want = run_n(x, key_mask=mask, causal=True)
    for key in ("k", "v"):
        x[key] = x[key].copy()
        x[key][:, :, ~mask[0]] = np.nan
    got = run_n(x, key_mask=mask, causal=True)
    np.testing.assert_array_equal(got, want)


def test_flex_n_at_init_equals_flex_s():
    x = make_inputs(B=1, H=2, Nq=50, d=8, m=16, perturb=False, seed=10)
    # init: A = B = omega and tau = log(2 sqrt d)
    omega = x["omega1"]
    s = ff.flex_s_attention(x["q"], x["k"], x["v"], omega, causal=True)
    n = ff.flex_n_attention(x["q"], x["k"], x["v"], omega, omega, x["tau"], causal=True)
    np.testing.assert_allclose(n, s, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("orthogonal", [False, True])
def test_init_estimates_softmax_attention(orthogonal):
    # With many random features the estimate approaches exact softmax attention.
    rng = np.random.default_rng(11)
    d, N = 8, 40
    q = rng.standard_normal((1, 1, N, d)) * 0.4
    k = rng.standard_normal((1, 1, N, d)) * 0.4
    v = rng.standard_normal((1, 1, N, 3))
    exact = ref.softmax_attention(q, k, v)
    errs = []
    for m in (16, 4096):
        omega = ff.init.flex_s_omega(1, m, d, rng=12, orthogonal=orthogonal, scale=1.0)  # the unbiased start
        errs.append(np.abs(ff.flex_s_attention(q, k, v, omega) - exact).max())
    assert errs[1] < 0.05 and errs[1] < errs[0] / 4
