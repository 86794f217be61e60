"""NumPy and PyTorch twins of the C feature maps in their split form
phi(x) = exp(s(x)) f(x), |f| <= 1, with gradients with respect to the kernel parameters.

The C kernels never return features (they consume them in tiles); code that needs them
outside a kernel call (recurrent decoding, distillation, plots, the torch backend) uses
these. Each map takes x (B, H, T, d) and returns (f (B, H, T, F), s (B, H, T)) in x's
dtype, the same split as ``csrc/featmap_*.inc``, so a guard or a stabiliser built on it
matches the kernels. The torch twins take the ``torch`` module as their first argument, so
this module never imports torch.

Which kind uses which function is recorded in the registry (:mod:`flexformer.registry`,
fields ``feature_map``, ``feature_grad``, ``feature_size``, ``torch_feature_map``), which
also looks them up by kind name (:func:`flexformer.registry.features`,
``num_features``, ``feature_backward``). This module knows no kind names.
"""
from __future__ import annotations

import math
from typing import Dict

import numpy as np

Params = Dict[str, np.ndarray]


def _proj(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.einsum("bhtd,hmd->bhtm", x, W.astype(x.dtype, copy=False))


# ----------------------------------------------------------------- Flexformer (flex_s, rfa, flex_n)

def flex_s_features(x, p):
    """f = m^-1/2 [cos(W x), sin(W x)], s = |x|^2 / (2 sqrt d); W = ``omega`` (H, m, d)."""
    omega = p["omega"]
    u = _proj(x, omega)
    f = np.concatenate([np.cos(u), np.sin(u)], axis=-1) * x.dtype.type(1.0 / np.sqrt(omega.shape[1]))
    return f, (x * x).sum(-1) * x.dtype.type(1.0 / (2.0 * np.sqrt(x.shape[-1])))


def flex_s_features_grad(x, p, df, ds):
    omega = p["omega"]
    m = omega.shape[1]
    u = _proj(x, omega)
    c = x.dtype.type(1.0 / np.sqrt(m))
    du = c * (np.cos(u) * df[..., m:] - np.sin(u) * df[..., :m])
    return {"omega": np.einsum("bhtm,bhtd->hmd", du, x)}


_SINCOS = {}


def sincos_torch(torch, u):
    """(cos u, sin u), each evaluated once: the backward reuses them (torch's own cos and
    sin evaluate sin and cos again for their gradients, a third of the torch feature maps'
    time). Differentiable to any order."""
    fn = _SINCOS.get(torch)
    if fn is None:
        class SinCos(torch.autograd.Function):
            @staticmethod
            def forward(u):
                return u.cos(), u.sin()

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(*output)

            @staticmethod
            def backward(ctx, dc, ds):
                c, s = ctx.saved_tensors
                du = torch.zeros_like(c) if dc is None else -dc * s
                return du if ds is None else du + ds * c

        fn = _SINCOS[torch] = SinCos
    return fn.apply(u)


def flex_s_features_torch(torch, x, p):
    u = torch.einsum("bhnd,hmd->bhnm", x, p["omega"])
    c, s = sincos_torch(torch, u)
    f = torch.cat([c, s], -1) / math.sqrt(p["omega"].shape[1])
    return f, (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))


def flex_n_features(x, p):
    """f = (4m)^-1/2 [cos(A x) + cos(B x), sin(A x) + sin(B x)], s = e^-tau |x|^2;
    A, B = ``omega1``, ``omega2`` (H, m, d), ``tau`` (H,)."""
    a, b = _proj(x, p["omega1"]), _proj(x, p["omega2"])
    c = x.dtype.type(1.0 / np.sqrt(4.0 * p["omega1"].shape[1]))
    f = np.concatenate([np.cos(a) + np.cos(b), np.sin(a) + np.sin(b)], axis=-1) * c
    coef = np.exp(-np.asarray(p["tau"], dtype=x.dtype))[None, :, None]
    return f, (x * x).sum(-1) * coef


def flex_n_features_grad(x, p, df, ds):
    m = p["omega1"].shape[1]
    a, b = _proj(x, p["omega1"]), _proj(x, p["omega2"])
    c = x.dtype.type(1.0 / np.sqrt(4.0 * m))
    dfc, dfs = df[..., :m], df[..., m:]
    da = c * (np.cos(a) * dfs - np.sin(a) * dfc)
    db = c * (np.cos(b) * dfs - np.sin(b) * dfc)
    s = (x * x).sum(-1) * np.exp(-np.asarray(p["tau"], dtype=x.dtype))[None, :, None]
    return {"omega1": np.einsum("bhtm,bhtd->hmd", da, x), "omega2": np.einsum("bhtm,bhtd->hmd", db, x),
            "tau": -(ds * s).sum(axis=(0, 2))}


def flex_n_features_torch(torch, x, p):
    m = p["omega1"].shape[1]
    # one projection onto the stacked pair [A; B], as the C map does
    c, s = sincos_torch(torch, torch.einsum("bhnd,hmd->bhnm", x, torch.cat([p["omega1"], p["omega2"]], 1)))
    f = torch.cat([c[..., :m] + c[..., m:], s[..., :m] + s[..., m:]], -1) / math.sqrt(4.0 * m)
    return f, (x * x).sum(-1) * torch.exp(-p["tau"])[None, :, None]


def flex_s_size(p, d):
    """F = 2m: the cos and sin halves."""
    return 2 * p["omega"].shape[1]


def flex_n_size(p, d):
    """F = 2m: the cos and sin halves (of the summed pair)."""
    return 2 * p["omega1"].shape[1]


# ----------------------------------------------------------------- positive feature maps

def performer_features(x, p):
    """FAVOR+: f_i = exp(w_i.x' - c) / sqrt m, s = c - |x'|^2 / 2, x' = x d^-1/4, c = max_i w_i.x'."""
    xs = x * x.dtype.type(x.shape[-1] ** -0.25)
    u = _proj(xs, p["omega"])
    c = u.max(-1)
    f = np.exp(u - c[..., None]) * x.dtype.type(1.0 / np.sqrt(p["omega"].shape[1]))
    return f, c - x.dtype.type(0.5) * (xs * xs).sum(-1)


def performer_features_torch(torch, x, p):
    xs = x * x.shape[-1] ** -0.25
    u = torch.einsum("bhnd,hmd->bhnm", xs, p["omega"])
    c = u.amax(-1)
    f = torch.exp(u - c.unsqueeze(-1)) / math.sqrt(p["omega"].shape[1])
    return f, c - 0.5 * (xs * xs).sum(-1)


def hedgehog_features(x, p):
    """f = softmax([x W, -x W]) over 2m entries, s = 0; W (H, d, m)."""
    u = np.einsum("bhtd,hdm->bhtm", x, p["W"].astype(x.dtype, copy=False))
    z = np.concatenate([u, -u], axis=-1)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True), np.zeros(x.shape[:-1], x.dtype)


def hedgehog_features_grad(x, p, df, ds):
    f, _ = hedgehog_features(x, p)
    m = p["W"].shape[2]
    dz = f * (df - (f * df).sum(-1, keepdims=True))
    return {"W": np.einsum("bhtd,bhtm->hdm", x, dz[..., :m] - dz[..., m:])}


def hedgehog_features_torch(torch, x, p):
    u = torch.einsum("bhnd,hdm->bhnm", x, p["W"])
    return torch.softmax(torch.cat([u, -u], -1), -1), torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)


def hedgehog_size(p, d):
    return 2 * p["W"].shape[2]


def _taylor_phi(x, cat, outer, ones):
    xs = x * x.shape[-1] ** -0.25
    quad = outer(xs).reshape(xs.shape[:-1] + (-1,)) * (0.5 ** 0.5)
    return cat([ones(xs[..., :1]), xs, quad])


def taylor_features(x, p):
    """Based's second-order Taylor map phi(x) = [1, x', vec(x' x'^T) / sqrt 2], x' = x d^-1/4,
    so phi(q).phi(k) = 1 + t + t^2 / 2 for t = q.k / sqrt d; normalised: f = phi / |phi|,
    s = log |phi|."""
    phi = _taylor_phi(x, lambda parts: np.concatenate(parts, -1), lambda xs: xs[..., :, None] * xs[..., None, :],
                      np.ones_like).astype(x.dtype, copy=False)
    return normalised(phi)


def taylor_features_torch(torch, x, p):
    phi = _taylor_phi(x, lambda parts: torch.cat(parts, -1), lambda xs: xs.unsqueeze(-1) * xs.unsqueeze(-2),
                      torch.ones_like)
    return normalised_torch(torch, phi)


def taylor_size(p, d):
    return 1 + d + d * d


# ----------------------------------------------------------------- the generic core's maps

def normalised(phi):
    """f = phi / |phi|, s = log |phi| (-inf and f = 0 for a zero row): the split of any
    user features, as the C core's normalised map."""
    norm = np.sqrt((phi * phi).sum(-1))
    safe = np.where(norm > 0, norm, 1)
    f = np.where(norm[..., None] > 0, phi / safe[..., None], 0).astype(phi.dtype)
    s = np.where(norm > 0, np.log(safe), -np.inf).astype(phi.dtype)
    return f, s


def normalised_torch(torch, phi):
    norm = torch.linalg.vector_norm(phi, dim=-1)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    f = torch.where((norm > 0).unsqueeze(-1), phi / safe.unsqueeze(-1), torch.zeros_like(phi))
    return f, torch.where(norm > 0, safe.log(), torch.full_like(norm, -math.inf))


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1 (Katharopoulos et al., 2020), in x's dtype: the elu kind's feature map."""
    x = np.asarray(x)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def elu_plus_one_grad(x: np.ndarray) -> np.ndarray:
    """d(elu(x) + 1)/dx, in x's dtype."""
    x = np.asarray(x)
    return np.where(x > 0, 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def elu_features(x, p):
    return normalised(elu_plus_one(x))


def elu_features_torch(torch, x, p):
    return normalised_torch(torch, torch.nn.functional.elu(x) + 1)


def input_size(p, d):
    """F = d: the features are (a function of) the inputs themselves."""
    return d
