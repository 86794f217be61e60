"""The kernels' vectorised sin/cos against libm (through NumPy)."""
import numpy as np
import pytest

from flexformer import _C


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
    np.testing.assert_array_equal(s[:3], np.sin(x[:3]))  # beyond the limit: libm itself
    np.testing.assert_array_equal(c[:3], np.cos(x[:3]))
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
