"""Hedgehog (Zhang et al., 2024): a learnable softmax feature map.

f = softmax([x W, -x W]) over 2m entries, s = 0, W (H, d, m); the C map is
csrc/featmap_baselines.inc, the entry points csrc/ops_baselines.inc."""
from __future__ import annotations

import numpy as np

from .. import init as initialisers
from .base import LINEAR_KIND, register


def features(x, p):
    """f = softmax([x W, -x W]) over 2m entries, s = 0; W (H, d, m)."""
    u = np.einsum("bhtd,hdm->bhtm", x, p["W"].astype(x.dtype, copy=False))
    z = np.concatenate([u, -u], axis=-1)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True), np.zeros(x.shape[:-1], x.dtype)


def features_grad(x, p, df, ds):
    f, _ = features(x, p)
    m = p["W"].shape[2]
    dz = f * (df - (f * df).sum(-1, keepdims=True))
    return {"W": np.einsum("bhtd,bhtm->hdm", x, dz[..., :m] - dz[..., m:])}


def features_torch(torch, x, p):
    u = torch.einsum("bhnd,hdm->bhnm", x, p["W"])
    return torch.softmax(torch.cat([u, -u], -1), -1), torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)


def feature_size(p, d):
    """F = 2m: the map of x W and of -x W."""
    return 2 * p["W"].shape[2]


def init(H, d, m, L, rng, dtype):
    return {"W": initialisers.hedgehog_weights(H, d, m, rng=rng, dtype=dtype)}


HEDGEHOG = register(
    "hedgehog", "Hedgehog: learnable softmax feature map", table="hedgehog", complexity="O(N m (d + e))", _init=init,
    kernel="hedgehog", feature_map=features, feature_grad=features_grad, feature_size=feature_size,
    torch_feature_map=features_torch, distill=True,
    about="phi(x) = softmax([x W, -x W]) over its 2m entries, with W = ``W[h]`` of shape (d, m) per head: a "
          "learnable positive feature map.",
    param_docs=(("W", "the feature map's weights (:func:`flexformer.init.hedgehog_weights`)"),), **LINEAR_KIND)
