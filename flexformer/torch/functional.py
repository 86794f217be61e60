"""Attention for torch tensors: the C kernels on CPU float32/float64, plain PyTorch elsewhere.

``attention(kind, q, k, v, params, causal=..., key_mask=...)`` runs any kind of
:func:`flexformer.attention_kinds`. Backends:

* ``"c"``: the package's forward and backward kernels as PyTorch custom operators
  (:mod:`flexformer.torch.ops`), which ``torch.compile`` traces without a graph break.
  CPU tensors share memory with the NumPy arrays handed to C (no copy when contiguous);
  gradients flow to q, k, v and the learnable kernel parameters.
* ``"torch"``: the identical math in PyTorch operations (the same phi = exp(s) f split,
  stabilisation by the running maximum, denominator guard and chunked causal form as
  ``csrc/linattn_core.inc``), on any device and dtype; the causal form's backward is written
  out (:func:`_causal_backward`), everything else is differentiated by autograd.
  ``torch.compile(fullgraph=True)`` traces it too.
* ``"auto"`` (default): ``"c"`` when every tensor is on the CPU in float32 or float64,
  else ``"torch"``.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from .. import functional as _lin
from ..features import fourier_function
from .._checks import check_positive
from ..registry import get_attention, require_params
from .ops import kernel_attention

fourier_function(torch)   # built now: torch.compile cannot trace the class definition
EPS = _lin.DEFAULT_EPS
CHUNK = 64
Tensor = torch.Tensor


# -------------------------------------------------------------- the torch path

def _features(kind: str, x: Tensor, p: Dict[str, Tensor]):
    """(f, s) with phi(x) = exp(s) f, |f| <= 1, as csrc/featmap_*.inc: the kind's torch twin
    from the registry (each kind's module in :mod:`flexformer.kinds` holds them)."""
    return get_attention(kind).torch_feature_map(torch, x, p)


def _finite_or_zero(m: Tensor) -> Tensor:
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _row_factor(den: Tensor, R: Tensor, eps: float) -> Tensor:
    """1 / max(den, eps R) per row, 0 for rows without keys (R = 0)."""
    seen = R > 0
    g = torch.where(seen, torch.maximum(den, eps * R), 1.0)   # 1 for rows without keys: no NaN gradient
    return torch.where(seen, 1.0 / g, 0.0)


def _normalise(num: Tensor, den: Tensor, R: Tensor, eps: float) -> Tensor:
    # the row factors (N values) first, then one pass over num; rows without keys get 0
    return num * _row_factor(den, R, eps).unsqueeze(-1)


def linear_core(fq: Tensor, fk: Tensor, sk: Tensor, v: Tensor, *, causal: bool, eps: float = EPS,
                chunk: int = CHUNK) -> Tensor:
    """Normalised linear attention from split features; masked keys carry sk = -inf.

    Parameters
    ----------
    fq, fk : Tensor
        Unit-norm features (B, H, Nq, F) and (B, H, Nk, F).
    sk : Tensor (B, H, Nk)
        Log-weights of the keys.
    v : Tensor (B, H, Nk, e)
    causal : bool
    eps : float, optional
    chunk : int, optional

    Returns
    -------
    Tensor (B, H, Nq, e)

    Examples
    --------
    >>> import numpy as np, torch, flexformer as ff
    >>> from flexformer.torch import linear_core
    >>> x = torch.rand(1, 1, 5, 3, dtype=torch.float64) + 0.1
    >>> f = x / x.norm(dim=-1, keepdim=True)
    >>> out = linear_core(f, f, x.norm(dim=-1).log(), x, causal=False)
    >>> bool(np.allclose(out.numpy(), ff.linear_attention(x.numpy(), x.numpy(), x.numpy())))
    True
    """
    if not causal:
        M = _finite_or_zero(sk.amax(-1, keepdim=True)).detach()  # the shift cancels: no gradient
        w = torch.exp(sk - M)
        fkw = fk * w.unsqueeze(-1)
        return _normalise(fq @ (fkw.transpose(-1, -2) @ v), (fq @ fkw.sum(-2).unsqueeze(-1)).squeeze(-1),
                          w.sum(-1, keepdim=True).expand(fq.shape[:-1]), eps)
    return _causal_chunked(fq, fk, sk, v, eps, chunk)


def _causal_loop(fq: Tensor, fk: Tensor, sk: Tensor, v: Tensor, eps: float, chunk: int) -> Tensor:
    """The chunked causal form as csrc/linattn_core.inc runs it, one chunk after another:
    the plain reference for :func:`_causal_chunked` (tests compare the two)."""
    B, H, N, F = fq.shape
    S = fq.new_zeros(B, H, F, v.shape[-1])
    z = fq.new_zeros(B, H, F)
    R = fq.new_zeros(B, H)
    Mprev = torch.full((B, H), -math.inf, dtype=fq.dtype, device=fq.device)
    outs = []
    for c0 in range(0, N, chunk):
        fqc, fkc, skc, vc = fq[:, :, c0:c0 + chunk], fk[:, :, c0:c0 + chunk], sk[:, :, c0:c0 + chunk], v[:, :, c0:c0 + chunk]
        n = fqc.shape[2]
        with torch.no_grad():                              # row maxima over the visible prefix
            Mi = _finite_or_zero(torch.maximum(Mprev.unsqueeze(-1), torch.cummax(skc, -1).values))
        alpha = torch.exp(Mprev.unsqueeze(-1) - Mi)        # the carried state's weight per row
        tril = torch.ones(n, n, dtype=torch.bool, device=fq.device).tril()
        E = torch.exp(skc.unsqueeze(-2) - Mi.unsqueeze(-1)).masked_fill(~tril, 0.0)
        A = (fqc @ fkc.transpose(-1, -2)) * E
        num = A @ vc + alpha.unsqueeze(-1) * (fqc @ S)
        den = A.sum(-1) + alpha * (fqc @ z.unsqueeze(-1)).squeeze(-1)
        outs.append(_normalise(num, den, E.sum(-1) + alpha * R.unsqueeze(-1), eps))
        Mn = Mi[..., -1]
        keep = torch.exp(Mprev - Mn)
        wf = fkc * torch.exp(skc - Mn.unsqueeze(-1)).unsqueeze(-1)
        S = keep[..., None, None] * S + wf.transpose(-1, -2) @ vc
        z = keep.unsqueeze(-1) * z + wf.sum(-2)
        R = keep * R + torch.exp(skc - Mn.unsqueeze(-1)).sum(-1)
        Mprev = Mn
    return torch.cat(outs, 2)


PREFIX_GROUP = 64   # chunks per level of the carried-state scan (see _prefix_plan)


def _prefix_plan(m: Tensor, low: float, group: Optional[int] = None):
    """The weights of the exclusive prefix over chunks: for chunk c, its scale
    P_c = max_{c' < c} m_c' (``low`` for the first) and the weights exp(m_c' - P_c) that
    bring the earlier chunks' sums to it (each at most 1, as when the C core rescales its
    carried state). m (B, H, C) holds each chunk's own scale; nothing here has a gradient.

    Up to ``group`` chunks: one (C x C) weight matrix. Beyond: the chunks in groups of
    ``group``, the prefix inside each group and the prefix over the groups' own totals (the
    same plan, recursively), so the cost stays near linear in C. Returns (P, plan) for
    :func:`_prefix_apply`."""
    group = PREFIX_GROUP if group is None else group
    B, H, C = m.shape
    with torch.no_grad():
        if C <= group:
            P = torch.cummax(torch.cat([m.new_full((B, H, 1), low), m[:, :, :-1]], 2), 2).values
            earlier = torch.ones(C, C, dtype=torch.bool, device=m.device).tril(-1)
            return P, ("dense", torch.exp(m.unsqueeze(-2) - P.unsqueeze(-1)).masked_fill(~earlier, 0.0))
        G = -(-C // group)
        mg = torch.nn.functional.pad(m, (0, G * group - C), value=low).reshape(B, H * G, group)
        P_local, inner = _prefix_plan(mg, low, group)                 # within each group
        top = mg.amax(-1)                                             # each group's scale
        w = torch.exp(mg - top.unsqueeze(-1))                         # its chunks' weights in its total
        P_group, outer = _prefix_plan(top.reshape(B, H, G), low, group)
        P_group = P_group.reshape(B, H * G, 1)
        P = torch.maximum(P_local, P_group)
        a, b = torch.exp(P_group - P), torch.exp(P_local - P)        # earlier groups, this group
        inner = ("dense", b.unsqueeze(-1) * inner[1])                 # b folded into the small matrix
        return P.reshape(B, H, G * group)[:, :, :C], ("grouped", C, inner, w, outer, a)


def _prefix_apply(plan, X: Tensor, transpose: bool = False) -> Tensor:
    """The weighted sums of the earlier chunks' X (B, H, C, D) under ``plan``; with
    ``transpose`` the transposed map (the backward of the sums: each chunk's share of the
    later chunks' gradients)."""
    if plan[0] == "dense":
        return (plan[1].transpose(-1, -2) if transpose else plan[1]) @ X
    _, C, inner, w, outer, a = plan
    B, H, _, D = X.shape
    G, group = w.shape[1] // H, w.shape[-1]
    Xg = _groups(X, G * group - C).view(B, H * G, group, D)
    if not transpose:
        totals = w.unsqueeze(-2) @ Xg                                 # (B, H*G, 1, D)
        before = _prefix_apply(outer, totals.view(B, H, G, D)).reshape(B, H * G, 1, D)
        out = _prefix_apply(inner, Xg).addcmul_(a.unsqueeze(-1), before)   # this group's, then earlier groups'
    else:
        before = a.unsqueeze(-2) @ Xg                                 # what reached the earlier groups' totals
        totals = _prefix_apply(outer, before.view(B, H, G, D), True).reshape(B, H * G, 1, D)
        out = _prefix_apply(inner, Xg, True).addcmul_(w.unsqueeze(-1), totals)
    return _ungroup(out.view(B, H, G * group, D), C)


def _groups(X: Tensor, pad: int) -> Tensor:
    """X (B, H, C, D) contiguous, with ``pad`` zero chunks appended (a copy only when pad > 0)."""
    return torch.nn.functional.pad(X, (0, 0, 0, pad)) if pad else X.contiguous()


def _ungroup(X: Tensor, C: int) -> Tensor:
    return X[:, :, :C] if X.shape[2] != C else X


def _causal_chunked(fq: Tensor, fk: Tensor, sk: Tensor, v: Tensor, eps: float, chunk: int) -> Tensor:
    """The chunked causal form with every chunk at once: masked products inside each chunk,
    and the state the earlier chunks carry as weighted sums of the chunks' own sums (each
    kept at its own maximum and rescaled as the C core rescales its state;
    :func:`_prefix_plan`), so there is no loop over chunks in Python. Same values as
    :func:`_causal_loop` to rounding; the backward is written out (:func:`_causal_backward`)."""
    N = fq.shape[2]
    pad = -N % chunk
    if pad:  # padded keys weigh exp(-inf) = 0; padded query rows are dropped at the end
        fq, fk, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v))
        sk = torch.nn.functional.pad(sk, (0, pad), value=-math.inf)
    out = _CausalChunks.apply(fq, fk, sk, v, eps, chunk)
    return out[:, :, :N] if pad else out


def _causal_parts(fq: Tensor, fk: Tensor, sk: Tensor, v: Tensor, eps: float, chunk: int):
    """The forward of :func:`_causal_chunked` for N a multiple of ``chunk``: the output and
    what its backward reuses. Differentiable operations only, so under autograd it is also
    the composed form that second derivatives go through."""
    B, H, N, F = fq.shape
    e = v.shape[-1]
    C = N // chunk
    BHC = B * H * C
    fq3, fk3 = fq.reshape(BHC, chunk, F), fk.reshape(BHC, chunk, F)
    sk4 = sk.reshape(B, H, C, chunk)
    # an empty prefix has scale "minus infinity"; a finite stand-in keeps exp() free of inf - inf
    low = torch.finfo(sk.dtype).min / 4
    with torch.no_grad():
        m = sk4.amax(-1).clamp(min=low)                             # each chunk's own maximum
    w = torch.exp(sk4 - m.unsqueeze(-1))
    # a column of ones beside the values: one product gives a numerator and its denominator
    v1 = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], -1).view(BHC, chunk, e + 1)
    wv1 = w.view(BHC, chunk, 1) * v1
    # each chunk's sums S (F x e) and z (F) side by side, and R, at its scale m; then the
    # earlier chunks' at each chunk's scale P
    P, plan = _prefix_plan(m, low)
    Szp = _prefix_apply(plan, (fk3.transpose(1, 2) @ wv1).view(B, H, C, F * (e + 1))).reshape(BHC, F, e + 1)
    R = _prefix_apply(plan, w.sum(-1, keepdim=True)).reshape(BHC, 1)
    with torch.no_grad():                                           # each row's visible maximum
        Mi = torch.maximum(P.unsqueeze(-1), torch.cummax(sk4, -1).values)
        alpha = torch.exp(P.unsqueeze(-1) - Mi).view(BHC, chunk, 1)   # the carried sums' weight per row
        tril = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril()
    # masked before exp: above the diagonal exp could overflow (and give 0 * inf in the backward)
    E = torch.exp((sk4.unsqueeze(-2) - Mi.unsqueeze(-1)).masked_fill(~tril, -math.inf)).view(BHC, chunk, chunk)
    QK = fq3 @ fk3.transpose(1, 2)
    nd = (QK * E @ v1).addcmul_(alpha, fq3 @ Szp)
    # split, not sliced: the backward joins the two gradients instead of zero-filling twice
    num, den = nd.split([e, 1], -1)
    Rrow = E.sum(-1) + alpha.squeeze(-1) * R
    ginv = _row_factor(den.squeeze(-1), Rrow, eps)
    out = num * ginv.unsqueeze(-1)
    saved = (v1, wv1, w, E, QK, Szp, alpha, ginv, den.squeeze(-1).clone(), Rrow, out)
    return out.view(B, H, N, e), saved, plan


def _causal_backward(fq: Tensor, fk: Tensor, saved, plan, dout: Tensor, eps: float):
    """The gradients (dfq, dfk, dsk, dv) of :func:`_causal_parts` by hand: the terms autograd
    would form, with the sums accumulated in place and only A = QK E formed again."""
    v1, wv1, w, E, QK, Szp, alpha, ginv, den, Rrow, out = saved
    B, H, C, chunk = w.shape
    BHC, F, e = B * H * C, fq.shape[-1], v1.shape[-1] - 1
    fq3, fk3, w = fq.reshape(BHC, chunk, F), fk.reshape(BHC, chunk, F), w.view(BHC, chunk)
    dout = dout.reshape(BHC, chunk, e)
    # out = num / g with g = max(den, eps R): dout reaches num as dout / g and g as -out . dout / g
    dg = (dout * out).sum(-1).mul_(ginv).neg_()                    # 0 on rows without keys (ginv = 0)
    to_den = (den > eps * Rrow).to(dg.dtype).add_((den == eps * Rrow).to(dg.dtype), alpha=0.5)  # torch.maximum's split
    dnd = torch.cat([dout * ginv.unsqueeze(-1), (dg * to_den).unsqueeze(-1)], -1)
    dRrow = dg.mul_(1.0 - to_den).mul_(eps)
    # nd = (QK * E) v1 + alpha (fq Szp); each product's operands let go once used (the
    # peak of live memory sets how much fresh, page-faulting memory the next call touches)
    A = QK * E
    dA = dnd @ v1.transpose(1, 2)
    dv1 = A.transpose(1, 2) @ dnd
    dQK = dA * E
    # E = exp(sk_j - M_i) on and below the diagonal, and R sums E's rows
    dsk = dA.mul_(A).sum(-2).add_((dRrow.unsqueeze(1) @ E).squeeze(1))
    del A, dA
    dnd.mul_(alpha)
    dSzp = fq3.transpose(1, 2) @ dnd
    dfq = dnd @ Szp.transpose(1, 2)
    del dnd
    dfq.baddbmm_(dQK, fk3)
    dfk = dQK.transpose(1, 2) @ fq3
    del dQK
    dR = (alpha.squeeze(-1) * dRrow).sum(-1)
    dSz = _prefix_apply(plan, dSzp.view(B, H, C, F * (e + 1)), True).reshape(BHC, F, e + 1)
    del dSzp
    dwsum = _prefix_apply(plan, dR.view(B, H, C, 1), True).reshape(BHC, 1)
    # Sz = fk^T (w v1)
    dfk.baddbmm_(wv1, dSz.transpose(1, 2))
    dwv1 = fk3 @ dSz
    del dSz
    dv = torch.addcmul(dv1[..., :e], w.unsqueeze(-1), dwv1[..., :e])
    del dv1
    dsk.addcmul_(dwv1.mul_(v1).sum(-1).add_(dwsum), w)
    shape = (B, H, C * chunk)
    return dfq.view(*shape, F), dfk.view(*shape, F), dsk.view(shape), dv.reshape(*shape, e)


class _CausalChunks(torch.autograd.Function):
    """:func:`_causal_parts` with :func:`_causal_backward`; a gradient of the gradient
    (``create_graph``) differentiates the composed form instead."""

    @staticmethod
    def forward(ctx, fq, fk, sk, v, eps, chunk):
        out, saved, plan = _causal_parts(fq, fk, sk, v, eps, chunk)
        ctx.save_for_backward(fq, fk, sk, v, *saved)
        ctx.plan, ctx.eps, ctx.chunk = plan, eps, chunk
        return out

    @staticmethod
    def backward(ctx, dout):
        fq, fk, sk, v, *saved = ctx.saved_tensors
        wanted = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():
            inputs = [x for x, want in zip((fq, fk, sk, v), wanted) if want]
            with torch.enable_grad():
                out = _causal_parts(fq, fk, sk, v, ctx.eps, ctx.chunk)[0]
            grads = iter(torch.autograd.grad(out, inputs, dout, create_graph=True, allow_unused=True))
            return tuple(next(grads) if want else None for want in wanted) + (None, None)
        grads = _causal_backward(fq, fk, saved, ctx.plan, dout, ctx.eps)
        return tuple(g if want else None for g, want in zip(grads, wanted)) + (None, None)


def _softmax(q, k, v, causal, key_mask, scale=None):
    logits = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    visible = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device)
    if causal:
        visible = visible.tril()
    visible = visible.expand(logits.shape)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]
    logits = logits.masked_fill(~visible, -math.inf)
    top = _finite_or_zero(logits.amax(-1, keepdim=True)).detach()
    w = torch.exp(logits - top)
    den = w.sum(-1, keepdim=True)
    return (w @ v) / torch.where(den > 0, den, torch.ones_like(den))


def torch_attention(kind: str, q: Tensor, k: Tensor, v: Tensor, params: Dict[str, Tensor], *, causal: bool = False,
                    key_mask: Optional[Tensor] = None, eps: float = EPS) -> Tensor:
    """The pure-PyTorch implementation of every kind (any device and dtype; float16 and
    bfloat16 inputs are computed in float32 and the output cast back).

    Parameters
    ----------
    kind, q, k, v, params, causal, key_mask
        As in :func:`attention`.
    eps : float, optional

    Returns
    -------
    Tensor

    Examples
    --------
    >>> import numpy as np, torch, flexformer as ff
    >>> from flexformer.torch import attention
    >>> q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    >>> from flexformer.torch import torch_attention
    >>> out = torch_attention("softmax", q, k, v, {}, causal=True)
    >>> bool(np.allclose(out.numpy(), ff.softmax_attention(q.numpy(), k.numpy(), v.numpy(), causal=True)))
    True
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        # half precision: features, sums and the state in float32 (their sums lose the
        # small terms, and exp of the key weights overflows float16), the output cast back
        wide = {n: p.float() for n, p in params.items()}
        out = torch_attention(kind, q.float(), k.float(), v.float(), wide, causal=causal, key_mask=key_mask, eps=eps)
        return out.to(q.dtype)
    if q.shape[2] == 0 or k.shape[2] == 0:
        # no rows, or no keys: zero rows, as the C kernels give, kept on the autograd graph
        # (the sums are over empty tensors, so exactly 0)
        link = q.sum() * 0 if q.shape[2] == 0 else (k.sum() + v.sum()) * 0
        return q.new_zeros(q.shape[:3] + (v.shape[-1],)) + link
    if kind == "softmax":
        return _softmax(q, k, v, causal, key_mask)
    if kind == "linformer":
        if causal:
            raise ValueError("linformer has no causal mode")
        Nk = k.shape[2]
        if key_mask is not None:
            keep = key_mask[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        E, F = params["E"][..., :Nk], params["F"][..., :Nk]
        spec = "pn,bhnx->bhpx" if E.dim() == 2 else "hpn,bhnx->bhpx"
        return _softmax(q, torch.einsum(spec, E, k), torch.einsum(spec, F, v), False, None)
    fq, _ = _features(kind, q, params)
    fk, sk = _features(kind, k, params)
    if key_mask is not None:
        sk = sk.masked_fill(~key_mask[:, None, :], -math.inf)
    return linear_core(fq, fk, sk, v, causal=causal, eps=eps)


# ------------------------------------------------------------------ dispatch

def _c_ok(tensors: Sequence[Tensor]) -> bool:
    dtype = tensors[0].dtype
    return all(t.device.type == "cpu" and t.dtype == dtype and t.dtype in (torch.float32, torch.float64)
               and t.layout == torch.strided for t in tensors)


def check_backend(backend) -> str:
    """``backend``, one of "auto", "c", "torch"; ValueError otherwise."""
    if not (isinstance(backend, str) and backend in ("auto", "c", "torch")):
        raise ValueError(f"backend must be 'auto', 'c' or 'torch', got {backend!r}")
    return backend


def attention(kind: str, q: Tensor, k: Tensor, v: Tensor, params: Optional[Dict[str, Tensor]] = None, *,
              causal: bool = False, key_mask: Optional[Tensor] = None, eps: Optional[float] = None,
              backend: str = "auto") -> Tensor:
    """Attention of a registered kind on torch tensors, differentiable.

    Parameters
    ----------
    kind : str
        A name from ``flexformer.attention_kinds()``.
    q, k, v : Tensor
        (B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, e).
    params : dict of Tensor
        The kind's parameters (``get_attention(kind).params``); gradients reach those
        with ``requires_grad`` that the kind learns.
    causal : bool
    key_mask : bool Tensor (B, Nk), optional
        True = attend.
    eps : float, optional
        The linear kinds' denominator guard (default :data:`flexformer.DEFAULT_EPS`), as in
        :func:`flexformer.attention`.
    backend : {"auto", "c", "torch"}
        See the module docstring; "c" raises ValueError for tensors it cannot take.

    Returns
    -------
    Tensor
        (B, H, Nq, e).

    Raises
    ------
    ValueError
        An unknown kind or backend, a missing or unknown parameter, ``eps`` not a finite
        number > 0 or given to a kind without a guard, or ``backend="c"`` for tensors the C
        kernels cannot take.
    TypeError
        A non-tensor argument or a non-bool ``key_mask``.

    Examples
    --------
    >>> import numpy as np, torch, flexformer as ff
    >>> from flexformer.torch import attention
    >>> q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    >>> params = {n: torch.tensor(p, requires_grad=True) for n, p in ff.get_attention("flex_s").init(2, 4, rng=0).items()}
    >>> out = attention("flex_s", q, k, v, params, causal=True)
    >>> out.sum().backward()
    >>> want = ff.flex_s_attention(q.numpy(), k.numpy(), v.numpy(), params["omega"].detach().numpy(), causal=True)
    >>> bool(np.allclose(out.detach().numpy(), want)), params["omega"].grad.shape
    (True, torch.Size([2, 4, 4]))
    """
    spec = get_attention(kind)
    params = {} if params is None else params
    require_params(kind, params)
    check_backend(backend)
    eps = check_positive("eps", eps, optional=True)
    spec._eps_option(eps)  # a ValueError for the kinds without a guard
    if key_mask is not None and key_mask.dtype != torch.bool:
        raise TypeError(f"key_mask must be a bool tensor, got {key_mask.dtype}")
    names = list(spec.params)
    tensors = [q, k, v] + [params[n] for n in names]
    labels = ["q", "k", "v"] + names
    for label, t in zip(labels, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{label} must be a floating-point tensor, got {t.dtype}")
    for label, t in zip(labels[:3], tensors[:3]):
        if t.dim() != 4:
            raise ValueError(f"{label} must be 4-d (B, H, N, {'e' if label == 'v' else 'd'}), got shape "
                             f"{tuple(t.shape)}")
    if len({t.dtype for t in tensors}) > 1 or len({t.device for t in tensors}) > 1:
        raise TypeError("q, k, v and the parameters must share one dtype and device, got "
                        + ", ".join(f"{lab} {t.dtype} on {t.device}" for lab, t in zip(labels, tensors)))
    use_c = _c_ok(tensors) if backend == "auto" else backend == "c"
    if backend == "c" and not _c_ok(tensors):
        raise ValueError("backend 'c' needs CPU tensors that all share float32 or float64; got "
                         + ", ".join(f"{t.dtype} on {t.device}" for t in tensors))
    if not use_c:
        return torch_attention(kind, q, k, v, {n: params[n] for n in names}, causal=causal, key_mask=key_mask,
                               eps=EPS if eps is None else eps)
    return kernel_attention(kind, q, k, v, [params[n] for n in names], causal=bool(causal), key_mask=key_mask,
                            eps=eps)
