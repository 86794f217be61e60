"""Every bad input raises a clear TypeError or ValueError naming the argument."""
import os

import numpy as np
import pytest

import flexformer as ff

from conftest import make_inputs

X = make_inputs(B=2, H=3, Nq=6, Nk=6, d=4, e=5, m=2)


def call_s(**over):
    a = {**X, **over}
    kw = {key: a[key] for key in ("causal", "key_mask", "eps") if key in a}
    return ff.flex_s_attention(a["q"], a["k"], a["v"], a["omega"], **kw)


def call_n(**over):
    a = {**X, **over}
    kw = {key: a[key] for key in ("causal", "key_mask", "eps") if key in a}
    return ff.flex_n_attention(a["q"], a["k"], a["v"], a["omega1"], a["omega2"], a["tau"], **kw)


def call_s_bwd(dout=None, **over):
    a = {**X, **over}
    dout = np.zeros((2, 3, a["q"].shape[2], 5)) if dout is None else dout
    return ff.flex_s_attention_backward(dout, a["q"], a["k"], a["v"], a["omega"])


CASES = [
    # (call, overrides, exception, message fragment)
    (call_s, dict(q=X["q"][0]), ValueError, "q must be a 4-d array"),
    (call_s, dict(k=X["k"][:, :2]), ValueError, "k must have shape"),
    (call_s, dict(k=X["k"][:1]), ValueError, "k must have shape"),
    (call_s, dict(k=X["k"][..., :3]), ValueError, "k must have shape"),
    (call_s, dict(v=X["v"][:, :, :5]), ValueError, "v must have shape"),
    (call_s, dict(omega=X["omega"][:2]), ValueError, "omega must have shape"),
    (call_s, dict(omega=X["omega"][..., :3]), ValueError, "omega must have shape"),
    (call_s, dict(omega=X["omega"][:, :0]), ValueError, "m >= 1"),
    (call_s, dict(omega=X["omega"][0]), ValueError, "omega must be a 3-d array"),
    (call_n, dict(omega2=X["omega2"][:, :1]), ValueError, "omega2 must have shape"),
    (call_n, dict(tau=X["tau"][:2]), ValueError, "tau must have shape"),
    (call_n, dict(tau=np.ones((3, 1))), ValueError, "tau must be a 1-d array"),  # one number is every head's (test_product)
    (call_n, dict(tau=np.array([1.0, np.nan, 1.0])), ValueError, "tau must be finite"),
    (call_n, dict(tau=np.array([1.0, np.inf, 1.0])), ValueError, "tau must be finite"),
    (call_s, dict(omega=np.full_like(X["omega"], np.nan)), ValueError, "omega must be finite"),
    (call_n, dict(omega1=np.full_like(X["omega1"], np.inf)), ValueError, "omega1 must be finite"),
    (call_s, dict(q=X["q"].astype(np.int64)), TypeError, "q must have dtype float32 or float64"),
    (call_s, dict(q=X["q"].astype(np.float16)), TypeError, "q must have dtype float32 or float64"),
    (call_s, dict(q=X["q"].astype(np.complex128)), TypeError, "q must have dtype"),
    (call_s, dict(q=X["q"].astype(object)), TypeError, "q must have dtype"),
    (call_s, dict(k=X["k"].astype(np.float32)), TypeError, "k must have dtype float64"),
    (call_s, dict(v=X["v"].astype(np.float32)), TypeError, "v must have dtype float64"),
    (call_s, dict(omega=X["omega"].astype(np.float32)), TypeError, "omega must have dtype float64"),
    (call_n, dict(tau=X["tau"].astype(np.float32)), TypeError, "tau must have dtype float64"),
    (call_s, dict(q=X["q"].astype(np.float32)), TypeError, "k must have dtype float32"),
    (call_s, dict(q=None), TypeError, "q must have dtype"),
    (call_s, dict(k="not an array"), TypeError, "k must have dtype"),
    (call_s, dict(q=X["q"][..., :0], k=X["k"][..., :0], omega=X["omega"][..., :0]), ValueError, "d >= 1"),
    (call_s, dict(causal=True, k=X["k"][:, :, :4], v=X["v"][:, :, :4]), ValueError, "causal=True needs"),
    (call_s, dict(key_mask=np.ones((2, 5), bool)), ValueError, "key_mask must have shape"),
    (call_s, dict(key_mask=np.ones((2, 6), np.int64)), TypeError, "key_mask must have dtype bool"),
    (call_s, dict(key_mask=np.ones((2, 6), np.float64)), TypeError, "key_mask must have dtype bool"),
    (call_s, dict(key_mask=np.ones(6, bool)), ValueError, "key_mask must be a 2-d array"),
    (call_s, dict(eps=0.0), ValueError, "eps must be"),
    (call_s, dict(eps=-1.0), ValueError, "eps must be"),
    (call_s, dict(eps=float("nan")), ValueError, "eps must be"),
    (call_s, dict(eps="1e-4"), TypeError, "eps must be a float"),
    (call_s, dict(causal="yes"), TypeError, "causal must be a bool"),
    (call_s_bwd, dict(dout=np.zeros((2, 3, 6, 4))), ValueError, "dout must have shape"),
    (call_s_bwd, dict(dout=np.zeros((2, 3, 6, 5), np.float32)), TypeError, "dout must have dtype float64"),
]


@pytest.mark.parametrize("call,over,exc,msg", CASES, ids=[c[3] + "-" + str(i) for i, c in enumerate(CASES)])
def test_bad_input_raises(call, over, exc, msg):
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        call(**over)


def test_backward_validates_like_forward():
    with pytest.raises(ValueError, match="tau must be finite"):
        ff.flex_n_attention_backward(np.zeros((2, 3, 6, 5)), X["q"], X["k"], X["v"], X["omega1"],
                                     X["omega2"], np.array([np.nan] * 3))
    with pytest.raises(ValueError, match="causal=True needs"):
        ff.flex_n_attention_backward(np.zeros((2, 3, 6, 5)), X["q"], X["k"][:, :, :3], X["v"][:, :, :3],
                                     X["omega1"], X["omega2"], X["tau"], causal=True)


def test_lists_are_accepted_as_float64():
    out = ff.flex_s_attention(X["q"].tolist(), X["k"], X["v"].tolist(), X["omega"])
    np.testing.assert_array_equal(out, call_s())


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError):
        ff.flex_s_attention(X["q"], X["k"], X["v"], X["omega"], mask=None)


def test_set_num_threads_validates():
    with pytest.raises(ValueError, match="n must be"):
        ff.set_num_threads(-1)
    with pytest.raises(TypeError):
        ff.set_num_threads("two")


# The array checks every kind shares, in the words of the C glue that makes them for the
# kinds on a C kernel (the elu kind makes q's and k's in Python, before computing its
# features from them, and its generic core's name the features phi_q and phi_k).
Q = np.random.default_rng(0).standard_normal((2, 3, 6, 4))
V = np.random.default_rng(1).standard_normal((2, 3, 6, 5))
SHARED = [
    (dict(q=Q[0]), ValueError, "q must be a 4-d array of shape (B, H, Nq, d), got 3-d"),
    (dict(k=Q[:, :2]), ValueError, "k must have shape (B, H, Nk, d) = (2, 3, Nk, 4) to match q, got (2, 2, 6, 4)"),
    (dict(k=Q[..., :3]), ValueError, "k must have shape (B, H, Nk, d) = (2, 3, Nk, 4) to match q, got (2, 3, 6, 3)"),
    (dict(q=Q[..., :0], k=Q[..., :0]), ValueError, "q must have a head size d >= 1 (last axis), got 0"),
    (dict(q="abc"), TypeError, "q must have dtype float32 or float64, got <U3"),
    (dict(k=None), TypeError, "k must have dtype float64, got object"),
    (dict(q=Q.astype(np.int64)), TypeError, "q must have dtype float32 or float64, got int64"),
    (dict(k=Q.astype(np.float32)), TypeError, "k must have dtype float64, got float32"),
    (dict(q=[[1.0], [1.0, 2.0]]), TypeError, "q must be an array of real numbers (a numpy array, or a list "
                                             "NumPy can convert to float64), but NumPy could not convert it"),
    (dict(v=V[:, :, :5]), ValueError, "v must have shape (B, H, Nk, e) = (2, 3, 6, e) to match q and k, got (2, 3, 5, 5)"),
    (dict(key_mask=np.ones((2, 5), bool)), ValueError, "key_mask must have shape (B, Nk) = (2, 6) to match k, got (2, 5)"),
    (dict(causal=True, k=Q[:, :, :4], v=V[:, :, :4]), ValueError,
     "causal=True needs as many queries as keys, got Nq = 6 (q) and Nk = 4 (k)"),
]


@pytest.mark.parametrize("kind", ff.attention_kinds())
@pytest.mark.parametrize("over,exc,msg", SHARED, ids=[c[2][:30] for c in SHARED])
@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_every_kind_names_the_callers_arrays(kind, over, exc, msg, pass_):
    if kind == "linformer" and over.get("causal"):
        pytest.skip("linformer refuses causal=True with its own message (CASES above)")
    spec = ff.get_attention(kind)
    params = spec.init(3, 4, rng=0, **({"max_len": 6} if kind == "linformer" else {}))
    a = {"q": Q, "k": Q, "v": V, "causal": False, "key_mask": None, **over}
    args = (a["q"], a["k"], a["v"], params)
    with pytest.raises(exc) as err:
        if pass_ == "forward":
            spec.forward(*args, causal=a["causal"], key_mask=a["key_mask"])
        else:
            spec.backward(np.zeros((2, 3, 6, 5)), *args, causal=a["causal"], key_mask=a["key_mask"])
    assert str(err.value) == msg


def test_elu_lists_take_the_dtype_of_the_arrays_beside_them():
    """As every kind on a C kernel: a list q beside float32 k and v makes a float32 call."""
    q, k, v = (x.astype(np.float32) for x in (Q, Q[::-1], V))
    got = ff.attention("elu", q.tolist(), k, v, {})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, ff.attention("elu", q, k, v, {}))
    grads = ff.attention_backward("elu", np.ones_like(v), q.tolist(), k, v, {})
    assert grads[0].dtype == np.float32


# Every public callable of the package, given garbage for its required arguments, answers
# with an exception that says what is wrong (the types below), never an AttributeError,
# IndexError, ZeroDivisionError or the like from deep inside.
PUBLIC_MODULES = ["flexformer", "flexformer.init", "flexformer.testing", "flexformer.reference",
                  "flexformer.diagnostics", "flexformer.nn", "flexformer.data", "flexformer.distill",
                  "flexformer.recurrent", "flexformer.training"]
GARBAGE = [None, "x", -1, 1.5, object(), np.zeros((2, 3)), [[1, 2], [3]]]
CLEAR = (TypeError, ValueError, FileNotFoundError, RuntimeError, MemoryError, FloatingPointError)
# these change the process (threads, caches) or start a run
LEFT_OUT = {"train", "set_num_threads", "set_buffer_cache", "set_causal_cache"}


def _public_callables():
    import importlib
    import inspect
    seen, found = set(), []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]):
            obj = getattr(module, name, None)
            if not callable(obj) or name in LEFT_OUT or id(obj) in seen:
                continue
            seen.add(id(obj))
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                   p.POSITIONAL_OR_KEYWORD)]
            found.append((f"{module_name}.{name}", obj, len(required)))
    return found


def test_every_public_callable_answers_garbage_with_a_clear_error(tmp_path, monkeypatch):
    import warnings
    monkeypatch.chdir(tmp_path)  # nothing a call might write lands in the checkout
    callables = _public_callables()
    assert len(callables) > 100
    unclear = []
    for name, obj, n in callables:
        for garbage in GARBAGE:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    obj(*[garbage] * n)
            except CLEAR:
                pass
            except Exception as exc:  # noqa: BLE001 (what is being looked for)
                unclear.append(f"{name}({garbage!r:.20}, ...): {type(exc).__name__}: {str(exc)[:80]}")
    assert not unclear, "\n".join(unclear)


def _objects():
    """(name, maker) for an instance of every public class with methods: layers and models
    fresh and after a forward (backward has something to differentiate), the recurrences of
    every kind and their states."""
    from flexformer.nn import (GELU, MLP, Block, CausalLM, Embedding, EncoderClassifier, LayerNorm, Linear,
                               MultiHeadAttention, PositionalEncoding, ShortConv, TwoTowerClassifier)
    from flexformer.recurrent import RECURRENT_KINDS

    def after(model, *inputs):
        model.forward(*inputs)
        return model

    ids = np.array([[1, 2, 3]])
    small = dict(dim=8, heads=2, max_len=8, depth=1)
    yield "CausalLM", lambda: CausalLM(10, **small)
    yield "CausalLM after a forward", lambda: after(CausalLM(10, **small), ids)
    yield "EncoderClassifier after a forward", lambda: after(EncoderClassifier(10, 3, **small), ids)
    for head in TwoTowerClassifier.HEADS:
        yield f"TwoTowerClassifier({head})", lambda head=head: TwoTowerClassifier(10, head=head, **small)
    for kind in ff.attention_kinds():
        yield f"MultiHeadAttention({kind})", lambda kind=kind: MultiHeadAttention(8, 2, kind, 0, max_len=8)
        yield f"MultiHeadAttention({kind}) after a forward", lambda kind=kind: after(
            MultiHeadAttention(8, 2, kind, 0, max_len=8), np.ones((1, 4, 8), np.float32))
        yield f"Block({kind})", lambda kind=kind: Block(8, 2, kind, 0, max_len=8)
    for kind in RECURRENT_KINDS:
        params = None if kind in ("linear", "softmax", "elu", "taylor") else ff.get_attention(kind).init(2, 4, rng=0)
        yield f"RecurrentAttention({kind})", lambda kind=kind, params=params: ff.RecurrentAttention(kind, params)
    yield "LinearAttentionState", lambda: ff.LinearAttentionState.empty(1, 2, 4, 4)
    yield "KVCacheState", lambda: ff.KVCacheState.empty(1, 2, 4, 4)
    yield "ListOps", lambda: ff.data.ListOps(32)
    yield "Pathfinder", lambda: ff.data.Pathfinder(16)
    yield "AdamW", lambda: ff.training.AdamW(Linear(3, 2, 0).named_parameters(), lr=0.1)
    austen = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "austen")
    if os.path.isdir(austen):  # the shared data of developer machines and CI
        for cls in (ff.data.TextLM, ff.data.TextClassification, ff.data.TextRetrieval):
            yield cls.__name__, lambda cls=cls: cls(austen, 64)
    for name, make in (("LayerNorm", lambda: LayerNorm(8)), ("Linear", lambda: Linear(8, 4, 0)),
                       ("Embedding", lambda: Embedding(10, 8, 0)), ("ShortConv", lambda: ShortConv(8, 3)),
                       ("MLP", lambda: MLP(8, 16, 0)), ("PositionalEncoding", lambda: PositionalEncoding(8, 8, 0)),
                       ("GELU", GELU)):
        yield name, make


def test_every_public_method_answers_garbage_with_a_clear_error():
    """As above for the methods of the layers, models, recurrences and states: garbage for
    each method's required arguments (TwoTowerClassifier's cosine head once reached an
    AttributeError from a backward before any forward, load_parameters a KeyError for a
    string, GELU's forward one for a float)."""
    import inspect
    import warnings
    unclear, calls = [], 0
    for name, make in _objects():
        for method, _ in inspect.getmembers(type(make()), callable):
            if method.startswith("_"):
                continue
            try:
                params = inspect.signature(getattr(make(), method)).parameters.values()
            except (TypeError, ValueError):
                continue
            n = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
            for garbage in GARBAGE:
                calls += 1
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        getattr(make(), method)(*[garbage] * n)
                except CLEAR:
                    pass
                except Exception as exc:  # noqa: BLE001 (what is being looked for)
                    unclear.append(f"{name}.{method}({garbage!r:.20}, ...): {type(exc).__name__}: {str(exc)[:80]}")
    assert calls > 1000
    assert not unclear, "\n".join(unclear)


def test_data_folders_must_be_paths():
    """A folder given as an int was taken by os.path for an open file descriptor (an
    OverflowError for a large one)."""
    for make in (ff.data.TextLM, ff.data.TextClassification, ff.data.TextRetrieval, ff.data.FashionMNIST):
        for folder in (3, 10 ** 12, None):
            with pytest.raises(TypeError, match="folder must be a path"):
                make(folder)


def test_load_parameters_checks_everything_before_copying_anything():
    from flexformer.nn import CausalLM
    model = CausalLM(10, dim=8, heads=2, max_len=8, depth=1, rng=0)
    before = {n: v.copy() for n, v in model.parameters().items()}
    changed = {n: v + 1 for n, v in before.items()}
    last = list(changed)[-1]
    for values, exc, message in (
            ("x", TypeError, "values must be a mapping of parameter name to array .* got str"),
            ({**changed, last: changed[last][:1]}, ValueError, f"parameter '{last}' has shape"),
            ({n: v for n, v in changed.items() if n != last}, KeyError, f"missing parameter '{last}'"),
            ({**changed, last: changed[last].astype(complex)}, TypeError, "must be an array of real numbers"),
            ({**changed, "extra.W": np.zeros(2)}, ValueError, "names this model does not have: 'extra.W'")):
        with pytest.raises(exc, match=message):
            model.load_parameters(values)
        for n, v in model.parameters().items():  # the earlier names were not copied in
            np.testing.assert_array_equal(v, before[n])
    model.load_parameters(changed)
    for n, v in model.parameters().items():
        np.testing.assert_array_equal(v, changed[n])


KEYWORD_GARBAGE = ["x", -1, 1.5, object(), np.zeros((2, 3)), [[1, 2], [3]], float("nan")]


@pytest.mark.parametrize("kind", ff.attention_kinds())
@pytest.mark.parametrize("keyword", ["num_features", "max_len", "rng", "dtype"])
def test_every_kind_refuses_garbage_init_options_it_may_not_even_use(kind, keyword):
    spec = ff.get_attention(kind)
    extra = {"max_len": 6} if kind == "linformer" and keyword != "max_len" else {}
    for garbage in KEYWORD_GARBAGE:
        with pytest.raises((TypeError, ValueError), match=keyword):
            spec.init(2, 4, **extra, **{keyword: garbage})


@pytest.mark.parametrize("keyword", ["causal", "max_len", "qk_norm", "learn_scale", "eps", "kernel_init", "dtype"])
def test_the_numpy_attention_layer_refuses_garbage_options(keyword):
    for garbage in KEYWORD_GARBAGE:
        if keyword == "eps" and isinstance(garbage, float) and garbage == 1.5:
            continue  # a valid guard
        with pytest.raises((TypeError, ValueError), match=keyword):
            ff.nn.MultiHeadAttention(8, 2, "flex_n", 0, **{keyword: garbage})
