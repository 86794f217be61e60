"""Linear attention with elu(x) + 1 features (Katharopoulos et al., 2020), on the generic
core (``_C.linear_forward`` / ``_backward``, which takes the features themselves)."""
from __future__ import annotations

import numpy as np

from .. import functional as lin
from .._checks import native
from ..features import normalised, normalised_torch
from .base import LINEAR_KIND, register


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1 (Katharopoulos et al., 2020), in x's dtype: the elu kind's feature map."""
    x = np.asarray(x)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def elu_plus_one_grad(x: np.ndarray) -> np.ndarray:
    """d(elu(x) + 1)/dx, in x's dtype."""
    x = np.asarray(x)
    return np.where(x > 0, 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def features(x, p):
    return normalised(elu_plus_one(x))


def features_torch(torch, x, p):
    return normalised_torch(torch, torch.nn.functional.elu(x) + 1)


def feature_size(p, d):
    """F = d: the features are a function of the inputs themselves."""
    return d


# Python lists, tuples and numbers take the call's dtype, as the C glue converts them
_UNTYPED = (list, tuple, int, float)


def _queries_keys(q, k, v, dout=None):
    """q and k as arrays of the call's dtype, refused here when the feature map could not
    take them (the features are computed from q and k before the generic core sees them;
    their shapes are the core's to check, in _on_core's terms). The call's dtype is that of
    the first of q, k, v, dout that has one of its own, as in the C glue."""
    dtype = np.dtype(np.float64)
    for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if isinstance(x, _UNTYPED) or (name == "dout" and x is None):
            continue
        dtype = _as_array(name, x).dtype
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"{name} must have dtype float32 or float64, got {dtype}")
        break
    arrays = []
    for name, x in (("q", q), ("k", k)):
        a = _as_array(name, x, dtype if isinstance(x, _UNTYPED) else None)
        if a.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {a.dtype}")
        arrays.append(a)
    return arrays


def _as_array(name, x, dtype=None):
    try:
        return native(np.asarray(x, dtype=dtype))
    except (TypeError, ValueError):
        into = "" if dtype is None else f" to {dtype}"
        raise TypeError(f"{name} must be an array of real numbers (a numpy array, or a {type(x).__name__} "
                        f"NumPy can convert{into}), but NumPy could not convert it") from None


def _on_core(call, *args, **kw):
    """The generic core on the features, its messages in this kind's terms: it names its
    inputs phi_q and phi_k, which here have the shapes of q and k (F = d)."""
    try:
        return call(*args, **kw)
    except (TypeError, ValueError) as err:
        message = str(err)
        if "phi_" not in message:
            raise
        for core, user in (("phi_q", "q"), ("phi_k", "k"), ("feature size F", "head size d"), (", F)", ", d)")):
            message = message.replace(core, user)
        raise type(err)(message) from None


def forward(q, k, v, p, causal, mask, **kw):
    q, k = _queries_keys(q, k, v)
    return _on_core(lin.linear_attention, elu_plus_one(q), elu_plus_one(k), v,
                    causal=causal, key_mask=mask, **kw)


def backward(dout, q, k, v, p, causal, mask, **kw):
    q, k = _queries_keys(q, k, v, dout)
    dpq, dpk, dv = _on_core(lin.linear_attention_backward, dout, elu_plus_one(q), elu_plus_one(k),
                            v, causal=causal, key_mask=mask, **kw)
    dk = (dpk * elu_plus_one_grad(k)).astype(k.dtype)
    if mask is not None:  # 0, not 0 * elu'(k): whatever a masked key holds is never read
        dk[~np.broadcast_to(np.asarray(mask, bool)[:, None, :, None], dk.shape)] = 0
    return (dpq * elu_plus_one_grad(q)).astype(q.dtype), dk, dv


ELU = register(
    "elu", "linear attention with elu(x) + 1 features (the generic core)", table="linear", complexity="O(N d e)",
    _init=lambda H, d, m, L, rng, dt: {}, _forward=forward, _backward=backward, feature_map=features,
    feature_size=feature_size, torch_feature_map=features_torch,
    about="phi(x) = elu(x) + 1 (Katharopoulos et al., 2020) on the generic core "
          "(:func:`flexformer.linear_attention`); F = d. No parameters.", **LINEAR_KIND)
