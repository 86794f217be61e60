"""Every bad input raises a clear TypeError or ValueError naming the argument."""
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
