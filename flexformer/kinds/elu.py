"""Linear attention with elu(x) + 1 features (Katharopoulos et al., 2020), on the generic
core (``_C.linear_forward`` / ``_backward``, which takes the features themselves)."""
from __future__ import annotations

import numpy as np

from .. import functional as lin
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


def forward(q, k, v, p, causal, mask, **kw):
    q, k = np.asarray(q), np.asarray(k)
    return lin.linear_attention(elu_plus_one(q), elu_plus_one(k), v,
                                causal=causal, key_mask=mask, **kw)


def backward(dout, q, k, v, p, causal, mask, **kw):
    q, k = np.asarray(q), np.asarray(k)
    dpq, dpk, dv = lin.linear_attention_backward(dout, elu_plus_one(q), elu_plus_one(k),
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
