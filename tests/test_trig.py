"""The kernels' vectorised sin/cos against libm (through NumPy, and libm itself where the
kernels hand an argument to it)."""
import ctypes
import ctypes.util

import numpy as np
import pytest

import flexformer as ff
from flexformer import _C, reference as ref


# absolute error against the exact sin and cos of each input; measured max:
# 2.3e-16 (float64) and 9e-8 (float32) over 2e5 points in each span
@pytest.mark.parametrize("span", [1.0, 10.0, 1e3, 8e3, 9e4])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 4.5e-16), (np.float32, 1.5e-7)])
def test_sincos_matches_libm(dtype, tol, span):
    x = np.random.default_rng(int(span)).uniform(-span, span, 20001).astype(dtype)
    x[:5] = [0.0, -0.0, np.pi / 4, -np.pi / 2, np.pi]
    s, c = _C._sincos(x)
    xd = x.astype(np.float64)  # the exact value of each float32 input
    assert np.max(np.abs(s - np.sin(xd))) <= tol
    assert np.max(np.abs(c - np.cos(xd))) <= tol


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sincos_large_and_special_arguments(dtype):
    x = np.array([1e6, -3e7, 1e30, np.inf, -np.inf, np.nan, 0.5], dtype=dtype)
    s, c = _C._sincos(x)
    # beyond the vector range the kernels call libm itself, so the bits are libm's; NumPy's
    # np.sin need not be libm's (NumPy 1.23 has its own float64 sin on AVX-512)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    suffix, ctype = ("f", ctypes.c_float) if dtype == np.float32 else ("", ctypes.c_double)
    for name, got in (("sin", s), ("cos", c)):
        fn = getattr(libm, name + suffix)
        fn.restype, fn.argtypes = ctype, [ctype]
        np.testing.assert_array_equal(got[:3], np.array([fn(float(t)) for t in x[:3]], dtype=dtype))
    assert np.isnan(s[3:6]).all() and np.isnan(c[3:6]).all()
    assert abs(s[6] - np.sin(0.5)) < 1e-6


# The exponential of the feature maps and softmax (exp.inc): float32 vectorised, float64
# libm. Relative error against the exact e^x of each input; measured max over the span:
# 8.2e-8 (float32, every instruction-set copy) and 2.2e-16 (float64)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 4.5e-16), (np.float32, 1.5e-7)])
def test_exp_matches_libm(dtype, tol):
    x = np.random.default_rng(7).uniform(-87.0, 88.0, 200001).astype(dtype)
    x[:4] = [0.0, -0.0, -1e-30, 1e-30]
    y = _C._exp(x)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(y / want - 1)) <= tol


def test_exp_float32_range_ends_and_special_values():
    x = np.array([-np.inf, np.inf, np.nan, -104.0, -103.0, -100.0, -88.0, 88.7, 89.0, 1e3, -1e3],
                 dtype=np.float32)
    y = _C._exp(x)
    with np.errstate(over="ignore", under="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)  # exact, then rounded once
    assert y[0] == 0 and y[1] == np.inf and np.isnan(y[2])
    np.testing.assert_array_equal(y[[3, 4, 8, 9, 10]], want[[3, 4, 8, 9, 10]])  # 0, subnormal, inf
    # the subnormal and the top of the range: within one unit of the last place
    for got, ref in zip(y[5:8], want[5:8]):
        assert abs(got - ref) <= np.spacing(ref), (got, ref)


# flex_n's feature map takes the sines and cosines of its two angle blocks in one pass
# (csrc/sincos_tile.inc) and sends the pairs holding an angle beyond the vector range
# (8192 float32, 1e5 float64) through libm element by element. Angles here are exact:
# inputs are multiples of 1/8 and each huge frequency row is a power of two times a unit
# vector, so A x is exact in float32 too; the other rows keep their angles small.
def _huge_angle_inputs(m, d=8, N=70, seed=11):
    rng = np.random.default_rng(seed)
    q, k = (np.round(rng.uniform(-2, 2, (1, 2, N, d)) * 8) / 8 for _ in range(2))
    v = rng.standard_normal((1, 2, N, 3))
    omega1 = rng.standard_normal((2, m, d)) * 0.3
    omega2 = rng.standard_normal((2, m, d)) * 0.3
    for h in range(2):
        for j in range(0, m, 3):  # every third A row, and every fifth B row: lanes of both kinds
            omega1[h, j] = 0.0
            omega1[h, j, (j + h) % d] = 2.0 ** 18  # |A x| up to 5e5: beyond both limits
        for j in range(1, m, 5):
            omega2[h, j] = 0.0
            omega2[h, j, j % d] = -(2.0 ** 14)  # up to 3e4: beyond float32's only
    tau = np.full(2, np.log(8.0))
    # values a float32 holds exactly, so both dtypes see the same numbers
    return tuple(a.astype(np.float32).astype(np.float64) for a in (q, k, v, omega1, omega2, tau))


@pytest.mark.parametrize("m", [19, 32])  # a partial vector per row, and whole vectors
@pytest.mark.parametrize("causal", [False, True])
def test_flex_n_angles_beyond_the_vector_range(m, causal):
    q, k, v, o1, o2, tau = _huge_angle_inputs(m)
    want = ref.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
    got64 = ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
    np.testing.assert_allclose(got64, want, rtol=1e-9, atol=1e-12)
    f32 = [a.astype(np.float32) for a in (q, k, v, o1, o2, tau)]
    got32 = ff.flex_n_attention(*f32, causal=causal)
    assert np.max(np.abs(got32 - want)) <= 2e-5 * np.max(np.abs(want))
    # the backward recomputes the features keeping both blocks' sines and cosines
    dout = np.random.default_rng(12).standard_normal(want.shape)
    g64 = ff.flex_n_attention_backward(dout, q, k, v, o1, o2, tau, causal=causal)
    g32 = ff.flex_n_attention_backward(dout.astype(np.float32), *f32, causal=causal)
    for a, b in zip(g32, g64):
        assert np.max(np.abs(a - b)) <= 2e-4 * np.max(np.abs(b))
