"""Recurrent inference: the step path against the parallel causal kernels and the
quadratic reference, prefill, state copies, bad inputs, the LM decode loop and the CLI."""
import os
import subprocess
import sys

import numpy as np
import pytest

import flexformer as ff
from flexformer import reference
from flexformer.nn import CausalLM, EncoderClassifier
from flexformer.recurrent import RECURRENT_KINDS, KVCacheState, LinearAttentionState, RecurrentAttention

from conftest import layout

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "austen")
TOL = {np.float64: 1e-10, np.float32: 2e-4}


def _setup(kind, dtype, B=1, H=2, N=64, d=6, seed=0, scale=0.6, m=5):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, N, d)).astype(dtype) * dtype(scale) for _ in range(3))
    params = {} if kind == "linear" else ff.get_attention(kind).init(H, d, num_features=m, rng=seed, dtype=dtype)
    if kind == "linear":  # the generic kind takes features: make them non-negative
        q, k = np.abs(q) + dtype(0.1), np.abs(k) + dtype(0.1)
    return RecurrentAttention(kind, params), q, k, v


def _rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-300))


def _step_all(rec, q, k, v, mask=None, state=None):
    B, H, N, d = q.shape
    state = rec.empty_state(B, H, d, v.shape[-1], q.dtype) if state is None else state
    outs = [rec.step(state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                     None if mask is None else mask[:, t:t + 1]) for t in range(N)]
    return np.concatenate(outs, axis=2), state


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_step_matches_parallel_over_thousands_of_tokens(kind, dtype):
    rec, q, k, v = _setup(kind, dtype, N=2048)
    par = rec.prefill(q, k, v)[0]  # the parallel causal C kernel
    out, state = _step_all(rec, q, k, v)
    assert out.dtype == dtype and state.tokens == 2048
    assert _rel(out, par.astype(np.float64)) < TOL[dtype]


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "linear"])
def test_step_matches_quadratic_reference(kind):
    rec, q, k, v = _setup(kind, np.float64, B=2, H=2, N=40)
    mask = np.random.default_rng(3).random((2, 40)) < 0.7
    p = rec.params
    if kind == "flex_n":
        ref = reference.flex_n_attention(q, k, v, p["omega1"], p["omega2"], p["tau"], causal=True, key_mask=mask)
    elif kind == "flex_s":
        ref = reference.flex_s_attention(q, k, v, p["omega"], causal=True, key_mask=mask)
    elif kind == "performer":
        ref = reference.performer_attention(q, k, v, p["omega"], causal=True, key_mask=mask)
    else:
        ref = reference.linear_attention(q, k, v, causal=True, key_mask=mask)
    out, _ = _step_all(rec, q, k, v, mask)
    assert _rel(out, ref) < 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "elu"])
def test_late_key_with_a_much_larger_norm(kind, dtype):
    """A late key whose log-scale dwarfs every earlier one rescales the state (no overflow)."""
    rec, q, k, v = _setup(kind, dtype, N=600, d=8, scale=0.5)
    k[:, :, 400] *= dtype(12.0)   # flex_s: s(k) goes from ~0.25 to ~40 (exp(40) in float32 would be 2e17)
    k[:, :, 500] *= dtype(25.0)
    par = rec.prefill(q, k, v)[0]
    out, state = _step_all(rec, q, k, v)
    assert np.isfinite(out).all() and np.isfinite(state.S).all()
    assert _rel(out, par.astype(np.float64)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_prefill_then_step_equals_all_parallel(kind, dtype):
    rec, q, k, v = _setup(kind, dtype, B=2, N=150)
    mask = np.random.default_rng(1).random((2, 150)) < 0.75
    full = rec.prefill(q, k, v, mask)[0].astype(np.float64)
    head, state = rec.prefill(q[:, :, :90], k[:, :, :90], v[:, :, :90], mask[:, :90])
    rest_one = rec.step(state.copy(), q[:, :, 90:], k[:, :, 90:], v[:, :, 90:], mask[:, 90:])  # 60 at once
    rest_each, _ = _step_all(rec, q[:, :, 90:], k[:, :, 90:], v[:, :, 90:], mask[:, 90:], state)
    assert _rel(np.concatenate([head, rest_one], 2), full) < TOL[dtype]
    assert _rel(np.concatenate([head, rest_each], 2), full) < TOL[dtype]
    assert state.tokens == 150


def test_multi_token_step_spans_several_chunks():
    rec, q, k, v = _setup("flex_n", np.float64, N=300)
    state = rec.empty_state(1, 2, 6, 6, np.float64)
    out = rec.step(state, q, k, v)   # 300 tokens > one 64-token block
    assert _rel(out, rec.prefill(q, k, v)[0]) < 1e-10


@pytest.mark.parametrize("kind", ["flex_n", "softmax"])
def test_state_copy_is_independent(kind):
    rec, q, k, v = _setup(kind, np.float64, N=30)
    _, state = rec.prefill(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    branch = state.copy()
    a = rec.step(state, q[:, :, 20:], k[:, :, 20:], v[:, :, 20:])
    # advancing the original left the copy where it was: the copy gives the same outputs again
    b = rec.step(branch, q[:, :, 20:], k[:, :, 20:], v[:, :, 20:])
    np.testing.assert_array_equal(a, b)
    # and advancing the copy with other tokens does not touch the original
    before = (state.S.copy(), state.z.copy()) if kind != "softmax" else (state.keys.copy(),)
    rec.step(branch, q[:, :, :5], k[:, :, :5], v[:, :, :5])
    after = (state.S, state.z) if kind != "softmax" else (state.keys,)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)


def test_state_memory_is_fixed_for_linear_kinds_and_grows_for_softmax():
    lin_rec, q, k, v = _setup("flex_n", np.float32, N=200)
    sm_rec = RecurrentAttention("softmax")
    _, lin_state = lin_rec.prefill(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    _, kv_state = sm_rec.prefill(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    lin0, kv0 = lin_state.nbytes, kv_state.nbytes
    lin_rec.step(lin_state, q[:, :, 10:], k[:, :, 10:], v[:, :, 10:])
    sm_rec.step(kv_state, q[:, :, 10:], k[:, :, 10:], v[:, :, 10:])
    # H = 2 packed states of F e + F + 2 = 72 (F = 2m = 10, e = 6), each padded to 80
    assert lin_state.nbytes == lin0 == 2 * 80 * 4
    assert kv_state.nbytes == 20 * kv0


def test_inputs_not_mutated():
    rec, q, k, v = _setup("flex_n", np.float32, N=20)
    copies = [x.copy() for x in (q, k, v)]
    _, state = rec.prefill(q, k, v)
    rec.step(state, q, k, v)
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)


@pytest.mark.parametrize("how", ["other byte order", "fortran", "strided"])
def test_steps_read_every_layout_alike(how):
    """A step hands the caller's arrays straight to the C kernel, which reads native,
    C-ordered, aligned ones in place and converts the rest: every layout gives the bits of
    the plain one, outputs and state."""
    rec, q, k, v = _setup("flex_n", np.float32, H=2, N=24)
    _, plain = rec.prefill(q[:, :, :12], k[:, :, :12], v[:, :, :12])
    other = plain.copy()
    for t in range(12, 24):
        rows = [np.ascontiguousarray(x[:, :, t:t + 1]) for x in (q, k, v)]
        want = rec.step(plain, *rows)
        got = rec.step(other, *[layout(x, how) for x in rows])
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(other.packed, plain.packed)


@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_steps_take_nested_lists_like_arrays(kind):
    """Array-likes pass wherever arrays do: the step's outputs, state and token count are
    those of the same numbers as arrays (the C step once advanced the state and then failed
    on ``q.shape`` of a list, leaving the token count behind)."""
    rec, q, k, v = _setup(kind, np.float64, H=2, N=10)
    _, plain = rec.prefill(q[:, :, :6], k[:, :, :6], v[:, :, :6])
    listed = plain.copy()
    for t in range(6, 10):
        rows = [x[:, :, t:t + 1] for x in (q, k, v)]
        want = rec.step(plain, *rows)
        got = rec.step(listed, *[x.tolist() for x in rows])
        np.testing.assert_array_equal(got, want)
    assert listed.tokens == plain.tokens == 10
    if isinstance(plain, LinearAttentionState):
        np.testing.assert_array_equal(listed.packed, plain.packed)
    else:
        np.testing.assert_array_equal(listed.keys, plain.keys)


def test_a_states_packed_array_cannot_be_replaced():
    """Steps update ``packed`` in place and S, z, R, M are views into it: putting another
    array in its place (None once made the next step start from an empty state) is refused;
    the views take assignments."""
    rec, q, k, v = _setup("flex_s", np.float64, N=4)
    _, state = rec.prefill(q, k, v)
    before = state.packed.copy()
    with pytest.raises(AttributeError):
        state.packed = None
    state.S = state.S * 2
    np.testing.assert_array_equal(state.S, 2 * before[..., :state.S[0, 0].size].reshape(state.S.shape))


def test_bad_inputs_raise_clear_errors():
    rec, q, k, v = _setup("flex_n", np.float32, N=8)
    state = rec.empty_state(1, 2, 6, 6, np.float32)
    with pytest.raises(ValueError, match=r"state has shape \(B, H, F, e\)"):
        rec.step(rec.empty_state(1, 2, 6, 4, np.float32), q, k, v)
    with pytest.raises(ValueError, match="state has shape"):
        rec.step(rec.empty_state(3, 2, 6, 6, np.float32), q, k, v)
    with pytest.raises(TypeError, match="state is float64"):
        rec.step(rec.empty_state(1, 2, 6, 6, np.float64), q, k, v)
    with pytest.raises(TypeError, match="LinearAttentionState"):
        rec.step(KVCacheState.empty(1, 2, 6, 6), q, k, v)
    with pytest.raises(TypeError, match="KVCacheState"):
        RecurrentAttention("softmax").step(state, q, k, v)
    for kind, want in (("flex_n", "LinearAttentionState"), ("elu", "LinearAttentionState"), ("softmax", "KVCacheState")):
        other = rec if kind == "flex_n" else RecurrentAttention(kind)
        for not_a_state in (None, "state"):
            with pytest.raises(TypeError, match=f"state for {kind} must be a {want} .* got {type(not_a_state).__name__}"):
                other.step(not_a_state, q, k, v)
    with pytest.raises(ValueError, match="inconsistent"):
        bad = state.copy()
        bad.z = bad.z[..., :3]
        rec.step(bad, q, k, v)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        rec.step(state, q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="q must be float32 or float64"):
        rec.step(state, q.astype(np.int32), k, v)
    with pytest.raises(ValueError, match="4-d"):
        rec.step(state, q[0], k, v)
    with pytest.raises(ValueError, match="must agree"):
        rec.step(state, q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="at least one token"):
        rec.step(state, q[:, :, :0], k[:, :, :0], v[:, :, :0])
    with pytest.raises(ValueError, match=r"key_mask must be a bool array of shape \(B, T\)"):
        rec.step(state, q, k, v, np.ones((1, 3), bool))
    with pytest.raises(ValueError, match=r"omega1 must have shape \(H, m, d\)"):
        rec.step(state, q[..., :4], k[..., :4], v)
    with pytest.raises(ValueError, match="no causal form"):
        RecurrentAttention("linformer")
    with pytest.raises(ValueError, match="missing tau"):
        RecurrentAttention("flex_n", {"omega1": rec.params["omega1"], "omega2": rec.params["omega2"]})
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0.0"):
        RecurrentAttention("elu", eps=0.0)
    with pytest.raises(ValueError, match="value_dim must be an int >= 1"):
        LinearAttentionState.empty(1, 1, 4, 0)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        LinearAttentionState.empty(1, 1, 4, 4, dtype=np.int64)
    assert state.tokens == 0  # nothing above advanced it


@pytest.mark.parametrize("call, exc, message", [
    (lambda c: c.append(np.zeros((1, 2, 3, 4), np.float32), np.zeros((1, 2, 2, 4), np.float32), np.ones((1, 3), bool)),
     ValueError, "v must have shape (B, H, T, e) = (1, 2, 3, 4), got (1, 2, 2, 4)"),
    (lambda c: c.append(np.zeros((1, 1, 3, 4), np.float32), np.zeros((1, 1, 3, 4), np.float32), np.ones((1, 3), bool)),
     ValueError, "k must have shape (B, H, T, d) = (1, 2, T, 4), got (1, 1, 3, 4)"),
    (lambda c: c.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)), np.ones((1, 3), bool)),
     TypeError, "k and v must have the cache's dtype float32, got float64 and float64"),
    (lambda c: c.append(np.zeros((1, 2, 3, 4), np.float32), np.zeros((1, 2, 3, 4), np.float32), np.ones((1, 3), int)),
     ValueError, "keep must be a bool array of shape (B, T) = (1, 3), got int64 (1, 3)"),
    (lambda c: KVCacheState.empty(1, 2, 4, 4, capacity=-1), ValueError, "capacity must be an int >= 0, got -1"),
    (lambda c: LinearAttentionState(None, None, None, None), TypeError, "S must have dtype float32 or float64, got object"),
    (lambda c: LinearAttentionState(np.zeros((2, 3, 4)), np.zeros((1, 2, 3)), np.zeros((1, 2)), np.zeros((1, 2))),
     ValueError, "S must be a 4-d array (B, H, F, e), got shape (2, 3, 4)"),
])
def test_states_built_or_grown_by_hand_are_checked(call, exc, message):
    cache = KVCacheState.empty(1, 2, 4, 4)
    with pytest.raises(exc) as err:
        call(cache)
    assert str(err.value) == message
    assert cache.tokens == 0


# ----------------------------------------------------------------- the model


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "hedgehog", "elu", "rfa", "softmax"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_lm_prefill_and_step_match_the_parallel_forward(kind, positional):
    model = CausalLM(40, dim=16, depth=2, heads=2, max_len=48, attention=kind, positional=positional,
                     dtype=np.float64, rng=2)
    ids = np.random.default_rng(0).integers(0, 40, (2, 48))
    full = model.forward(ids)
    logits, cache = model.prefill(ids[:, :20])
    steps = [model.step(ids[:, t:t + 1], cache) for t in range(20, 48)]
    assert cache.position == 48
    assert _rel(np.concatenate([logits] + steps, 1), full) < 1e-10


def test_layer_decoding_reuses_its_recurrence_and_sees_parameter_changes():
    """MultiHeadAttention.recurrent() is built once, returned again while eps and the
    parameter arrays stay the same objects, and the steps follow in-place updates and
    replaced arrays alike: each step equals the parallel causal forward of that moment."""
    from flexformer.nn import MultiHeadAttention
    rng = np.random.default_rng(3)
    layer = MultiHeadAttention(16, 2, "flex_n", rng, causal=True, dtype=np.float64)
    x = rng.standard_normal((1, 12, 16))
    rec = layer.recurrent()
    assert layer.recurrent() is rec

    def step_matches_parallel():
        _, state = layer.prefill(x[:, :11])
        got = layer.step(x[:, 11:], state)
        np.testing.assert_allclose(got, layer.forward(x)[:, 11:], rtol=1e-10, atol=1e-12)

    step_matches_parallel()
    omega1 = layer.kernel["omega1"]
    omega1.value *= 1.5  # in place: the same recurrence, which holds this very array
    assert layer.recurrent() is rec
    step_matches_parallel()
    omega1.value = omega1.value[::-1].copy()  # a new array (a loaded checkpoint)
    assert layer.recurrent() is not rec
    step_matches_parallel()
    rec = layer.recurrent()
    layer.eps = 1e-3
    assert layer.recurrent() is not rec and layer.recurrent().eps == 1e-3


def test_models_that_decoded_still_copy_and_pickle():
    """A layer's cached recurrence stays behind in copies and pickles: a deep copy decodes
    with its own parameters, and a model pickles after decoding as before."""
    import copy
    import pickle
    model = CausalLM(30, dim=16, depth=2, heads=2, max_len=32, attention="flex_n", dtype=np.float64, rng=5)
    prompt = np.array([3, 1, 4, 1, 5])
    model.generate(prompt, 3, temperature=0)
    clone = copy.deepcopy(model)
    for name, p in clone.named_parameters():
        if name.endswith("omega1"):
            p.value *= 2.0  # in place, in the copy only
    ids = np.random.default_rng(0).integers(0, 30, (1, 12))
    logits, cache = clone.prefill(ids[:, :5])
    steps = [clone.step(ids[:, t:t + 1], cache) for t in range(5, 12)]
    assert _rel(np.concatenate([logits] + steps, 1), clone.forward(ids)) < 1e-10
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.generate(prompt, 6, temperature=0), model.generate(prompt, 6, temperature=0))


def test_lm_generate_greedy_is_argmax_of_the_parallel_forward():
    model = CausalLM(30, dim=16, depth=2, heads=2, max_len=32, attention="flex_n", dtype=np.float64, rng=5)
    prompt = np.array([3, 1, 4, 1, 5])
    new = model.generate(prompt, 12, temperature=0)
    seq = np.concatenate([prompt, new])
    logits = model.forward(seq[None, :-1])
    np.testing.assert_array_equal(new, logits[0, len(prompt) - 1:].argmax(-1))
    streamed = []
    a = model.generate(prompt, 10, temperature=0.8, top_k=4, rng=7, on_token=streamed.append)
    b = model.generate(prompt, 10, temperature=0.8, top_k=4, rng=7)
    np.testing.assert_array_equal(a, b)
    assert streamed == list(a)


def test_lm_generate_limits_and_errors():
    model = CausalLM(30, dim=16, depth=1, heads=2, max_len=16, attention="flex_n", rng=0)
    with pytest.raises(ValueError, match="past the model's max_len 16"):
        model.generate(np.arange(10), 10)
    sinus = CausalLM(30, dim=16, depth=1, heads=2, max_len=16, attention="flex_n", positional="sinusoidal", rng=0)
    assert sinus.generate(np.arange(10), 40, rng=0).shape == (40,)  # sinusoidal positions run on
    for bad, match in (({"num_tokens": -1}, "num_tokens"), ({"temperature": -1.0}, "temperature"),
                       ({"top_k": 0}, "top_k"), ({"top_k": 31}, "top_k")):
        kw = dict(num_tokens=3)
        kw.update(bad)
        with pytest.raises(ValueError, match=match):
            sinus.generate(np.arange(3), **kw)
    with pytest.raises(ValueError, match="prompt must be a non-empty 1-d"):
        sinus.generate(np.zeros((2, 2), int), 3)
    with pytest.raises(ValueError, match="ids must lie in 0..29"):
        sinus.generate(np.array([30]), 3)


def test_lm_step_checks_its_cache_and_tokens():
    """A step names what is wrong with its cache or ids in the model's terms; it once took
    prefill's whole (logits, cache) pair to an AttributeError, and a cache of fewer layers
    (zip stopped early) to a silent answer."""
    model = CausalLM(30, dim=16, depth=2, heads=2, max_len=16, attention="flex_n", rng=0)
    logits, cache = model.prefill(np.array([[1, 2, 3]]))
    with pytest.raises(TypeError, match="cache must be a DecodeCache .* got tuple"):
        model.step(np.array([[4]]), (logits, cache))
    shallow = CausalLM(30, dim=16, depth=1, heads=2, max_len=16, attention="flex_n", rng=0)
    with pytest.raises(ValueError, match="cache holds states for 2 layers, but this model has 1"):
        shallow.step(np.array([[4]]), cache)
    with pytest.raises(ValueError, match=r"ids must hold at least one token \(B, T >= 1\), got shape \(1, 0\)"):
        model.step(np.zeros((1, 0), int), cache)
    assert cache.position == 3  # nothing above advanced it
    want = model.forward(np.array([[1, 2, 3, 4]]))[:, 3:]
    np.testing.assert_allclose(model.step(np.array([[4]]), cache), want, rtol=2e-4, atol=2e-5)


def test_encoder_classifier_names_num_classes():
    with pytest.raises(ValueError, match="num_classes must be an int >= 1, got 0"):
        EncoderClassifier(30, 0)


def _train_tiny_lm(run, *options, steps=5, depth=1):
    """A tiny text-lm run folder (sinusoidal positions) trained by the command line."""
    subprocess.run([sys.executable, "-m", "flexformer", "train", "--task", "text-lm", "--data-dir", DATA,
                    "--steps", str(steps), "--seq-len", "32", "--dim", "16", "--heads", "2", "--depth", str(depth),
                    "--positional", "sinusoidal", "--eval-batches", "1", "--quiet", "--out", str(run), *options],
                   check=True, capture_output=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs ../shared/data/austen")
def test_generate_command_streams_text_from_a_checkpoint(tmp_path):
    run = tmp_path / "lm"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    _train_tiny_lm(run)
    done = subprocess.run([sys.executable, "-m", "flexformer", "generate", "--checkpoint", str(run), "--prompt",
                           "Emma", "--tokens", "60", "--top-k", "8", "--seed", "3"],
                          capture_output=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"Emma") and len(done.stdout) == 4 + 60 + 1
    assert b"ms per token" in done.stderr
    again = subprocess.run([sys.executable, "-m", "flexformer", "generate", "--checkpoint", str(run), "--prompt",
                            "Emma", "--tokens", "60", "--top-k", "8", "--seed", "3"], capture_output=True, env=env)
    assert again.stdout == done.stdout   # same seed, same text
    # a classifier checkpoint is refused with the reason
    cls = tmp_path / "cls"
    subprocess.run([sys.executable, "-m", "flexformer", "train", "--steps", "2", "--seq-len", "32", "--dim", "16",
                    "--heads", "2", "--depth", "1", "--eval-batches", "1", "--quiet", "--out", str(cls)],
                   check=True, capture_output=True, env=env)
    bad = subprocess.run([sys.executable, "-m", "flexformer", "generate", "--checkpoint", str(cls), "--prompt",
                          "x"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "needs a text-lm checkpoint" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "flexformer", "generate", "--checkpoint",
                              str(tmp_path / "none"), "--prompt", "x"], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr



@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs ../shared/data/austen")
def test_generate_command_decodes_a_model_with_short_convolutions_greedily_like_the_parallel_model(tmp_path):
    from flexformer.training import load_model, save_checkpoint

    run = tmp_path / "lm"
    _train_tiny_lm(run, "--short-conv", "4", steps=20, depth=2)
    # a few steps hardly move the taps from the identity: move them, so the decoded text
    # depends on what the decoding state keeps of the last three positions
    model, cfg, meta = load_model(str(run))
    rng = np.random.default_rng(0)
    params = {name: value + (0.5 * rng.standard_normal(value.shape)).astype(value.dtype) if ".conv_" in name
              else value for name, value in model.parameters().items()}
    save_checkpoint(str(run / "checkpoint.npz"), params, {}, {"step": meta["step"], "config": cfg.__dict__})
    done = subprocess.run([sys.executable, "-m", "flexformer", "generate", "--checkpoint", str(run), "--prompt",
                           "Emma was", "--tokens", "24", "--temperature", "0"], capture_output=True,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    model, cfg, _ = load_model(str(run))
    assert cfg.short_conv == 4
    text = done.stdout
    assert text.startswith(b"Emma was") and len(text) == 8 + 24 + 1
    ids = list(text[:-1])
    for t in range(8, 8 + 24):  # greedy decoding by whole forward passes, no recurrent state
        logits = model.forward(np.array([ids[:t]]))[0, -1]
        best = int(np.argmax(logits))
        if best != ids[t]:  # float32: only a near tie may go the other way
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] < 1e-4, (t, best, ids[t])
            break

C_KINDS = [k for k in RECURRENT_KINDS if RecurrentAttention(k, _setup(k, np.float64)[0].params)._kernel is not None]


def test_the_c_step_serves_every_kind_with_a_c_kernel():
    # elu's forward is Python (its features, then the generic kernel): it steps in NumPy
    assert set(C_KINDS) == set(RECURRENT_KINDS) - {"softmax", "elu"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", C_KINDS)
@pytest.mark.parametrize("d,m", [(6, 5), (16, 13), (64, 64), (40, 6)])
def test_c_state_matches_the_numpy_recurrence(kind, dtype, d, m):
    """The C kernel continuing a packed state against the NumPy recurrence of this module
    (features from the NumPy twins, _absorb / _advance): outputs and every part of the state.
    Head sizes of whole vectors and feature counts that leave a partial group of rows reach
    the steps' row dots (q and k in one pass, a vector epilogue); the state is compared too
    because the outputs alone cannot see frequencies permuted alike for q and k."""
    rec, q, k, v = _setup(kind, dtype, B=2, N=300, d=d, m=m)
    mask = np.random.default_rng(2).random((2, 300)) < 0.8
    twin = RecurrentAttention(kind, rec.params)
    twin._kernel = None  # the NumPy path
    for r in (rec, twin):
        r.out, r.state = r.prefill(q[:, :, :100], k[:, :, :100], v[:, :, :100], mask[:, :100])
        r.outs = [r.out, r.step(r.state, q[:, :, 100:170], k[:, :, 100:170], v[:, :, 100:170], mask[:, 100:170])]
        r.outs += [r.step(r.state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], mask[:, t:t + 1])
                   for t in range(170, 300)]
    assert _rel(np.concatenate(rec.outs, 2), np.concatenate(twin.outs, 2).astype(np.float64)) < TOL[dtype]
    a, b = rec.state, twin.state
    np.testing.assert_allclose(a.M, b.M, rtol=TOL[dtype])  # both hold the largest key log-scale seen
    for x, y in ((a.S, b.S), (a.z, b.z), (a.R, b.R)):
        assert _rel(x, y.astype(np.float64)) < TOL[dtype]
    assert a.tokens == b.tokens == 300


@pytest.mark.parametrize("threads", [1, 2])
def test_carried_state_through_the_split_path(threads):
    """One (b,h) on 2 threads cuts the sequence into segments; the carried state enters the
    first and leaves the last."""
    rec, q, k, v = _setup("flex_n", np.float64, B=1, H=1, N=700)
    mask = np.random.default_rng(4).random((1, 700)) < 0.9
    p = rec.params
    ref = reference.flex_n_attention(q, k, v, p["omega1"], p["omega2"], p["tau"], causal=True, key_mask=mask)
    old = ff.get_num_threads()
    ff.set_num_threads(threads)
    try:
        head, state = rec.prefill(q[:, :, :300], k[:, :, :300], v[:, :, :300], mask[:, :300])
        tail = rec.step(state, q[:, :, 300:], k[:, :, 300:], v[:, :, 300:], mask[:, 300:])
    finally:
        ff.set_num_threads(old)
    assert _rel(np.concatenate([head, tail], 2), ref) < 1e-10


def test_kernel_state_argument_is_checked():
    from flexformer import _C
    rec, q, k, v = _setup("flex_s", np.float32, N=4)
    om = rec.params["omega"]
    st = rec.empty_state(1, 2, 6, 6, np.float32).packed
    with pytest.raises(ValueError, match="needs causal=True"):
        _C.flex_s_forward(q, k, v, om, state=st)
    with pytest.raises(TypeError, match="state must be float32"):
        _C.flex_s_forward(q, k, v, om, causal=True, state=st.astype(np.float64))
    with pytest.raises(TypeError, match="state must be a numpy array"):
        _C.flex_s_forward(q, k, v, om, causal=True, state=st.tolist())
    with pytest.raises(ValueError, match=r"state must have shape \(B, H, S\)"):
        _C.flex_s_forward(q, k, v, om, causal=True, state=st[:, :1])
    with pytest.raises(ValueError, match="C-contiguous, aligned and writeable"):
        ro = st.copy()
        ro.flags.writeable = False
        _C.flex_s_forward(q, k, v, om, causal=True, state=ro)
    with pytest.raises(ValueError, match="C-contiguous"):
        _C.flex_s_forward(q, k, v, om, causal=True, state=np.zeros((1, 2, 2 * st.shape[2]), np.float32)[..., ::2])
    big = np.zeros(q.size + st.size, np.float32)
    q2, st2 = big[: q.size].reshape(q.shape), big[q.size:].reshape(st.shape)
    q2[...] = q
    with pytest.raises(ValueError, match="state shares memory with q"):
        _C.flex_s_forward(q2, k, v, om, causal=True, state=big[2:2 + st.size].reshape(st.shape))
    _C.flex_s_forward(q2, k, v, om, causal=True, state=st2)  # adjacent is fine
    np.testing.assert_array_equal(q2, q)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind,name", [("flex_n", "omega1"), ("flex_n", "omega2"), ("flex_s", "omega")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_step_with_a_non_finite_frequency_raises_and_keeps_its_state(kind, name, bad, dtype, threads):
    """A step (a causal continuation of <= 8 rows) checks its features rather than every
    frequency; a non-finite frequency is still named, and the state has not moved. One bad
    element in the last head, where q and k are zero on its column (inf * 0 = NaN too)."""
    rec, q, k, v = _setup(kind, dtype, B=2, H=3, N=12)
    _, state = rec.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    before = state.packed.copy()
    params = {n: a.copy() for n, a in rec.params.items()}
    params[name][2, 1, 4] = bad
    q2, k2 = q.copy(), k.copy()
    q2[..., 4] = 0
    k2[..., 4] = 0
    broken = RecurrentAttention(kind, params)
    for rows in (1, 4):
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            broken.step(state, q2[:, :, 8:8 + rows], k2[:, :, 8:8 + rows], v[:, :, 8:8 + rows])
        np.testing.assert_array_equal(state.packed, before)
        assert state.tokens == 8


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["flex_n", "flex_s"])
def test_a_step_with_non_finite_inputs_runs_as_before(kind, dtype, threads):
    """Non-finite queries or keys (not parameters) make the checked features non-finite;
    the step then runs as the unchecked kernel does: NaN reaches the rows it touches."""
    rec, q, k, v = _setup(kind, dtype, B=1, H=2, N=10)
    _, state = rec.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    clean = state.copy()
    want = rec.step(clean, q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9])
    qn = q[:, :, 8:9].copy()
    qn[0, 1, 0, 2] = np.nan  # head 1's query only: its output row is NaN, the state as without it
    got = rec.step(state, qn, k[:, :, 8:9], v[:, :, 8:9])
    assert np.isnan(got[0, 1]).all()
    np.testing.assert_array_equal(got[0, 0], want[0, 0])
    np.testing.assert_array_equal(state.packed, clean.packed)
    kn = k[:, :, 9:10].copy()
    kn[0, 0, 0, 1] = np.inf  # a non-finite key enters head 0's state, as documented
    rec.step(state, q[:, :, 9:10], kn, v[:, :, 9:10])
    assert not np.isfinite(state.S[0, 0]).all() and np.isfinite(state.S[0, 1]).all()
    assert state.tokens == 10
