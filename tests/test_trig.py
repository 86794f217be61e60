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
