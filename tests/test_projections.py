"""Kept projections: the bidirectional forward of flex_s and flex_n returns the queries' and
keys' projections onto the frequencies, and the backward reads them instead of computing
them again. They must equal an independent NumPy product, and the gradients must be the
ones computed without them, bit for bit (to rounding after a forward of a few rows)."""
import numpy as np
import pytest

import flexformer as ff
from flexformer import _C, functional

from conftest import make_inputs, random_mask

KINDS = {
    "flex_s": (ff.flex_s_attention, ff.flex_s_attention_backward, ("omega",)),
    "flex_n": (ff.flex_n_attention, ff.flex_n_attention_backward, ("omega1", "omega2", "tau")),
}


def _case(kind, B, H, Nq, Nk, dtype, seed=0):
    x = make_inputs(B=B, H=H, Nq=Nq, Nk=Nk, d=5, e=4, m=6, dtype=dtype, seed=seed)
    fwd, bwd, names = KINDS[kind]
    return fwd, bwd, [x["q"], x["k"], x["v"]] + [x[n] for n in names], x


def _reference_projections(kind, x, mask):
    """[q W^T ; k W^T] per (batch, head) in float64, W = omega or [omega1; omega2], with
    masked keys' rows zero (the kernel projects the keys as its sweep takes them)."""
    W = x["omega"] if kind == "flex_s" else np.concatenate([x["omega1"], x["omega2"]], axis=1)
    W = W.astype(np.float64)
    pq = np.einsum("bhnd,hrd->bhnr", x["q"].astype(np.float64), W)
    pk = np.einsum("bhnd,hrd->bhnr", x["k"].astype(np.float64), W)
    if mask is not None:
        pk = pk * mask[:, None, :, None]
    return np.concatenate([pq, pk], axis=2)


@pytest.mark.parametrize("shape", [(2, 3, 150, 130), (1, 1, 300, 300)], ids=["pairs", "segments"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("masked", [False, True], ids=["all-keys", "masked"])
def test_backward_with_kept_projections_is_identical(kind, dtype, shape, masked, threads):
    B, H, Nq, Nk = shape
    fwd, bwd, args, x = _case(kind, B, H, Nq, Nk, dtype)
    mask = random_mask(B, Nk) if masked else None
    out, state, kept = fwd(*args, key_mask=mask, return_key_state=True, return_projections=True)
    np.testing.assert_array_equal(out, fwd(*args, key_mask=mask))
    R = 6 if kind == "flex_s" else 12
    assert kept.shape == (B, H, Nq + Nk, R) and kept.dtype == dtype
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(kept, _reference_projections(kind, x, mask), rtol=tol, atol=tol)
    dout = np.random.default_rng(5).standard_normal(out.shape).astype(dtype)
    plain = bwd(dout, *args, key_mask=mask)
    for extra in ({"projections": kept}, {"projections": kept, "key_state": state}):
        got = bwd(dout, *args, key_mask=mask, **extra)
        assert len(got) == len(plain)
        for a, b in zip(plain, got):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kept_projections_streamed_to_unaligned_rows(kind, dtype, threads):
    """The forward streams each block's projections to the kept array 16 bytes at a time,
    with plain copies for a block's unaligned head and its tail: m = 5 makes rows of 20 or
    40 bytes (float32) so that blocks, and the keys' part after 67 query rows, start off
    the 16-byte grid, and 67 / 70 rows end in partial blocks."""
    x = make_inputs(B=2, H=3, Nq=67, Nk=70, d=7, e=3, m=5, dtype=dtype, seed=11)
    fwd, bwd, names = KINDS[kind]
    args = [x["q"], x["k"], x["v"]] + [x[n] for n in names]
    out, kept = fwd(*args, return_projections=True)
    R = 5 if kind == "flex_s" else 10
    assert kept.shape == (2, 3, 137, R)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(kept, _reference_projections(kind, x, None), rtol=tol, atol=tol)
    dout = np.random.default_rng(12).standard_normal(out.shape).astype(dtype)
    for a, b in zip(bwd(dout, *args), bwd(dout, *args, projections=kept)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gradients_through_kept_projections_match_finite_differences(kind):
    """The float64 gradients read through the kept projections against central
    differences of the forward (independent of any backward code path)."""
    fwd, bwd, args, x = _case(kind, 1, 2, 12, 10, np.float64, seed=3)
    mask = random_mask(1, 10, seed=4)
    out, kept = fwd(*args, key_mask=mask, return_projections=True)
    dout = np.random.default_rng(6).standard_normal(out.shape)
    grads = bwd(dout, *args, key_mask=mask, projections=kept)
    rng = np.random.default_rng(7)
    for i, a in enumerate(args):
        for _ in range(3):
            idx = tuple(int(rng.integers(n)) for n in a.shape)
            h = 1e-6
            plus, minus = [list(args) for _ in range(2)]
            plus[i], minus[i] = a.copy(), a.copy()
            plus[i][idx] += h
            minus[i][idx] -= h
            num = np.sum(dout * (fwd(*plus, key_mask=mask) - fwd(*minus, key_mask=mask))) / (2 * h)
            assert abs(grads[i][idx] - num) <= 1e-6 * max(1.0, abs(num)), (i, idx, grads[i][idx], num)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_projections_of_a_few_row_forward(kind, dtype):
    """At most 8 query and 8 key rows the forward projects with row dots (a recurrent
    step's path): the kept projections are those, and the gradients read through them
    agree with the recomputing backward to rounding."""
    fwd, bwd, args, x = _case(kind, 2, 2, 5, 7, dtype)
    out, kept = fwd(*args, return_projections=True)
    np.testing.assert_array_equal(out, fwd(*args))
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(kept, _reference_projections(kind, x, None), rtol=tol, atol=tol)
    dout = np.random.default_rng(5).standard_normal(out.shape).astype(dtype)
    for a, b in zip(bwd(dout, *args), bwd(dout, *args, projections=kept)):
        np.testing.assert_allclose(b, a, rtol=50 * tol, atol=50 * tol)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_projections_are_written_where_no_key_is_visible(kind):
    """A batch row whose keys are all masked has zero outputs and gradients; its kept
    projections are written all the same (the array is not cleared before the kernel)."""
    fwd, bwd, args, x = _case(kind, 2, 2, 130, 70, np.float64)
    mask = random_mask(2, 70)
    mask[1] = False
    for _ in range(3):  # later calls reuse cached pages that held other values
        out, kept = fwd(*args, key_mask=mask, return_projections=True)
        np.testing.assert_allclose(kept, _reference_projections(kind, x, mask), rtol=1e-12, atol=1e-12)
        args = [a * 1.5 if i < 2 else a for i, a in enumerate(args)]
        x = dict(x, q=args[0], k=args[1])
    assert not out[1].any()


def test_the_registry_and_the_kernels_agree_on_who_keeps_projections():
    """spec.projections (derived from _C.projection_kinds, from csrc/kinds.h) is exactly the
    set of kinds whose kernel accepts return_projections, and a kept forward's projections
    make spec.backward give the same gradients."""
    keeping = set()
    for name in ff.attention_kinds():
        spec = ff.get_attention(name)
        x = make_inputs(B=1, H=2, Nq=20, d=5, e=4, m=6)
        kw = {"max_len": 20} if name == "linformer" else {}
        p = spec.init(2, 5, num_features=6, rng=0, **kw)
        if not spec.projections:
            with pytest.raises(ValueError, match="projections"):
                spec.forward(x["q"], x["k"], x["v"], p, return_projections=True)
            continue
        keeping.add(spec.kernel)
        out, kept = spec.forward(x["q"], x["k"], x["v"], p, return_projections=True)
        dout = np.ones_like(out)
        a = spec.backward(dout, x["q"], x["k"], x["v"], p)
        b = spec.backward(dout, x["q"], x["k"], x["v"], p, projections=kept)
        for u, w in zip(a[:3], b[:3]):
            np.testing.assert_array_equal(u, w)
        for n in a[3]:
            np.testing.assert_array_equal(a[3][n], b[3][n])
    assert keeping == set(_C.projection_kinds) == {"flex_s", "flex_n"}


@pytest.mark.parametrize("saved", ["key_state", "projections"])
def test_saved_arrays_are_refused_on_causal_calls(saved):
    """What a bidirectional forward keeps for its backward (the key state, the projections)
    has no causal counterpart: asked for or given with causal=True, refused by name."""
    fwd, bwd, args, _ = _case("flex_n", 2, 3, 20, 20, np.float32)
    kept = fwd(*args, **{f"return_{saved}": True})[1]
    dout = np.ones((2, 3, 20, 4), np.float32)
    with pytest.raises(ValueError, match=f"bidirectional attention only: {saved} / return_{saved} need causal=False"):
        fwd(*args, causal=True, **{f"return_{saved}": True})
    with pytest.raises(ValueError, match="bidirectional attention only"):
        bwd(dout, *args, causal=True, **{saved: kept})


@pytest.mark.parametrize("saved", ["key_state", "projections"])
def test_saved_arrays_in_the_other_dtype_are_converted_or_refused(saved):
    """A saved array handed to a float32 backward as float64 is converted (same gradients)
    or refused by name, never misread."""
    fwd, bwd, args, _ = _case("flex_n", 2, 3, 20, 16, np.float32)
    kept = fwd(*args, **{f"return_{saved}": True})[1]
    dout = np.ones((2, 3, 20, 4), np.float32)
    try:
        got = bwd(dout, *args, **{saved: kept.astype(np.float64)})
    except TypeError as exc:
        assert saved in str(exc)
    else:
        for a, b in zip(got, bwd(dout, *args, **{saved: kept})):
            np.testing.assert_array_equal(a, b)


def test_projection_errors():
    fwd, bwd, args, x = _case("flex_n", 2, 3, 20, 16, np.float32)
    _, kept = fwd(*args, return_projections=True)
    dout = np.ones((2, 3, 20, 4), np.float32)
    with pytest.raises(ValueError, match=r"projections must have shape \(B, H, Nq \+ Nk, R\) = \(2, 3, 36, 12\)"):
        bwd(dout, *args, projections=kept[..., :-1])
    with pytest.raises(ValueError, match="projections"):
        bwd(dout, *args, projections=kept[:, :, :20])
    with pytest.raises(TypeError, match="return_projections must be a bool"):
        fwd(*args, return_projections=1)
    with pytest.raises(TypeError, match="projections"):
        bwd(dout, *args, projections="kept")
    # the kinds without projections refuse them by name (their own functions have no such
    # keyword: Python's TypeError)
    om = ff.init.performer_omega(3, 6, 5, rng=0, dtype=np.float32)
    with pytest.raises(ValueError, match="performer keeps no projections"):
        functional.kernel_attention("performer", args[0], args[1], args[2], om, return_projections=True)
    with pytest.raises(ValueError, match="performer keeps no projections"):
        functional.kernel_attention_backward("performer", dout, args[0], args[1], args[2], om, projections=kept)
    with pytest.raises(ValueError, match="keeps no projections"):
        ff.get_attention("performer").backward(dout, *args[:3], {"omega": om}, projections=kept)
