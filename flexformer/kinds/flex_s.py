"""Flexformer_s (stationary, Bochner): learnable random Fourier frequencies omega, and RFA,
the same map with the frequencies frozen at their random draw.

phi(x) = exp(s) f with f = m^-1/2 [cos(W x), sin(W x)], s = |x|^2 / (2 sqrt d); the C map is
csrc/featmap_flex.inc, the entry points csrc/ops_flex.inc."""
from __future__ import annotations

import math

import numpy as np

from .. import init as initialisers
from ..features import fourier_features_torch, project
from .base import LINEAR_KIND, features_or_head_dim, register


def features(x, p):
    """f = m^-1/2 [cos(W x), sin(W x)], s = |x|^2 / (2 sqrt d); W = ``omega`` (H, m, d)."""
    omega = p["omega"]
    u = project(x, omega)
    f = np.concatenate([np.cos(u), np.sin(u)], axis=-1) * x.dtype.type(1.0 / np.sqrt(omega.shape[1]))
    return f, (x * x).sum(-1) * x.dtype.type(1.0 / (2.0 * np.sqrt(x.shape[-1])))


def features_grad(x, p, df, ds):
    omega = p["omega"]
    m = omega.shape[1]
    u = project(x, omega)
    c = x.dtype.type(1.0 / np.sqrt(m))
    du = c * (np.cos(u) * df[..., m:] - np.sin(u) * df[..., :m])
    return {"omega": np.einsum("bhtm,bhtd->hmd", du, x)}


def features_torch(torch, x, p):
    return fourier_features_torch(torch, x, p["omega"], 1), (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))


def feature_size(p, d):
    """F = 2m: the cos and sin halves."""
    return 2 * p["omega"].shape[1]


def init(H, d, m, L, rng, dtype, **options):
    return {"omega": initialisers.flex_s_omega(H, features_or_head_dim(d, m), d, rng=rng, dtype=dtype, **options)}


def nominal_scale(params, head_dim):
    # omega rows ~ N(0, c I): the estimated kernel is exp(c q.k), c = mean |row|^2 / d
    w = np.asarray(params["omega"], dtype=np.float64)
    return (w * w).sum(-1).mean(-1) / head_dim


def frequency_rows(params):
    w = np.asarray(params["omega"], np.float64)
    return {"omega_row_norm": np.linalg.norm(w, axis=-1).mean(-1).tolist()}


_MAP = dict(feature_map=features, feature_size=feature_size, torch_feature_map=features_torch, signed_features=True,
            nominal_scale=nominal_scale, parameter_summary=frequency_rows, complexity="O(N m (d + e))", _init=init,
            kernel="flex_s", init_options=("scale",), distill=True, **LINEAR_KIND)

_ABOUT = ("phi(x) = exp(|x|^2 / (2 sqrt d)) m^(-1/2) [cos(W x), sin(W x)] with frequencies W = ``omega[h]`` "
          "(m, d) per head; with rows drawn from N(0, I / sqrt d) (:func:`flexformer.init.flex_s_omega` at "
          "``scale=1``), phi(q).phi(k) estimates exp(q.k / sqrt d).")
FLEX_S = register("flex_s", "Flexformer_s: stationary learnable random Fourier features", table="flex_s",
                  feature_grad=features_grad, about=_ABOUT + " The frequencies are learned.",
                  param_docs=(("omega", "spectral frequencies, finite (:func:`flexformer.init.flex_s_omega`)"),),
                  **_MAP)
RFA = register("rfa", "RFA: Flexformer_s with frozen random frequencies (no gradient for omega)", table="flex_s",
               learnable=(), about=_ABOUT + " The frequencies stay at their random draw: the backward returns "
               "no gradient for them.", param_docs=(("omega", "fixed random frequencies, finite "
                                                    "(:func:`flexformer.init.flex_s_omega`)"),), **_MAP)
