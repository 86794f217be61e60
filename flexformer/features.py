"""NumPy and PyTorch twins of the C feature maps in their split form
phi(x) = exp(s(x)) f(x), |f| <= 1, with gradients with respect to the kernel parameters.

The C kernels never return features (they consume them in tiles); code that needs them
outside a kernel call (recurrent decoding, distillation, plots, the torch backend) uses
these. Each map takes x (B, H, T, d) and returns (f (B, H, T, F), s (B, H, T)) in x's
dtype, the same split as ``csrc/featmap_*.inc``, so a guard or a stabiliser built on it
matches the kernels. The torch twins take the ``torch`` module as their first argument, so
this module never imports torch.

This module holds what several kinds share: the projection onto frequencies, the torch
Fourier-feature node of flex_s and flex_n, and the normalised split of taylor's, elu's and
the user's own features. Each kind's own map lives in its module under
:mod:`flexformer.kinds`; the registry looks them up by kind name
(:func:`flexformer.registry.features`, ``num_features``, ``feature_backward``). This module
knows no kind names.
"""
from __future__ import annotations

import math
from typing import Dict

import numpy as np

Params = Dict[str, np.ndarray]


def project(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """x (B, H, T, d) onto the rows of W (H, m, d): (B, H, T, m), in x's dtype."""
    return np.einsum("bhtd,hmd->bhtm", x, W.astype(x.dtype, copy=False))


# ----------------------------------------------------------------- Fourier features (flex_s, flex_n)

_FOURIER = []   # the Function once built (a list: torch.compile cannot hash the torch module)


def fourier_features_torch(torch, x, W, pairs: int):
    """f = (pairs^2 m)^-1/2 [sum_p cos(W_p x), sum_p sin(W_p x)] for W (H, pairs * m, d):
    ``pairs`` = 1 is the flex_s map, 2 the flex_n map (W = [omega1; omega2]).

    One autograd node in place of a dozen: the forward writes cos and sin into one buffer
    that the backward reuses (torch's own cos and sin evaluate each other again for their
    gradients), and the backward forms du = df_sin cos - df_cos sin in one pass before the two
    products dx = du W and dW = du^T x. Under ``create_graph`` the backward evaluates the
    same formulas with differentiable operations, so it is differentiable to any order."""
    return fourier_function(torch).apply(x, W, pairs)[0]


def fourier_function(torch):
    """The autograd Function behind :func:`fourier_features_torch`, built on first use (this
    module imports without torch). :mod:`flexformer.torch` builds it at import, because
    ``torch.compile`` cannot trace a class definition."""
    if not _FOURIER:
        compiling = getattr(torch.compiler, "is_compiling", lambda: False)   # torch >= 2.3

        class FourierFeatures(torch.autograd.Function):
            @staticmethod
            def forward(x, W, pairs):
                B, H, N, _ = x.shape
                m = W.shape[1] // pairs
                # buffers stay below glibc's 32 MiB mmap limit where they can: a larger block
                # is mapped afresh, and its page faults cost more than the arithmetic
                u = torch.matmul(x, W.transpose(-1, -2).unsqueeze(0))
                if compiling():   # the compiler fuses these; it cannot trace
                    # writes into the strided halves of f below
                    c, s = torch.cos(u).view(B, H, N, pairs, m), torch.sin(u).view(B, H, N, pairs, m)
                    f = torch.stack([c.sum(-2), s.sum(-2)], 3) * (1.0 / (pairs * math.sqrt(m)))
                    return (f.view(B, H, N, 2 * m), None, None) if pairs == 1 else (f.view(B, H, N, 2 * m), c, s)
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

        _FOURIER.append(FourierFeatures)
    return _FOURIER[0]


# ----------------------------------------------------------------- the normalised split

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
