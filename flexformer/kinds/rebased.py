"""ReBased (Aksenov et al., 2024): Based's quadratic kernel on normalised inputs with a
learnable scale and shift per head.

y = gamma * LN(x) + beta, LN(x) = (x - mean x) / sqrt(var x + 1e-5) over the head size,
phi(x) = vec(y y^T), so phi(q).phi(k) = (y_q . y_k)^2; F = d^2; gamma and beta (H, d),
initialised to 1 and 0. The C map and entry point are csrc/rebased.inc."""
from __future__ import annotations

import numpy as np

from ..features import normalised, normalised_torch
from .base import LINEAR_KIND, register

#: LayerNorm's epsilon, inside the square root (csrc/rebased.inc, FF_REBASED_LN_EPS)
LN_EPS = 1e-5


def _affine(x, p):
    """(y, xhat) of x (B, H, N, d) with gamma, beta (H, d): y = gamma * xhat + beta."""
    mean = x.mean(-1, keepdims=True)
    xhat = (x - mean) * (1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + LN_EPS))
    gamma = p["gamma"].astype(x.dtype, copy=False)[:, None, :]
    beta = p["beta"].astype(x.dtype, copy=False)[:, None, :]
    return gamma * xhat + beta, xhat


def _split(y, dtype):
    """(f, s) of phi = vec(y y^T)."""
    phi = (y[..., :, None] * y[..., None, :]).reshape(y.shape[:-1] + (-1,))
    return normalised(phi.astype(dtype, copy=False))


def features(x, p):
    """phi = vec(y y^T), y = gamma * LN(x) + beta; normalised: f = phi / |phi|,
    s = log |phi| = log |y|^2."""
    return _split(_affine(x, p)[0], x.dtype)


def features_grad(x, p, df, ds):
    """Gradients of gamma and beta (H, d) through the normalised split of phi = vec(y y^T)."""
    y, xhat = _affine(x, p)
    d = x.shape[-1]
    f, _ = _split(y, x.dtype)
    norm = (y * y).sum(-1)                       # |phi| = |y|^2
    safe = np.where(norm > 0, norm, 1)[..., None]
    dphi = np.where(norm[..., None] > 0, (df - f * ((f * df).sum(-1) - ds)[..., None]) / safe, 0)
    dphi = dphi.reshape(x.shape[:-1] + (d, d))
    dy = np.einsum("bhnij,bhnj->bhni", dphi + np.swapaxes(dphi, -1, -2), y)
    return {"gamma": (dy * xhat).sum((0, 2)), "beta": dy.sum((0, 2))}


def features_torch(torch, x, p):
    mean = x.mean(-1, keepdim=True)
    xhat = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + LN_EPS)
    y = p["gamma"].unsqueeze(1) * xhat + p["beta"].unsqueeze(1)
    phi = (y.unsqueeze(-1) * y.unsqueeze(-2)).flatten(-2)
    return normalised_torch(torch, phi)


def feature_size(p, d):
    """F = d^2: every product y_i y_j."""
    return d * d


def init(H, d, m, L, rng, dtype):
    """gamma = 1, beta = 0: the kernel starts as (LN(q) . LN(k))^2."""
    return {"gamma": np.ones((H, d), dtype), "beta": np.zeros((H, d), dtype)}


def parameter_summary(p):
    """Per head: the mean |gamma| and the length of beta."""
    gamma, beta = np.asarray(p["gamma"], np.float64), np.asarray(p["beta"], np.float64)
    return {"gamma_mean_abs": np.abs(gamma).mean(-1).tolist(), "beta_norm": np.linalg.norm(beta, axis=-1).tolist()}


REBASED = register(
    "rebased", "ReBased: (y_q . y_k)^2 with y = gamma LN(x) + beta learnable per head (F = d^2)",
    table="rebased", complexity="O(N d^2 e)", _init=init, kernel="rebased", feature_map=features,
    feature_grad=features_grad, feature_size=feature_size, torch_feature_map=features_torch,
    parameter_summary=parameter_summary, distill=True,
    about="phi(q).phi(k) = (y_q . y_k)^2 with y = gamma * LN(x) + beta, LN the per-row normalisation over "
          "the head size (variance + 1e-5) and gamma, beta learnable per head; F = d^2.",
    param_docs=(("gamma", "the scale after the normalisation (1 at initialisation)"),
                ("beta", "the shift after the normalisation (0 at initialisation)")), **LINEAR_KIND)
