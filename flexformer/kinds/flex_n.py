"""Flexformer_n (nonstationary, Yaglom): learnable frequency pairs omega1, omega2 and the
scale tau of the norm factor.

phi(x) = exp(s) f with f = (4m)^-1/2 [cos(A x) + cos(B x), sin(A x) + sin(B x)],
s = e^-tau |x|^2; the C map is csrc/featmap_flex.inc, the entry points csrc/ops_flex.inc."""
from __future__ import annotations

import numpy as np

from .. import init as initialisers
from ..features import fourier_features_torch, project
from .base import LINEAR_KIND, features_or_head_dim, register


def features(x, p):
    """f = (4m)^-1/2 [cos(A x) + cos(B x), sin(A x) + sin(B x)], s = e^-tau |x|^2;
    A, B = ``omega1``, ``omega2`` (H, m, d), ``tau`` (H,)."""
    a, b = project(x, p["omega1"]), project(x, p["omega2"])
    c = x.dtype.type(1.0 / np.sqrt(4.0 * p["omega1"].shape[1]))
    f = np.concatenate([np.cos(a) + np.cos(b), np.sin(a) + np.sin(b)], axis=-1) * c
    coef = np.exp(-np.asarray(p["tau"], dtype=x.dtype))[None, :, None]
    return f, (x * x).sum(-1) * coef


def features_grad(x, p, df, ds):
    m = p["omega1"].shape[1]
    a, b = project(x, p["omega1"]), project(x, p["omega2"])
    c = x.dtype.type(1.0 / np.sqrt(4.0 * m))
    dfc, dfs = df[..., :m], df[..., m:]
    da = c * (np.cos(a) * dfs - np.sin(a) * dfc)
    db = c * (np.cos(b) * dfs - np.sin(b) * dfc)
    s = (x * x).sum(-1) * np.exp(-np.asarray(p["tau"], dtype=x.dtype))[None, :, None]
    return {"omega1": np.einsum("bhtm,bhtd->hmd", da, x), "omega2": np.einsum("bhtm,bhtd->hmd", db, x),
            "tau": -(ds * s).sum(axis=(0, 2))}


def features_torch(torch, x, p):
    # one projection onto the stacked pair [A; B], as the C map does
    f = fourier_features_torch(torch, x, torch.cat([p["omega1"], p["omega2"]], 1), 2)
    return f, (x * x).sum(-1) * torch.exp(-p["tau"])[None, :, None]


def feature_size(p, d):
    """F = 2m: the cos and sin halves (of the summed pair)."""
    return 2 * p["omega1"].shape[1]


def init(H, d, m, L, rng, dtype, **options):
    o1, o2, tau = initialisers.flex_n_params(H, features_or_head_dim(d, m), d, rng=rng, dtype=dtype, **options)
    return {"omega1": o1, "omega2": o2, "tau": tau}


def nominal_scale(params, head_dim):
    # E[phi(q).phi(k)] at the initialisation is exp(2 q.k / e^tau) (init.flex_n_params)
    return 2.0 * np.exp(-np.asarray(params["tau"], dtype=np.float64))


def parameter_summary(params):
    a, b = np.asarray(params["omega1"], np.float64), np.asarray(params["omega2"], np.float64)
    separation = (np.linalg.norm((a - b).reshape(a.shape[0], -1), axis=1)
                  / np.maximum(np.linalg.norm(a.reshape(a.shape[0], -1), axis=1), 1e-300))
    return {"omega1_row_norm": np.linalg.norm(a, axis=-1).mean(-1).tolist(),
            "omega2_row_norm": np.linalg.norm(b, axis=-1).mean(-1).tolist(),
            "tau": np.asarray(params["tau"], np.float64).tolist(), "separation": separation.tolist()}


FLEX_N = register(
    "flex_n", "Flexformer_n: nonstationary learnable frequency pairs and scale", table="flex_n",
    complexity="O(N m (d + e))", _init=init, kernel="flex_n",
    init_options=("scale", "spread", "match_tau", "symmetric"),
    feature_map=features, feature_grad=features_grad, feature_size=feature_size, torch_feature_map=features_torch,
    distill=True, signed_features=True, nominal_scale=nominal_scale, parameter_summary=parameter_summary,
    about="phi(x) = exp(|x|^2 / exp(tau)) (4m)^(-1/2) [cos(A x) + cos(B x), sin(A x) + sin(B x)] with "
          "learnable frequency pairs A = ``omega1[h]``, B = ``omega2[h]`` (m, d) and scale ``tau[h]`` per head. "
          "With A = B and tau = log(2 sqrt d) it equals Flexformer_s (:func:`flexformer.flex_s_attention`).",
    param_docs=(("omega1", "the first frequencies of each pair, finite (:func:`flexformer.init.flex_n_params`)"),
                ("omega2", "the second frequencies of each pair, finite"),
                ("tau", "finite: the log of the norm factor's scale")),
    **LINEAR_KIND)
