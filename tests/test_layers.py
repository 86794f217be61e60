"""The dense layers' forward and backward (GELU, LayerNorm, Linear) against plain NumPy
formulas and float64 central differences; inputs are not mutated."""
import numpy as np
import pytest

import flexformer as ff
from flexformer import _C
from flexformer.nn.core import GELU, LayerNorm, Linear, gelu_reference


def _numeric_input_grad(f, x, dy, h=1e-6):
    """d(sum(dy * f(x)))/dx by central differences, element by element."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        up = float(np.sum(dy * f(x)))
        flat[i] = old - h
        down = float(np.sum(dy * f(x)))
        flat[i] = old
        gflat[i] = (up - down) / (2 * h)
    return g


@pytest.mark.parametrize("threads", [1, 2])
def test_gelu_matches_the_formula_in_both_dtypes(threads):
    rng = np.random.default_rng(0)
    before = ff.get_num_threads()
    ff.set_num_threads(threads)
    try:
        # 3 x 5 x 2,731: several work items and a partial vector; values out to the flat tails
        x64 = rng.standard_normal((3, 5, 2731)) * 4
        x64[0, 0, :8] = [0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1e4, -1e4]
        dy64 = rng.standard_normal(x64.shape)
        for dtype, tol in ((np.float64, 1e-14), (np.float32, 3e-7)):
            x, dy = x64.astype(dtype), dy64.astype(dtype)
            x_copy, dy_copy = x.copy(), dy.copy()
            layer = GELU()
            y = layer.forward(x)
            dx = layer.backward(dy)
            assert y.dtype == dtype and dx.dtype == dtype and y.shape == x.shape == dx.shape
            assert np.array_equal(x, x_copy) and np.array_equal(dy, dy_copy)
            # the float32 rows are compared with the float32 inputs in float64
            y_want, dx_want = gelu_reference(x.astype(np.float64), dy.astype(np.float64))
            assert np.max(np.abs(y - y_want)) <= tol * np.max(np.abs(y_want))
            assert np.max(np.abs(dx - dx_want)) <= tol * np.max(np.abs(dx_want))
    finally:
        ff.set_num_threads(before)


def test_gelu_gradient_by_central_differences():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7)) * 2
    dy = rng.standard_normal(x.shape)
    layer = GELU()
    layer.forward(x)
    got = layer.backward(dy)
    want = _numeric_input_grad(lambda z: GELU().forward(z), x.copy(), dy)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


def test_gelu_nan_and_non_contiguous_input():
    x = np.linspace(-3, 3, 40).reshape(8, 5).T  # a transposed (non-contiguous) view
    layer = GELU()
    np.testing.assert_allclose(layer.forward(x), gelu_reference(x), rtol=1e-14, atol=1e-15)
    z = np.array([1.0, np.nan, -2.0])
    y = GELU().forward(z)
    assert np.isnan(y[1]) and np.isfinite(y[[0, 2]]).all()
    layer = GELU()
    layer.forward(z)
    assert np.isnan(layer.backward(np.ones(3))[1])


def test_gelu_kernel_rejects_bad_arguments():
    with pytest.raises(TypeError, match="x must have dtype float32 or float64"):
        _C.gelu_forward(np.arange(4))
    with pytest.raises(ValueError, match="x must be a 1-d array"):
        _C.gelu_forward(np.zeros((2, 2)))
    y, w = _C.gelu_forward(np.zeros(4))
    with pytest.raises(ValueError, match="dy and w must have x's length 4"):
        _C.gelu_backward(np.zeros(3), np.zeros(4), w)
    with pytest.raises(TypeError, match="dy must have dtype float64"):
        _C.gelu_backward(np.zeros(4, np.float32), np.zeros(4), w)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layer_norm_matches_the_formula(dtype):
    rng = np.random.default_rng(2)
    x64 = rng.standard_normal((4, 9, 24)) * 3 + 1.5
    dy64 = rng.standard_normal(x64.shape)
    layer = LayerNorm(24, dtype=dtype)
    layer.gamma.value[:] = rng.standard_normal(24)
    layer.beta.value[:] = rng.standard_normal(24)
    x, dy = x64.astype(dtype), dy64.astype(dtype)
    x_copy = x.copy()
    y = layer.forward(x)
    dx = layer.backward(dy)
    assert np.array_equal(x, x_copy) and y.dtype == dtype and dx.dtype == dtype
    g, b = layer.gamma.value.astype(np.float64), layer.beta.value.astype(np.float64)
    xd, dyd = x.astype(np.float64), dy.astype(np.float64)
    mu = xd.mean(-1, keepdims=True)
    sd = np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xhat = (xd - mu) / sd
    gd = dyd * g
    dx_want = (gd - gd.mean(-1, keepdims=True) - xhat * (gd * xhat).mean(-1, keepdims=True)) / sd
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert np.max(np.abs(y - (xhat * g + b))) <= tol * 10
    assert np.max(np.abs(dx - dx_want)) <= tol * np.max(np.abs(dx_want))
    np.testing.assert_allclose(layer.gamma.grad, (dyd * xhat).reshape(-1, 24).sum(0), rtol=tol * 10, atol=tol * 10)
    np.testing.assert_allclose(layer.beta.grad, dyd.reshape(-1, 24).sum(0), rtol=tol * 10, atol=tol * 10)


def test_layer_norm_and_linear_gradients_by_central_differences():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 6))
    dy = rng.standard_normal((2, 3, 6))
    norm = LayerNorm(6, dtype=np.float64)
    norm.gamma.value[:] = rng.standard_normal(6)
    norm.forward(x)
    got = norm.backward(dy)
    np.testing.assert_allclose(got, _numeric_input_grad(norm.forward, x.copy(), dy), rtol=1e-6, atol=1e-8)
    lin = Linear(6, 4, rng, dtype=np.float64)
    dy4 = rng.standard_normal((2, 3, 4))
    lin.forward(x)
    got = lin.backward(dy4)
    np.testing.assert_allclose(got, _numeric_input_grad(lin.forward, x.copy(), dy4), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(lin.W.grad, x.reshape(-1, 6).T @ dy4.reshape(-1, 4), rtol=1e-12)
    np.testing.assert_allclose(lin.b.grad, dy4.reshape(-1, 4).sum(0), rtol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 3e-6)])
def test_layer_norm_kernel_against_its_numpy_twin_on_both_thread_counts(dtype, tol):
    from flexformer.nn.core import layer_norm_reference

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((333, 40)) * 5 + 3).astype(dtype)  # several work items, a partial one
    dy = rng.standard_normal(x.shape).astype(dtype)
    gamma, beta = rng.standard_normal(40).astype(dtype), rng.standard_normal(40).astype(dtype)
    want = layer_norm_reference(x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64), 1e-5,
                                dy.astype(np.float64))
    before = ff.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            ff.set_num_threads(threads)
            y, xhat, rstd = _C.layer_norm_forward(x, gamma, beta, 1e-5)
            results.append((y,) + _C.layer_norm_backward(dy, xhat, rstd, gamma))
    finally:
        ff.set_num_threads(before)
    for got in results:
        for g, w in zip(got, want):
            assert g.dtype == dtype
            assert np.max(np.abs(g - w)) <= tol * np.max(np.abs(w))
    for a, b in zip(*results):  # rows are owned by one thread: y and dx equal bit for bit
        assert np.array_equal(a, b) or a.ndim == 1


def test_layer_norm_kernel_rejects_bad_arguments():
    x, g = np.zeros((4, 3)), np.ones(3)
    with pytest.raises(ValueError, match=r"^eps must be a finite number > 0, got 0$"):
        _C.layer_norm_forward(x, g, g, 0.0)
    with pytest.raises(ValueError, match=r"^eps must be a finite number > 0, got nan$"):
        _C.layer_norm_forward(x, g, g, float("nan"))
    with pytest.raises(ValueError, match="gamma and beta must have x's 3 columns"):
        _C.layer_norm_forward(x, np.ones(2), g, 1e-5)
    with pytest.raises(TypeError, match="x must have dtype float32 or float64"):
        _C.layer_norm_forward(x.astype(np.int64), g, g, 1e-5)
    with pytest.raises(TypeError, match="gamma must have dtype float64"):
        _C.layer_norm_forward(x, g.astype(np.float32), g, 1e-5)
    y, xhat, rstd = _C.layer_norm_forward(x, g, g, 1e-5)
    with pytest.raises(ValueError, match="dy must have xhat's shape"):
        _C.layer_norm_backward(np.zeros((4, 2)), xhat, rstd, g)
    empty = _C.layer_norm_forward(np.zeros((0, 3)), g, g, 1e-5)
    assert empty[0].shape == (0, 3)


def test_large_inputs_take_the_parallel_path_with_the_same_results():
    """Above their size thresholds GELU and LayerNorm split rows over threads: elementwise
    and per-row results equal the one-thread results bit for bit."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16411, 130)).astype(np.float32)  # 2.1 M elements: over both thresholds
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gamma, beta = rng.standard_normal(130).astype(np.float32), rng.standard_normal(130).astype(np.float32)
    before = ff.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            ff.set_num_threads(threads)
            y, w = _C.gelu_forward(x.reshape(-1))
            dx = _C.gelu_backward(dy.reshape(-1), x.reshape(-1), w)
            ny, xhat, rstd = _C.layer_norm_forward(x, gamma, beta, 1e-5)
            ndx, dgamma, dbeta = _C.layer_norm_backward(dy, xhat, rstd, gamma)
            out.append((y, dx, ny, ndx, dgamma, dbeta))
    finally:
        ff.set_num_threads(before)
    for a, b in zip(out[0][:4], out[1][:4]):
        assert np.array_equal(a, b)
    for a, b in zip(out[0][4:], out[1][4:]):  # sums over rows: the order of the partial sums differs
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-3)


# ------------------------------------------------- bad arguments to the NumPy layers
from flexformer import nn  # noqa: E402

X32 = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
LAYER_CASES = [
    # (what is called, exception, the message in full)
    (lambda: nn.MultiHeadAttention(8, 0, "flex_n", 0), ValueError, "num_heads must be an int >= 1, got 0"),
    (lambda: nn.MultiHeadAttention(8, 2, "flex_n", "seed"), TypeError,
     "rng must be None, an int seed or a numpy Generator, got str"),
    (lambda: nn.Linear(0, 3, 0), ValueError, "d_in must be an int >= 1, got 0"),
    (lambda: nn.Linear(4, 3, 0, dtype=np.int64), TypeError, "dtype must be float32 or float64, got int64"),
    (lambda: nn.Embedding(0, 4, 0), ValueError, "vocab must be an int >= 1, got 0"),
    (lambda: nn.CausalLM(20, dim=8, heads=0), ValueError, "num_heads must be an int >= 1, got 0"),
    (lambda: nn.Block(8, 2, "flex_s", 0, mlp_ratio=0), ValueError, "mlp_ratio must be an int >= 1, got 0"),
    (lambda: nn.MultiHeadAttention(8, 2, "flex_n", 0).forward(X32[0]), ValueError,
     "x must have shape (B, N, dim) with dim = 8, got (5, 8)"),
    (lambda: nn.MultiHeadAttention(8, 2, "flex_n", 0).forward(X32[..., :6]), ValueError,
     "x must have shape (B, N, dim) with dim = 8, got (2, 5, 6)"),
    (lambda: nn.MultiHeadAttention(8, 2, "flex_n", 0).forward(X32.astype(np.float64)), TypeError,
     "x must have the layer's dtype float32, got float64"),
    (lambda: nn.MultiHeadAttention(8, 2, "flex_n", 0).forward(None), TypeError,
     "x must be a NumPy array (B, N, dim), got NoneType"),
    (lambda: nn.Block(8, 2, "flex_s", 0).forward(X32.astype(np.int64)), TypeError,
     "x must have the layer's dtype float32, got int64"),
    (lambda: nn.Linear(4, 3, 0).forward(X32), ValueError, "x must have shape (..., d_in) with d_in = 4, got (2, 5, 8)"),
    (lambda: nn.LayerNorm(4).forward(X32), ValueError, "x must have shape (..., dim) with dim = 4, got (2, 5, 8)"),
    (lambda: nn.Embedding(10, 4, 0).forward(np.array([[1.0, 2.0]])), TypeError,
     "token ids must be an integer array, got dtype float64"),
    (lambda: nn.CausalLM(20, dim=8, heads=2).forward(np.array([1, 2])), ValueError,
     "ids must be a 2-d integer array (B, T), got int64 (2,)"),
    (lambda: nn.PositionalEncoding(8, 8, 0).forward(X32, offset=-1), ValueError, "offset must be an int >= 0, got -1"),
]
BEFORE_FORWARD = {
    "Linear": lambda: nn.Linear(8, 8, 0), "LayerNorm": lambda: nn.LayerNorm(8), "GELU": lambda: nn.GELU(),
    "MLP": lambda: nn.MLP(8, 16, 0), "ShortConv": lambda: nn.ShortConv(8, 3),
    "PositionalEncoding": lambda: nn.PositionalEncoding(8, 8, 0),
    "MultiHeadAttention": lambda: nn.MultiHeadAttention(8, 2, "flex_n", 0), "Block": lambda: nn.Block(8, 2, "softmax", 0),
}


@pytest.mark.parametrize("call,exc,msg", LAYER_CASES, ids=[c[2][:40] for c in LAYER_CASES])
def test_layers_name_the_bad_argument(call, exc, msg):
    with pytest.raises(exc) as err:
        call()
    assert str(err.value) == msg


@pytest.mark.parametrize("layer_name", BEFORE_FORWARD)
def test_backward_before_forward_and_a_gradient_of_the_wrong_shape(layer_name):
    layer = BEFORE_FORWARD[layer_name]()
    with pytest.raises(RuntimeError, match="backward needs a forward call first"):
        layer.backward(X32)
    y = layer.forward(X32)
    with pytest.raises(ValueError, match=r"dy must have the shape of the last forward's output, \(2, 5, 8\), "
                                         r"got \(2, 3, 8\)"):
        layer.backward(y[:, :3])
    assert layer.backward(np.ones_like(y)).shape == X32.shape


def test_layers_take_a_seed_or_a_generator_alike_and_lists_as_their_dtype():
    a = nn.MultiHeadAttention(8, 2, "flex_n", 3)
    b = nn.MultiHeadAttention(8, 2, "flex_n", np.random.default_rng(3))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.value, pb.value, err_msg=name)
    np.testing.assert_array_equal(a.forward(X32.tolist()), b.forward(X32))


def test_learned_positions_get_the_gradient_at_their_offset():
    pos = nn.PositionalEncoding(8, 8, 0)
    pos.forward(X32[:, :3], offset=4)
    pos.backward(np.ones((2, 3, 8), np.float32))
    np.testing.assert_array_equal(pos.P.grad[4:7], 2.0)
    assert not pos.P.grad[:4].any() and not pos.P.grad[7:].any()
