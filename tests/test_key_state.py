"""The bidirectional key state: returned by the forward, taken by the backward instead of
the key pass. Gradients must be identical; the state must equal the sums it stands for."""
import numpy as np
import pytest

import flexformer as ff
from flexformer import _C
from flexformer.registry import features

from conftest import make_inputs, random_mask

KINDS = {
    "flex_s": (ff.flex_s_attention, ff.flex_s_attention_backward, ("omega",)),
    "flex_n": (ff.flex_n_attention, ff.flex_n_attention_backward, ("omega1", "omega2", "tau")),
    "performer": (ff.performer_attention, ff.performer_attention_backward, ("omega",)),
    "hedgehog": (ff.hedgehog_attention, ff.hedgehog_attention_backward, ("W",)),
    "linear": (ff.linear_attention, ff.linear_attention_backward, ()),
}


def _case(kind, B, H, N, dtype, seed=0):
    x = make_inputs(B=B, H=H, Nq=N, d=5, e=4, m=6, dtype=dtype, seed=seed)
    if kind == "performer":
        x["omega"] = ff.init.performer_omega(H, 6, 5, rng=seed, dtype=dtype)
    if kind == "hedgehog":
        x["W"] = ff.init.hedgehog_weights(H, 5, 6, rng=seed, dtype=dtype)
    if kind == "linear":
        x["q"], x["k"] = np.abs(x["q"]), np.abs(x["k"])
    fwd, bwd, names = KINDS[kind]
    return fwd, bwd, [x["q"], x["k"], x["v"]] + [x[n] for n in names], {n: x[n] for n in names}


@pytest.mark.parametrize("shape", [(2, 3, 150), (1, 1, 300)], ids=["pairs", "segments"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_backward_with_the_key_state_is_identical(kind, dtype, shape, threads):
    fwd, bwd, args, _ = _case(kind, *shape, dtype)
    mask = random_mask(shape[0], shape[2])
    out, guard, state = fwd(*args, key_mask=mask, return_guard_count=True, return_key_state=True)
    np.testing.assert_array_equal(out, fwd(*args, key_mask=mask))
    dout = np.random.default_rng(5).standard_normal(out.shape).astype(dtype)
    plain = bwd(dout, *args, key_mask=mask)
    cached = bwd(dout, *args, key_mask=mask, key_state=state)
    assert len(plain) == len(cached)
    for a, b in zip(plain, cached):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["flex_n", "hedgehog", "linear"])
def test_key_state_holds_the_sums_it_stands_for(kind):
    fwd, _, args, params = _case(kind, 2, 2, 40, np.float64)
    mask = random_mask(2, 40)
    _, state = fwd(*args, key_mask=mask, return_key_state=True)
    k, v = args[1], args[2]
    f, s = features(kind, k, params)
    s = np.where(mask[:, None, :], s, -np.inf)
    M = s.max(-1)
    w = np.exp(s - M[..., None])
    F, e = f.shape[-1], v.shape[-1]
    P = F * e + F + 2  # [S, z, R, M], then zeros up to a multiple of 16
    assert state.shape == (2, 2, P + (-P) % 16)
    assert not state[..., P:].any()
    np.testing.assert_allclose(state[..., :F * e].reshape(2, 2, F, e), np.einsum("bhj,bhjf,bhje->bhfe", w, f, v),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state[..., F * e:F * e + F], np.einsum("bhj,bhjf->bhf", w, f), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state[..., F * e + F], w.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(state[..., F * e + F + 1], M, rtol=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 150), (1, 1, 300)], ids=["pairs", "segments"])
def test_key_state_padding_is_zero(shape, threads):
    """Each (b, h)'s packed state ends in zeros up to a multiple of 16 elements, whether it
    was written in place (pairs) or merged from segments in the workspace (one pair cut
    across the threads)."""
    fwd, _, args, _ = _case("flex_n", *shape, np.float32)
    _, state = fwd(*args, return_key_state=True)
    F, e = 12, 4  # F = 2m features, m = 6
    P = F * e + F + 2
    assert state.shape == shape[:2] + (P + (-P) % 16,) == shape[:2] + (_C.packed_state_length(F, e),)
    assert not state[..., P:].any()
    assert np.all(np.isfinite(state[..., :P]))


def test_key_state_errors():
    fwd, bwd, args, _ = _case("flex_n", 2, 3, 20, np.float32)
    _, state = fwd(*args, return_key_state=True)
    dout = np.ones((2, 3, 20, 4), np.float32)
    # causal=True: tests/test_projections.py, test_saved_arrays_are_refused_on_causal_calls
    with pytest.raises(ValueError, match=r"key_state must have shape \(B, H, S\) = \(2, 3, 64\)"):
        bwd(dout, *args, key_state=state[..., :-1])
    with pytest.raises(ValueError, match="key_state"):
        bwd(dout, *args, key_state=state[:1])
    with pytest.raises(TypeError, match="return_key_state must be a bool"):
        fwd(*args, return_key_state=1)
    with pytest.raises(TypeError, match="key_state"):
        bwd(dout, *args, key_state="state")
    # the other dtype: tests/test_projections.py, test_saved_arrays_in_the_other_dtype_...
