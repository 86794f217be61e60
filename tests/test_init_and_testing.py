"""Initialisers and the public gradcheck helper."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.testing import check_model_gradients, gradcheck, numerical_gradient

from conftest import make_inputs


@pytest.mark.parametrize("orthogonal", [False, True])
def test_frequencies_have_the_gaussian_law(orthogonal):
    d = 16
    w = ff.init.gaussian_frequencies(4, 512, d, rng=0, orthogonal=orthogonal)
    assert w.shape == (4, 512, d) and w.dtype == np.float64
    # entries ~ N(0, 1/sqrt(d)): variance 1/4 for d = 16
    assert abs(w.var() - 1 / np.sqrt(d)) < 0.02
    assert abs(w.mean()) < 0.02


def test_orthogonal_blocks_are_orthogonal():
    w = ff.init.gaussian_frequencies(2, 24, 8, rng=1, orthogonal=True)
    for h in range(2):
        for start in range(0, 24, 8):
            block = w[h, start:start + 8]
            gram = block @ block.T
            off = gram - np.diag(np.diag(gram))
            assert np.max(np.abs(off)) < 1e-12


def test_seeds_and_generators():
    a = ff.init.flex_s_omega(2, 4, 3, rng=5)
    b = ff.init.flex_s_omega(2, 4, 3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, ff.init.flex_s_omega(2, 4, 3, rng=6))
    o1, o2, tau = ff.init.flex_n_params(3, 4, 9, rng=5, dtype=np.float32, symmetric=True)
    np.testing.assert_array_equal(o1, o2)
    assert o1.dtype == tau.dtype == np.float32 and tau.shape == (3,)
    np.testing.assert_allclose(tau, np.log(2 * 3.0))
    o1, o2, tau = ff.init.flex_n_params(3, 4, 9, rng=5, dtype=np.float32)  # the default start
    assert not np.array_equal(o1, o2)
    np.testing.assert_allclose(tau, np.log(2 * 3.0), rtol=1e-6)  # tau fixed at log(2 sqrt d)
    _, _, matched = ff.init.flex_n_params(3, 4, 9, rng=5, dtype=np.float32, match_tau=True)
    np.testing.assert_allclose(matched, np.log(2 * 3.0 / ff.init.DEFAULT_SCALE ** 2), rtol=1e-6)
    with pytest.raises(ValueError, match="num_features"):
        ff.init.flex_s_omega(2, 0, 3)
    with pytest.raises(TypeError, match="rng"):
        ff.init.flex_s_omega(2, 4, 3, rng="seed")
    with pytest.raises(TypeError, match="dtype"):
        ff.init.flex_s_omega(2, 4, 3, dtype=np.int32)


def test_gradcheck_catches_a_wrong_gradient():
    x = make_inputs(B=1, H=1, Nq=5, d=2, e=2, m=3)

    def wrong_backward(dout, q, k, v, omega):
        dq, dk, dv, domega = ff.flex_s_attention_backward(dout, q, k, v, omega)
        return dq, dk * 1.001, dv, domega

    args = (x["q"], x["k"], x["v"], x["omega"])
    with pytest.raises(AssertionError, match="k: max abs error"):
        gradcheck(ff.flex_s_attention, wrong_backward, args, names=("q", "k", "v", "omega"))
    report = gradcheck(ff.flex_s_attention, wrong_backward, args, names=("q", "k", "v", "omega"),
                       raise_on_failure=False)
    assert report["k"] > 1e-4 and report["q"] < 1e-6


def test_gradcheck_needs_float64_and_leaves_inputs_alone():
    x = make_inputs(B=1, H=1, Nq=4, d=2, e=2, m=2)
    args = (x["q"], x["k"], x["v"], x["omega"])
    copies = [a.copy() for a in args]
    gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, args)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a, c)
    with pytest.raises(TypeError, match="float64"):
        gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward,
                  tuple(a.astype(np.float32) for a in args))
    with pytest.raises(TypeError, match=r"inputs must be a list or tuple of the arrays forward takes \(e\.g\. "
                                        r"\[q, k, v, omega\]\), got ndarray"):
        gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, args[0])
    with pytest.raises(ValueError, match=r"wrt must hold indices of inputs, 0 to 3; got \[4, -1\]"):
        gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, args, wrt=[0, 4, -1])




@pytest.mark.parametrize("setting, value, exc, message", [
    ("step", 0.0, ValueError, "step must be a finite number > 0, got 0.0"),  # was a ZeroDivisionError
    ("step", -1e-6, ValueError, "step must be a finite number > 0"),
    ("step", float("nan"), ValueError, "step must be a finite number > 0"),
    ("step", "x", TypeError, "step must be a float, got str"),
    ("rtol", -1.0, ValueError, "rtol must be a finite number >= 0"),
    ("atol", float("inf"), ValueError, "atol must be a finite number >= 0"),
])
def test_the_checks_refuse_a_bad_step_or_tolerance(setting, value, exc, message):
    x = make_inputs(B=1, H=1, Nq=3, d=2, e=2, m=2)
    args = (x["q"], x["k"], x["v"], x["omega"])
    with pytest.raises(exc, match=message):
        gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, args, **{setting: value})
    layer = ff.nn.Linear(2, 2, 0, dtype=np.float64)
    with pytest.raises(exc, match=message):
        check_model_gradients(lambda: 0.0, layer.named_parameters(), **{setting: value})
    if setting == "step":
        with pytest.raises(exc, match=message):
            numerical_gradient(lambda: 0.0, np.zeros(2), step=value)


def test_numerical_gradient_restores_x_when_the_loss_raises_and_wants_one_number():
    x = np.array([1.0, 2.0, 3.0])
    calls = []

    def failing():
        calls.append(x.copy())
        if len(calls) == 4:  # the second element's "up" pass, x[1] perturbed
            raise KeyError("the user's loss failed")
        return float(x.sum())

    with pytest.raises(KeyError):
        numerical_gradient(failing, x)
    np.testing.assert_array_equal(x, [1.0, 2.0, 3.0])  # was left at 2 + 1e-6
    assert calls[3][1] != 2.0
    with pytest.raises(TypeError, match=r"loss must return one number, got an array of shape \(3,\)"):
        numerical_gradient(lambda: x * 2, x)
    with pytest.raises(TypeError, match="loss must return a real number, got str"):
        numerical_gradient(lambda: "x", x)
    with pytest.raises(ValueError, match="x must be writeable"):
        frozen = x.copy()
        frozen.setflags(write=False)
        numerical_gradient(lambda: 0.0, frozen)
    np.testing.assert_array_equal(numerical_gradient(lambda: 0.0, np.zeros((0, 3))), np.zeros((0, 3)))


def test_check_model_gradients_restores_the_parameter_when_the_loss_raises():
    layer = ff.nn.Linear(3, 2, 0, dtype=np.float64)
    before = {n: v.copy() for n, v in layer.parameters().items()}
    x = np.random.default_rng(0).standard_normal((4, 3))
    calls = []

    def loss_and_backward():
        calls.append(1)
        if len(calls) == 3:  # the first parameter's "down" pass
            raise RuntimeError("the user's loss failed")
        layer.zero_grad()
        y = layer.forward(x)
        layer.backward(np.ones_like(y))
        return float(y.sum())

    with pytest.raises(RuntimeError):
        check_model_gradients(loss_and_backward, layer.named_parameters())
    for n, v in layer.parameters().items():
        np.testing.assert_array_equal(v, before[n])
@pytest.mark.parametrize("kind", ff.attention_kinds())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_kind_starts_with_c_ordered_writeable_parameters(kind, dtype):
    """The kernels take C-ordered arrays and copy anything else on every call; an optimiser
    updates parameters in place. Hedgehog's identity start was once a strided copy of a
    broadcast view (axis 0 fastest), which cost a third of each decoding step."""
    spec = ff.get_attention(kind)
    for m in (None, 5):  # the default (hedgehog: the identity) and a drawn start
        params = spec.init(3, 4, num_features=m, max_len=16, rng=1, dtype=dtype)
        for name, p in params.items():
            assert p.flags["C_CONTIGUOUS"] and p.flags["WRITEABLE"], (kind, name, p.strides)
            assert p.dtype == dtype, (kind, name, p.dtype)
