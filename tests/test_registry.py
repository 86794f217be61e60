"""The registry: every kind's init / forward / backward, checked the same way."""
import numpy as np
import pytest

import flexformer as ff
from flexformer.testing import gradcheck

from conftest import random_mask


@pytest.mark.parametrize("name", ff.attention_kinds())
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_every_kind_gradients_through_the_registry(name, causal):
    kind = ff.get_attention(name)
    if causal and not kind.causal:
        pytest.skip(f"{name} has no causal mode")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 66, 3)) * 0.5 for _ in range(3))
    params = kind.init(2, 3, num_features=4, max_len=70, rng=1)
    assert set(params) == set(kind.params)
    mask = random_mask(1, 66, seed=2)
    learn = list(kind.learnable)

    def forward(q, k, v, *ps):
        return kind.forward(q, k, v, {**params, **dict(zip(learn, ps))}, causal=causal, key_mask=mask)

    def backward(do, q, k, v, *ps):
        dq, dk, dv, grads = kind.backward(do, q, k, v, {**params, **dict(zip(learn, ps))},
                                          causal=causal, key_mask=mask)
        assert set(grads) == set(learn)
        return (dq, dk, dv) + tuple(grads[n] for n in learn)

    gradcheck(forward, backward, (q, k, v) + tuple(params[n] for n in learn),
              names=("q", "k", "v") + tuple(learn))


@pytest.mark.parametrize("name", ff.attention_kinds())
def test_float32_params_and_inputs(name):
    kind = ff.get_attention(name)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 2, 40, 8)).astype(np.float32) * 0.5 for _ in range(3))
    params = kind.init(2, 8, max_len=40, num_features=8, rng=4, dtype=np.float32)
    out = kind.forward(q, k, v, params)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    dq, dk, dv, grads = kind.backward(np.ones_like(out), q, k, v, params)
    assert all(g.dtype == np.float32 for g in (dq, dk, dv, *grads.values()))


def test_rfa_is_flex_s_with_frozen_frequencies():
    rfa, flex = ff.get_attention("rfa"), ff.get_attention("flex_s")
    assert rfa.learnable == () and flex.learnable == ("omega",)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 20, 4)) for _ in range(3))
    params = rfa.init(2, 4, rng=6)
    np.testing.assert_array_equal(rfa.forward(q, k, v, params), flex.forward(q, k, v, params))
    assert rfa.backward(np.ones((1, 2, 20, 4)), q, k, v, params)[3] == {}


@pytest.mark.parametrize("name", ff.attention_kinds())
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_masked_keys_are_never_read(name, causal):
    """NaN and inf stored at masked key positions change nothing: outputs and gradients equal,
    bit for bit, those with zeros there (and dk, dv are 0 at the masked positions)."""
    kind = ff.get_attention(name)
    if causal and not kind.causal:
        pytest.skip(f"{name} has no causal mode")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 70, 3)) * 0.5 for _ in range(3))
    do = rng.standard_normal(v.shape)
    params = kind.init(2, 3, num_features=4, max_len=70, rng=1)
    mask = random_mask(2, 70, seed=6)
    mask[:, 0] = True  # every query sees a key in causal mode too
    clean_k, clean_v = k.copy(), v.copy()
    clean_k[~mask[:, None, :, None].repeat(2, 1).repeat(3, 3)] = 0
    clean_v[~mask[:, None, :, None].repeat(2, 1).repeat(3, 3)] = 0
    dirty_k, dirty_v = clean_k.copy(), clean_v.copy()
    hidden = np.argwhere(~mask)
    for n, (b, j) in enumerate(hidden):
        dirty_k[b, :, j] = [np.nan, np.inf, -np.inf][n % 3]
        dirty_v[b, :, j] = [np.inf, np.nan, -np.inf][n % 3]
    want = kind.forward(q, clean_k, clean_v, params, causal=causal, key_mask=mask)
    got = kind.forward(q, dirty_k, dirty_v, params, causal=causal, key_mask=mask)
    assert np.array_equal(got, want)
    want_g = kind.backward(do, q, clean_k, clean_v, params, causal=causal, key_mask=mask)
    got_g = kind.backward(do, q, dirty_k, dirty_v, params, causal=causal, key_mask=mask)
    for g, w in zip(got_g[:3], want_g[:3]):
        assert np.array_equal(g, w)
    for n in want_g[3]:
        assert np.array_equal(got_g[3][n], want_g[3][n]), n
    for b, j in hidden:
        assert not got_g[1][b, :, j].any() and not got_g[2][b, :, j].any()


@pytest.mark.parametrize("name", ff.attention_kinds())
def test_nan_in_a_query_row_gives_nan_in_that_row_only(name):
    kind = ff.get_attention(name)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 20, 3)) * 0.5 for _ in range(3))
    params = kind.init(2, 3, num_features=4, max_len=20, rng=1)
    q[0, 1, 4, 0] = np.nan
    out = kind.forward(q, k, v, params)
    assert np.isnan(out[0, 1, 4]).all()
    rest = np.ones(out.shape, bool)
    rest[0, 1, 4] = False
    assert np.isfinite(out[rest]).all()


def test_feature_sizes_read_the_parameters_by_name():
    """The feature size comes from the named frequency array, whatever order the dict has."""
    from flexformer.registry import num_features
    p = ff.get_attention("flex_n").init(2, 3, num_features=5, rng=0)
    reordered = {n: p[n] for n in ("tau", "omega2", "omega1")}
    assert num_features("flex_n", reordered, 3) == num_features("flex_n", p, 3) == 10
    assert num_features("flex_s", ff.get_attention("flex_s").init(2, 3, num_features=4, rng=0), 3) == 8


def test_parameter_names_and_layouts_come_from_the_c_table():
    """The registry reads each kind's parameters from csrc/kinds.h (``_C.kinds``); what a
    user sees must be the documented shapes, and every parameter init makes must fit them."""
    from flexformer.registry import check_param_shapes
    from flexformer.runtime import _C

    documented = {
        "flex_s": (("omega",), ("(H, m, d)",), ("omega",)),
        "rfa": (("omega",), ("(H, m, d)",), ()),
        "flex_n": (("omega1", "omega2", "tau"), ("(H, m, d)", "(H, m, d)", "(H,)"), ("omega1", "omega2", "tau")),
        "performer": (("omega",), ("(H, m, d)",), ()),
        "hedgehog": (("W",), ("(H, d, m)",), ("W",)),
        "rebased": (("gamma", "beta"), ("(H, d)", "(H, d)"), ("gamma", "beta")),
        "linformer": (("E", "F"), ("(H, kp, Nmax) or (kp, Nmax)",) * 2, ("E", "F")),
        "taylor": ((), (), ()), "softmax": ((), (), ()), "elu": ((), (), ()),
    }
    assert set(documented) == set(ff.attention_kinds())
    for name, (params, layouts, learnable) in documented.items():
        kind = ff.get_attention(name)
        assert (kind.params, kind.layouts, kind.learnable) == (params, layouts, learnable), name
        assert kind.causal == (name != "linformer") and kind.masks
        if kind.kernel is not None:
            row = _C.kinds[kind.kernel]
            assert row["linear"] and row["query"] == "q" and row["causal"]
        if name not in ("linformer",) and kind.params:
            check_param_shapes(name, kind.init(3, 5, num_features=7, rng=0), 3, 5)
    assert _C.kinds["linear"]["query"] == "phi_q" and not _C.kinds["softmax"]["linear"]
    assert set(_C.projection_kinds) == {k for k, row in _C.kinds.items() if row["keeps_projections"]}


@pytest.mark.parametrize("name", ff.attention_kinds())
def test_one_call_for_every_kind(name):
    """ff.attention / ff.attention_backward give every kind the same surface; where a named
    function exists they agree with it bit for bit, and with the quadratic-form reference."""
    from flexformer import reference

    kind = ff.get_attention(name)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 9, 4)) * 0.5 for _ in range(3))
    dout = rng.standard_normal(v.shape)
    params = kind.init(2, 4, num_features=5, max_len=9, rng=1)
    mask = random_mask(2, 9, seed=3)
    causal = kind.causal
    out = ff.attention(name, q, k, v, params or None, causal=causal, key_mask=mask)
    named = {"flex_s": ff.flex_s_attention, "flex_n": ff.flex_n_attention, "performer": ff.performer_attention,
             "hedgehog": ff.hedgehog_attention, "softmax": ff.softmax_attention,
             "linformer": ff.linformer_attention}.get(name)
    if named is not None:
        np.testing.assert_array_equal(out, named(q, k, v, *(params[n] for n in kind.params), causal=causal,
                                                 key_mask=mask))
    if name == "softmax":
        np.testing.assert_allclose(out, reference.softmax_attention(q, k, v, causal=True, key_mask=mask),
                                   rtol=1e-10, atol=1e-12)
    dq, dk, dv, dparams = ff.attention_backward(name, dout, q, k, v, params, causal=causal, key_mask=mask)
    want = kind.backward(dout, q, k, v, params, causal=causal, key_mask=mask)
    for got, ref in zip((dq, dk, dv), want[:3]):
        np.testing.assert_array_equal(got, ref)
    assert sorted(dparams) == sorted(kind.learnable)
    if kind.params:
        with pytest.raises(ValueError, match=f"params for {name} must hold"):
            ff.attention(name, q, k, v)
    with pytest.raises(ValueError, match="unknown attention kind"):
        ff.attention(name + "_x", q, k, v)


@pytest.mark.parametrize("kind", ff.attention_kinds())
def test_the_one_call_carries_every_option_of_the_named_functions(kind):
    """ff.attention / attention_backward with the guard count, the key state and the kept
    projections, for every kind that has them, and a clear refusal where a kind has not."""
    spec = ff.get_attention(kind)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 10, 4)) for _ in range(3))
    params = spec.init(2, 4, num_features=6, max_len=10, rng=1)
    g = rng.standard_normal(v.shape)
    plain = ff.attention(kind, q, k, v, params)
    if spec.key_state:
        out, guard, state = ff.attention(kind, q, k, v, params, return_guard_count=True, return_key_state=True)
        np.testing.assert_array_equal(out, plain)
        assert guard.shape == (2, 2) and guard.dtype == np.int64
        kept = ff.attention_backward(kind, g, q, k, v, params, key_state=state)
        again = ff.attention_backward(kind, g, q, k, v, params)
        for a, b in zip(kept[:3], again[:3]):
            np.testing.assert_array_equal(a, b)
        assert sorted(kept[3]) == sorted(again[3]) == sorted(spec.learnable)
    else:
        with pytest.raises(ValueError, match="key state"):
            ff.attention(kind, q, k, v, params, return_key_state=True)
    if spec.projections:
        out, proj = ff.attention(kind, q, k, v, params, return_projections=True)
        np.testing.assert_array_equal(out, plain)
        kept = ff.attention_backward(kind, g, q, k, v, params, projections=proj)
        again = ff.attention_backward(kind, g, q, k, v, params)
        for name in spec.learnable:
            np.testing.assert_array_equal(kept[3][name], again[3][name])
    else:
        with pytest.raises(ValueError, match="projections"):
            ff.attention(kind, q, k, v, params, return_projections=True)
