"""Every compiled instruction-set path of the dense products (and the GELU, the short
convolution and the bidirectional core's row passes) gives the same results.

The products include the few-row projection and a recurrent step's one-column and rank-1 paths.

The kernels pick AVX-512, AVX2 or baseline code at run time; FLEXFORMER_CPU_LEVEL caps
that choice (and FLEXFORMER_TILES picks among the two AVX-512 and the AVX2 product
copies at level 4, FLEXFORMER_OFF_LINE_ROWS whether an AVX-512 copy copies rows off a cache
line to its panel), so each path this machine can run is checked in a subprocess against the
float64 quadratic reference."""
import os
import subprocess
import sys

import pytest

CHECK = r"""
import numpy as np, flexformer as ff
from flexformer import reference as ref
from flexformer.testing import gradcheck
rng = np.random.default_rng(0)
for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
    # odd sizes: partial tiles in every dimension
    q, k, v = (rng.standard_normal((2, 3, 133, 7)).astype(dtype) * 0.5 for _ in range(3))
    o1, o2, tau = ff.init.flex_n_params(3, 11, 7, rng=1, dtype=dtype)
    o2 = (o2 + 0.2).astype(dtype)
    for causal in (False, True):
        got = ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
        want = ref.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), (dtype, causal)
        got = ff.softmax_attention(q, k, v, causal=causal)
        want = ref.softmax_attention(q, k, v, causal=causal)
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), (dtype, causal)
# few rows (the direct projection, a matrix times one vector), the one-column and rank-1
# products of a recurrent step; d = 37 leaves a tail past the last whole vector
from flexformer.recurrent import RecurrentAttention
for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
    for d in (7, 37):
        qs, ks, vs = (rng.standard_normal((2, 3, 9, d)).astype(dtype) * 0.5 for _ in range(3))
        o1, o2, tau = ff.init.flex_n_params(3, 11, d, rng=1, dtype=dtype)
        w = ff.init.flex_s_omega(3, 13, d, rng=2, dtype=dtype)
        for causal in (False, True):
            got = ff.flex_n_attention(qs[:, :, :5], ks[:, :, :6], vs[:, :, :6], o1, o2, tau) if not causal else \
                ff.flex_n_attention(qs[:, :, :5], ks[:, :, :5], vs[:, :, :5], o1, o2, tau, causal=True)
            n = 5 if causal else 6
            want = ref.flex_n_attention(qs[:, :, :5], ks[:, :, :n], vs[:, :, :n], o1, o2, tau, causal=causal)
            assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), ("few rows", dtype, d, causal)
        for kind, params in (("flex_n", {"omega1": o1, "omega2": o2, "tau": tau}), ("flex_s", {"omega": w})):
            rec = RecurrentAttention(kind, params)
            _, state = rec.prefill(qs[:, :, :8], ks[:, :, :8], vs[:, :, :8])
            got = rec.step(state, qs[:, :, 8:], ks[:, :, 8:], vs[:, :, 8:])
            full = (ref.flex_n_attention(qs, ks, vs, o1, o2, tau, causal=True) if kind == "flex_n"
                    else ref.flex_s_attention(qs, ks, vs, w, causal=True))
            assert np.max(np.abs(got - full[:, :, 8:])) <= tol * np.max(np.abs(full)), ("step", kind, dtype, d)
x = [a.astype(np.float64) for a in (q[:1, :1, :70, :3], k[:1, :1, :70, :3], v[:1, :1, :70, :3])]
W = ff.init.hedgehog_weights(1, 3, 5, rng=2)
gradcheck(ff.hedgehog_attention, ff.hedgehog_attention_backward, (*x, W), kwargs={"causal": True})
# the bidirectional backward's row passes (rowpass_tile.inc) and the flex feature-map
# gradients, with a key mask: 70 rows, a whole block and a partial one
keep = np.arange(70) % 5 != 3
gradcheck(ff.flex_n_attention, ff.flex_n_attention_backward,
          (*x, *ff.init.flex_n_params(1, 4, 3, rng=3)), kwargs={"key_mask": keep[None]})
gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward,
          (*x, ff.init.flex_s_omega(1, 4, 3, rng=4)), kwargs={"key_mask": keep[None]})
# the GELU's vectorised tanh, odd length (a partial vector at the end)
from flexformer.nn.core import GELU, gelu_reference
x = (rng.standard_normal(10_007) * 4).astype(np.float32)
dy = rng.standard_normal(x.shape).astype(np.float32)
layer = GELU()
y, dx = layer.forward(x), layer.backward(dy)
y_ref, dx_ref = gelu_reference(x.astype(np.float64), dy.astype(np.float64))
# (measured 3e-8 and 8e-8 of the largest value; NumPy's float32 formula gives 3e-8 and 9e-7)
assert np.max(np.abs(y - y_ref)) <= 3e-7 * np.max(np.abs(y_ref)), "gelu forward"
assert np.max(np.abs(dx - dx_ref)) <= 3e-7 * np.max(np.abs(dx_ref)), "gelu backward"
# the short convolution's loops, 37 channels (a partial vector), 4 taps, a sequence shorter
# than the window too
from flexformer import _C
from flexformer.nn.core import short_conv_reference
for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
    for n in (2, 19):
        x, dy = (rng.standard_normal((3, n, 37)).astype(dtype) for _ in range(2))
        w = rng.standard_normal((4, 37)).astype(dtype)
        got = (_C.short_conv_forward(x, w),) + _C.short_conv_backward(dy, x, w)
        want = short_conv_reference(*(a.astype(np.float64) for a in (x, w, dy)))
        for g, r in zip(got, want):
            assert np.max(np.abs(g - r)) <= tol * np.max(np.abs(r)), ("short conv", dtype, n)
# the exponential of the feature maps and softmax (exp.inc), and the kinds that use it
xe = rng.uniform(-87.0, 88.0, 1001).astype(np.float32)
assert np.max(np.abs(_C._exp(xe) / np.exp(xe.astype(np.float64)) - 1)) <= 1.5e-7, "exp"
qs, ks, vs = (rng.standard_normal((2, 3, 70, 37)).astype(np.float32) * 0.5 for _ in range(3))
for kind in ("performer", "hedgehog", "softmax", "linformer"):
    spec = ff.get_attention(kind)
    params = spec.init(3, 37, num_features=13, max_len=80, rng=1, dtype=np.float32)
    for causal in (False, True) if kind != "linformer" else (False,):
        got = spec.forward(qs, ks, vs, params, causal=causal)
        want = spec.forward(*(a.astype(np.float64) for a in (qs, ks, vs)),
                            {n: p.astype(np.float64) for n, p in params.items()}, causal=causal)
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), (kind, causal)
print("ok")
"""


@pytest.mark.parametrize("level,tiles,rows", [
    ("2", "", ""), ("3", "", ""), ("4", "avx2", ""), ("4", "avx512", "copy"),
    ("4", "avx512", "in_place"), ("4", "avx512_4x4", "copy"), ("4", "avx512_4x4", "in_place")])
def test_instruction_set_path(level, tiles, rows):
    env = dict(os.environ, FLEXFORMER_CPU_LEVEL=level, FLEXFORMER_TILES=tiles,
               FLEXFORMER_OFF_LINE_ROWS=rows)
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


# Results of a forward and backward pass of every mode, a few-row call and a recurrent step
# in both dtypes, as one hash of their bytes
RESULTS = r"""
import hashlib, numpy as np, flexformer as ff
from flexformer.recurrent import RecurrentAttention
rng = np.random.default_rng(3)
h = hashlib.sha256()
for dtype in (np.float32, np.float64):
    q, k, v, do = (rng.standard_normal((2, 3, 133, 37)).astype(dtype) * 0.5 for _ in range(4))
    o1, o2, tau = ff.init.flex_n_params(3, 19, 37, rng=1, dtype=dtype)
    w = ff.init.flex_s_omega(3, 70, 37, rng=2, dtype=dtype)  # 140 columns: whole tiles too
    for causal in (False, True):
        for f, g, p in ((ff.flex_n_attention, ff.flex_n_attention_backward, (o1, o2, tau)),
                        (ff.flex_s_attention, ff.flex_s_attention_backward, (w,))):
            h.update(f(q, k, v, *p, causal=causal).tobytes())
            for a in g(do, q, k, v, *p, causal=causal):
                h.update(a.tobytes())
    rec = RecurrentAttention("flex_n", {"omega1": o1, "omega2": o2, "tau": tau})
    out, state = rec.prefill(q[:, :, :100], k[:, :, :100], v[:, :, :100])
    h.update(out.tobytes())
    for t in range(100, 104):
        h.update(rec.step(state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]).tobytes())
# rows of 64 values on a cache line are read in place, rows off a line are first copied or
# read in place as FLEXFORMER_OFF_LINE_ROWS (or the timing) says (gemm_tile.inc): the same
# bits either way
def at_offset(a, offset):
    buf = np.empty(a.size + 128 // a.itemsize, a.dtype)  # room to reach any offset in a line
    start = (-buf.ctypes.data % 64 + offset) // a.itemsize
    out = buf[start:start + a.size].reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == offset
    return out
x4 = [(rng.standard_normal((1, 2, 130, 64)) * 0.5).astype(np.float32) for _ in range(4)]
o1, o2, tau = ff.init.flex_n_params(2, 64, 64, rng=5, dtype=np.float32)
runs = []
for offset in (0, 16):
    q, k, v, do = (at_offset(a, offset) for a in x4)
    p = [at_offset(a, offset) for a in (o1, o2)] + [tau]
    runs.append([ff.flex_n_attention(q, k, v, *p).tobytes()] +
                [g.tobytes() for g in ff.flex_n_attention_backward(do, q, k, v, *p)])
assert runs[0] == runs[1], "rows on and off a cache line differ"
h.update(b"".join(runs[0]))
paths = ff.dense_paths()
print(paths["products"], paths["off_line_rows"], h.hexdigest())
"""


def test_product_copies_give_bit_identical_results():
    """Level 4 times its two AVX-512 and its AVX2 product copies once and runs the fastest,
    then times whether that AVX-512 copy copies rows off a cache line to its panel or reads
    them in place: no choice may change a single bit of any result (FLEXFORMER_TILES and
    FLEXFORMER_OFF_LINE_ROWS force each)."""
    import flexformer as ff

    if ff.isa_level() < 4:
        pytest.skip("this CPU has no AVX-512: one product copy only")
    got = {}
    forced = [("avx2", ""), ("avx512", "copy"), ("avx512", "in_place"),
              ("avx512_4x4", "copy"), ("avx512_4x4", "in_place")]
    for tiles, rows in forced + [("", "")]:
        env = dict(os.environ, FLEXFORMER_TILES=tiles, FLEXFORMER_OFF_LINE_ROWS=rows)
        env.pop("FLEXFORMER_CPU_LEVEL", None)
        out = subprocess.run([sys.executable, "-c", RESULTS], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got[tiles, rows] = out.stdout.split()
    for tiles, rows in forced:
        # the AVX2 copy has no panel copy: it reads every row in place
        assert got[tiles, rows][:2] == [tiles, rows or "in_place"]
    assert got["", ""][0] in ("avx2", "avx512", "avx512_4x4")  # the timed choices
    assert got["", ""][1] in ("copy", "in_place")
    assert len({got[key][2] for key in got}) == 1, got


def test_dense_paths_names_and_bad_dtype():
    import numpy as np

    import flexformer as ff

    for dtype in (np.float32, np.float64):
        paths = ff.dense_paths(dtype)
        assert set(paths) == {"products", "row_dots", "off_line_rows"}
        assert paths["products"] in ("avx512", "avx512_4x4", "avx2", "base", "plain")
        assert paths["row_dots"] in ("avx2", "base", "plain")
        assert paths["off_line_rows"] in ("copy", "in_place")
        if paths["products"] not in ("avx512", "avx512_4x4"):
            assert paths["off_line_rows"] == "in_place"
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        ff.dense_paths(np.int32)


# Steps of every linear recurrent kind from saved states, in both dtypes, as one hash
STEPS = r"""
import hashlib, sys, numpy as np
from flexformer.recurrent import LinearAttentionState, RecurrentAttention
saved = np.load(sys.argv[1])
h = hashlib.sha256()
for name in sorted({n.rsplit("/", 1)[0] for n in saved.files}):
    kind = name.split("/")[0]
    params = {n.rsplit("/", 1)[1][2:]: saved[n] for n in saved.files if n.startswith(name + "/p_")}
    rec = RecurrentAttention(kind, params)
    state = LinearAttentionState(*(saved[f"{name}/{x}"] for x in "SzRM"))
    q, k, v = (saved[f"{name}/{x}"] for x in "qkv")
    for t in range(q.shape[2]):
        h.update(rec.step(state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]).tobytes())
    h.update(state.packed.tobytes())
print(h.hexdigest())
"""


def test_recurrent_steps_give_the_same_bits_at_levels_3_and_4(tmp_path):
    """A one-token step runs the AVX2 copies at most (FF_LEVEL_CAP in csrc/ff_common.h, a
    speed choice for Intel cores): from the same state, every linear kind's steps must give
    the bits the AVX-512 copies give, in both dtypes, so the cap changes no result."""
    import numpy as np

    import flexformer as ff
    from flexformer.recurrent import RecurrentAttention

    if ff.isa_level() < 4:
        pytest.skip("this CPU has no AVX-512: the cap changes nothing")
    rng = np.random.default_rng(5)
    saved = {}
    for kind in [k for k in ff.attention_kinds() if ff.get_attention(k).recurrent and k != "softmax"]:
        for dtype in (np.float32, np.float64):
            name = f"{kind}/{np.dtype(dtype).name}"
            params = ff.get_attention(kind).init(3, 37, num_features=19, rng=1, dtype=dtype)
            q, k, v = (rng.standard_normal((2, 3, 80, 37)).astype(dtype) * 0.5 for _ in range(3))
            _, state = RecurrentAttention(kind, params).prefill(q[:, :, :74], k[:, :, :74], v[:, :, :74])
            saved.update({f"{name}/p_{n}": p for n, p in params.items()})
            saved.update({f"{name}/{x}": getattr(state, x) for x in "SzRM"})
            saved.update({f"{name}/q": q[:, :, 74:], f"{name}/k": k[:, :, 74:], f"{name}/v": v[:, :, 74:]})
    path = str(tmp_path / "states.npz")
    np.savez(path, **saved)
    got = {}
    for level in ("3", ""):
        env = dict(os.environ, FLEXFORMER_CPU_LEVEL=level)
        out = subprocess.run([sys.executable, "-c", STEPS, path], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got[level] = out.stdout.strip()
    assert got["3"] == got[""]
