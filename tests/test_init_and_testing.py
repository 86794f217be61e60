"""Initialisers and the public gradcheck helper."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.testing import gradcheck

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
