"""Performer FAVOR+ (Choromanski et al., 2021): fixed positive random features.

f_i = exp(w_i.x' - c) / sqrt m, s = c - |x'|^2 / 2, x' = x d^-1/4, c = max_i w_i.x'; the C map
is csrc/featmap_baselines.inc, the entry points csrc/ops_baselines.inc."""
from __future__ import annotations

import math

import numpy as np

from .. import init as initialisers
from ..features import project
from .base import LINEAR_KIND, features_or_head_dim, register
from .flex_s import frequency_rows


def features(x, p):
    """FAVOR+: f_i = exp(w_i.x' - c) / sqrt m, s = c - |x'|^2 / 2, x' = x d^-1/4, c = max_i w_i.x'."""
    xs = x * x.dtype.type(x.shape[-1] ** -0.25)
    u = project(xs, p["omega"])
    c = u.max(-1)
    f = np.exp(u - c[..., None]) * x.dtype.type(1.0 / np.sqrt(p["omega"].shape[1]))
    return f, c - x.dtype.type(0.5) * (xs * xs).sum(-1)


def features_torch(torch, x, p):
    xs = x * x.shape[-1] ** -0.25
    u = torch.einsum("bhnd,hmd->bhnm", xs, p["omega"])
    c = u.amax(-1)
    f = torch.exp(u - c.unsqueeze(-1)) / math.sqrt(p["omega"].shape[1])
    return f, c - 0.5 * (xs * xs).sum(-1)


def feature_size(p, d):
    """F = m."""
    return p["omega"].shape[1]


def init(H, d, m, L, rng, dtype):
    return {"omega": initialisers.performer_omega(H, features_or_head_dim(d, m), d, rng=rng, dtype=dtype)}


PERFORMER = register(
    "performer", "Performer FAVOR+: fixed positive random features", table="performer", complexity="O(N m (d + e))",
    _init=init, kernel="performer", feature_map=features, feature_size=feature_size, torch_feature_map=features_torch,
    distill=True, parameter_summary=frequency_rows,
    about="phi(x) = exp(w_i.x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4), with fixed frequencies w_i, the rows "
          "of ``omega[h]``, drawn from N(0, I); phi(q).phi(k) estimates exp(q.k / sqrt d) with positive "
          "features. The frequencies are not learned: the backward returns no gradient for them.",
    param_docs=(("omega", "fixed random frequencies (:func:`flexformer.init.performer_omega`)"),), **LINEAR_KIND)
