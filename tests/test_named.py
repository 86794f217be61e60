"""The named functions (flexformer.named): generated from the registry, one pair per linear
kind, each the uniform call ff.attention / attention_backward with the parameters by
position, bit for bit; real signatures; the pre-existing named functions still agree with
their independent quadratic-form references."""
import inspect

import numpy as np
import pytest

import flexformer as ff
from flexformer import named, reference

LINEAR = [name for name in ff.attention_kinds() if ff.get_attention(name).key_state]


def test_every_linear_kind_has_its_pair_in_the_package():
    assert sorted(named.KINDS) == LINEAR
    for kind in LINEAR:
        for suffix in ("_attention", "_attention_backward"):
            fn = getattr(ff, kind + suffix)
            assert fn is getattr(named, kind + suffix) and kind + suffix in ff.__all__
            assert fn.__name__ == fn.__qualname__ == kind + suffix


@pytest.mark.parametrize("kind", LINEAR)
def test_signature_is_read_from_the_kinds_record(kind):
    spec = ff.get_attention(kind)
    forward = inspect.signature(getattr(ff, f"{kind}_attention")).parameters
    positional = [n for n, p in forward.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["q", "k", "v", *spec.params]
    keywords = [n for n, p in forward.items() if p.kind is p.KEYWORD_ONLY]
    assert keywords == ["causal", "key_mask", "eps", "return_guard_count", "return_key_state"] \
        + (["return_projections"] if spec.projections else [])
    assert forward["eps"].default == ff.DEFAULT_EPS
    backward = inspect.signature(getattr(ff, f"{kind}_attention_backward")).parameters
    assert list(backward) == ["dout", "q", "k", "v", *spec.params, "causal", "key_mask", "eps", "key_state"] \
        + (["projections"] if spec.projections else [])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", LINEAR)
def test_the_same_bits_as_the_uniform_call(kind, dtype):
    spec = ff.get_attention(kind)
    rng = np.random.default_rng(3)
    q, k, v = (0.7 * rng.standard_normal((2, 2, 9, 4)).astype(dtype) for _ in range(3))
    dout = rng.standard_normal(v.shape).astype(dtype)
    mask = np.ones((2, 9), bool)
    mask[1, [2, 5]] = False
    params = spec.init(2, 4, num_features=5, rng=4, dtype=dtype)
    args = [params[n] for n in spec.params]
    forward, backward = getattr(ff, f"{kind}_attention"), getattr(ff, f"{kind}_attention_backward")
    for causal in (False, True):
        out, guard = forward(q, k, v, *args, causal=causal, key_mask=mask, return_guard_count=True)
        want, want_guard = ff.attention(kind, q, k, v, params, causal=causal, key_mask=mask,
                                        return_guard_count=True)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(guard, want_guard)
        assert out.dtype == dtype
        grads = backward(dout, q, k, v, *args, causal=causal, key_mask=mask)
        dq, dk, dv, dparams = ff.attention_backward(kind, dout, q, k, v, params, causal=causal, key_mask=mask)
        assert len(grads) == 3 + len(spec.learnable)
        for got, expected in zip(grads, (dq, dk, dv) + tuple(dparams[n] for n in spec.learnable)):
            np.testing.assert_array_equal(got, expected)
    _, state = forward(q, k, v, *args, return_key_state=True)
    kept = backward(dout, q, k, v, *args, key_state=state)
    for got, expected in zip(kept, backward(dout, q, k, v, *args)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", LINEAR)
def test_a_missing_or_unknown_argument_is_pythons_own_error_naming_it(kind):
    spec = ff.get_attention(kind)
    q = np.zeros((1, 1, 3, 4))
    forward = getattr(ff, f"{kind}_attention")
    if spec.params:
        with pytest.raises(TypeError, match=rf"{kind}_attention\(\) missing .*'{spec.params[-1]}'"):
            forward(q, q, q)
    with pytest.raises(TypeError, match=rf"{kind}_attention\(\) got an unexpected keyword argument 'scale'"):
        forward(q, q, q, *[np.zeros(1)] * len(spec.params), scale=2.0)
    if not spec.projections:
        with pytest.raises(TypeError, match="return_projections"):
            forward(q, q, q, *[np.zeros(1)] * len(spec.params), return_projections=True)


def test_the_named_functions_against_their_quadratic_form_references():
    """Independent of the registry: the NumPy references of reference.py (explicit features,
    the N x N kernel matrix)."""
    rng = np.random.default_rng(5)
    q, k, v = (0.5 * rng.standard_normal((1, 2, 11, 6)) for _ in range(3))
    omega = ff.init.flex_s_omega(2, 7, 6, rng=1)
    n = dict(zip(("omega1", "omega2", "tau"), ff.init.flex_n_params(2, 7, 6, rng=2)))
    W = ff.init.hedgehog_weights(2, 6, 7, rng=3)
    p_omega = ff.init.performer_omega(2, 7, 6, rng=4)
    for causal in (False, True):
        pairs = [(ff.flex_s_attention(q, k, v, omega, causal=causal),
                  reference.flex_s_attention(q, k, v, omega, causal=causal)),
                 (ff.rfa_attention(q, k, v, omega, causal=causal),
                  reference.flex_s_attention(q, k, v, omega, causal=causal)),
                 (ff.flex_n_attention(q, k, v, n["omega1"], n["omega2"], n["tau"], causal=causal),
                  reference.flex_n_attention(q, k, v, n["omega1"], n["omega2"], n["tau"], causal=causal)),
                 (ff.hedgehog_attention(q, k, v, W, causal=causal),
                  reference.hedgehog_attention(q, k, v, W, causal=causal)),
                 (ff.performer_attention(q, k, v, p_omega, causal=causal),
                  reference.performer_attention(q, k, v, p_omega, causal=causal))]
        for got, want in pairs:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
