"""Based (Arora et al., 2024): second-order Taylor features of exp(q.k / sqrt d).

phi(x) = [1, x', vec(x' x'^T) / sqrt 2], x' = x d^-1/4, so phi(q).phi(k) = 1 + t + t^2 / 2 for
t = q.k / sqrt d; F = 1 + d + d^2. The C map is csrc/featmap_baselines.inc, the entry points
csrc/ops_baselines.inc."""
from __future__ import annotations

import numpy as np

from ..features import normalised, normalised_torch
from .base import LINEAR_KIND, register


def _phi(x, cat, outer, ones):
    xs = x * x.shape[-1] ** -0.25
    quad = outer(xs).reshape(xs.shape[:-1] + (-1,)) * (0.5 ** 0.5)
    return cat([ones(xs[..., :1]), xs, quad])


def features(x, p):
    """Based's second-order Taylor map phi(x) = [1, x', vec(x' x'^T) / sqrt 2], x' = x d^-1/4,
    so phi(q).phi(k) = 1 + t + t^2 / 2 for t = q.k / sqrt d; normalised: f = phi / |phi|,
    s = log |phi|."""
    phi = _phi(x, lambda parts: np.concatenate(parts, -1), lambda xs: xs[..., :, None] * xs[..., None, :],
               np.ones_like).astype(x.dtype, copy=False)
    return normalised(phi)


def features_torch(torch, x, p):
    phi = _phi(x, lambda parts: torch.cat(parts, -1), lambda xs: xs.unsqueeze(-1) * xs.unsqueeze(-2),
               torch.ones_like)
    return normalised_torch(torch, phi)


def feature_size(p, d):
    return 1 + d + d * d


TAYLOR = register(
    "taylor", "Based: second-order Taylor features of exp(q.k / sqrt d), 1 + t + t^2/2 (F = 1 + d + d^2)",
    table="taylor", complexity="O(N d^2 e)", _init=lambda H, d, m, L, rng, dt: {}, kernel="taylor",
    feature_map=features, feature_size=feature_size, torch_feature_map=features_torch, distill=True,
    about="phi(x) = [1, x', vec(x' x'^T) / sqrt 2], x' = x d^(-1/4), so phi(q).phi(k) = 1 + t + t^2 / 2 with "
          "t = q.k / sqrt d, the second-order Taylor expansion of exp(t) (positive for every t); F = 1 + d + d^2. "
          "No parameters.", **LINEAR_KIND)
