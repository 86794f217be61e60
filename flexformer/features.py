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


_FOURIER = {}


def fourier_features_torch(torch, x, W, pairs: int):
    """f = (pairs^2 m)^-1/2 [sum_p cos(W_p x), sum_p sin(W_p x)] for W (H, pairs * m, d):
    ``pairs`` = 1 is the flex_s map, 2 the flex_n map (W = [omega1; omega2]).

    One autograd node in place of a dozen: the forward writes cos and sin into one buffer
    that the backward reuses (torch's own cos and sin evaluate each other again for their
    gradients), and the backward forms du = df_sin cos - df_cos sin in one pass before the two
    products dx = du W and dW = du^T x. Under ``create_graph`` the backward evaluates the
    same formulas with differentiable operations, so it is differentiable to any order."""
    fn = _FOURIER.get(torch)
    if fn is None:
        class FourierFeatures(torch.autograd.Function):
            @staticmethod
            def forward(x, W, pairs):
                B, H, N, _ = x.shape
                m = W.shape[1] // pairs
                # buffers stay below glibc's 32 MiB mmap limit where they can: a larger block
                # is mapped afresh, and its page faults cost more than the arithmetic
                u = torch.matmul(x, W.transpose(-1, -2).unsqueeze(0))
                f = torch.empty(B, H, N, 2, m, dtype=x.dtype, device=x.device)
                if pairs == 1:
                    torch.cos(u, out=f[:, :, :, 0])
                    torch.sin(u, out=f[:, :, :, 1])
                    c = s = None
                else:
                    c = torch.cos(u).view(B, H, N, pairs, m)
                    s = torch.sin(u, out=u).view(B, H, N, pairs, m)
                    for part, t in enumerate((c, s)):
                        if pairs == 2:   # one add: a reduction over an axis of 2 zero-fills first
                            torch.add(t[:, :, :, 0], t[:, :, :, 1], out=f[:, :, :, part])
                        else:
                            torch.sum(t, -2, out=f[:, :, :, part])
                return f.mul_(1.0 / (pairs * math.sqrt(m))).view(B, H, N, 2 * m), c, s

            @staticmethod
            def setup_context(ctx, inputs, output):
                x, W, pairs = inputs
                f, c, s = output
                ctx.pairs = pairs
                if pairs == 1:
                    ctx.save_for_backward(x, W, f)
                else:
                    ctx.mark_non_differentiable(c, s)
                    ctx.save_for_backward(x, W, c, s)

            @staticmethod
            def backward(ctx, df, *_):
                x, W, *cs = ctx.saved_tensors
                pairs = ctx.pairs
                B, H, N, _ = x.shape
                m = W.shape[1] // pairs
                scale = 1.0 / (pairs * math.sqrt(m))
                df = df.reshape(B, H, N, 2, 1, m)
                unscaled = False
                if torch.is_grad_enabled():   # create_graph: the same formulas, differentiable
                    u = torch.matmul(x, W.transpose(-1, -2).unsqueeze(0)).view(B, H, N, pairs, m)
                    du = (df[:, :, :, 1] * torch.cos(u) - df[:, :, :, 0] * torch.sin(u)) * scale
                elif pairs == 1:              # the saved output is scale * [cos u, sin u]
                    f = cs[0].view(B, H, N, 2, 1, m)
                    du = torch.mul(f[:, :, :, 0], df[:, :, :, 1])
                    du.addcmul_(f[:, :, :, 1], df[:, :, :, 0], value=-1.0)
                else:                         # the scale goes onto the small W and dW below
                    c, s = cs
                    du = torch.mul(c, df[:, :, :, 1])
                    du.addcmul_(s, df[:, :, :, 0], value=-1.0)
                    unscaled = True
                du = du.view(B, H, N, pairs * m)
                Ws = W * scale if unscaled else W
                dx = torch.matmul(du, Ws.unsqueeze(0)) if ctx.needs_input_grad[0] else None
                dW = None
                if ctx.needs_input_grad[1]:
                    dW = torch.matmul(du.transpose(-1, -2), x)
                    dW = dW.sum(0) if B > 1 else dW[0]
                    if unscaled:
                        dW.mul_(scale)
                return dx, dW, None

        fn = _FOURIER[torch] = FourierFeatures
    return fn.apply(x, W, pairs)[0]


def flex_s_features_torch(torch, x, p):
    return fourier_features_torch(torch, x, p["omega"], 1), (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))


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
    # one projection onto the stacked pair [A; B], as the C map does
    f = fourier_features_torch(torch, x, torch.cat([p["omega1"], p["omega2"]], 1), 2)
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
