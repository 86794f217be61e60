"""The C kernels as PyTorch custom operators (``torch.library.custom_op``).

Two operators serve every kind of the registry, which the kind's name selects:

* ``flexformer::attention_forward(kind, q, k, v, params, causal, key_mask, eps, keep)`` returns
  ``(out, key_state, projections)``; the last two are what a bidirectional forward keeps
  for its backward (empty when ``keep`` is False or the kind keeps nothing);
* ``flexformer::attention_backward(kind, dout, q, k, v, params, causal, key_mask, eps,
  key_state, projections)`` returns ``[dq, dk, dv, *dparams]``, one gradient per learnable
  parameter of the kind in the registry's order.

Each has a fake (meta) implementation giving output shapes from input shapes, so
``torch.compile`` traces them as single graph nodes with no graph break, and the forward
has its autograd formula registered (:func:`torch.library.register_autograd`). The
backward's own derivative is not implemented: asking for it (double backward) raises a
RuntimeError that says so.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import numpy as np
import torch

from ..registry import get_attention

Tensor = torch.Tensor


def _np(t: Tensor) -> np.ndarray:
    return t.detach().numpy()


def _params(kind: str, params: List[Tensor]) -> dict:
    return dict(zip(get_attention(kind).params, (_np(p) for p in params)))


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


@torch.library.custom_op("flexformer::attention_forward", mutates_args=(), device_types="cpu")
def attention_forward(kind: str, q: Tensor, k: Tensor, v: Tensor, params: List[Tensor], causal: bool,
                      key_mask: Optional[Tensor], eps: Optional[float], keep: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The kind's C forward (``eps``: the linear kinds' guard, None for the default); with
    ``keep`` (bidirectional kinds that have a key state) also the key state and the
    projections its backward can reuse."""
    spec = get_attention(kind)
    mask = None if key_mask is None else _np(key_mask)
    values = _params(kind, params)
    if keep:
        out, key_state, *kept = spec.forward(_np(q), _np(k), _np(v), values, key_mask=mask, eps=eps,
                                             return_key_state=True, return_projections=spec.projections)
        projections = torch.from_numpy(kept[0]) if kept else _empty(q)
        return torch.from_numpy(out), torch.from_numpy(key_state), projections
    out = spec.forward(_np(q), _np(k), _np(v), values, causal=causal, key_mask=mask, eps=eps)
    return torch.from_numpy(out), _empty(q), _empty(q)


@functools.lru_cache(maxsize=256)
def _kept_widths(kind: str, param_shapes: Tuple[Tuple[int, ...], ...], H: int, d: int, e: int,
                 dtype: str) -> Tuple[int, int]:
    """The last axes of the key state and the projections for these sizes: read off one
    forward of the kernel on a single zero token (they do not depend on B or N)."""
    spec = get_attention(kind)
    x = np.zeros((1, H, 1, d), dtype)
    values = {n: np.zeros(s, dtype) for n, s in zip(spec.params, param_shapes)}
    _, key_state, *kept = spec.forward(x, x, np.zeros((1, H, 1, e), dtype), values, return_key_state=True,
                                       return_projections=spec.projections)
    return key_state.shape[-1], (kept[0].shape[-1] if kept else -1)


@attention_forward.register_fake
def _attention_forward_fake(kind, q, k, v, params, causal, key_mask, eps, keep):
    B, H, Nq, d = q.shape
    out = q.new_empty((B, H, Nq, v.shape[-1]))
    if not keep:
        return out, _empty(q), _empty(q)
    width, proj = _kept_widths(kind, tuple(tuple(int(n) for n in p.shape) for p in params), int(H), int(d),
                               int(v.shape[-1]), str(q.dtype).replace("torch.", ""))
    key_state = q.new_empty((B, H, width))
    projections = q.new_empty((B, H, Nq + k.shape[2], proj)) if proj >= 0 else _empty(q)
    return out, key_state, projections


@torch.library.custom_op("flexformer::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward(kind: str, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, params: List[Tensor],
                       causal: bool, key_mask: Optional[Tensor], eps: Optional[float], key_state: Tensor,
                       projections: Tensor) -> List[Tensor]:
    """``[dq, dk, dv, *dparams]`` of the kind's C backward (dparams: the learnable ones)."""
    spec = get_attention(kind)
    kept = {}
    if key_state.numel():
        kept["key_state"] = _np(key_state)
    if projections.numel():
        kept["projections"] = _np(projections)
    dq, dk, dv, dparams = spec.backward(np.ascontiguousarray(_np(dout)), _np(q), _np(k), _np(v),
                                        _params(kind, params), causal=causal,
                                        key_mask=None if key_mask is None else _np(key_mask), eps=eps, **kept)
    return [torch.from_numpy(g) for g in (dq, dk, dv)] + [torch.from_numpy(dparams[n]) for n in spec.learnable]


@attention_backward.register_fake
def _attention_backward_fake(kind, dout, q, k, v, params, causal, key_mask, eps, key_state, projections):
    spec = get_attention(kind)
    learned = [p for n, p in zip(spec.params, params) if n in spec.learnable]
    return [t.new_empty(t.shape) for t in (q, k, v, *learned)]   # contiguous, as the kernels return them


def _setup_forward(ctx, inputs, output):
    kind, q, k, v, params, causal, key_mask, eps, keep = inputs
    _, key_state, projections = output
    ctx.mark_non_differentiable(key_state, projections)
    ctx.kind, ctx.causal, ctx.eps, ctx.num_params, ctx.has_mask = kind, causal, eps, len(params), key_mask is not None
    extra = (key_mask,) if key_mask is not None else ()
    ctx.save_for_backward(q, k, v, key_state, projections, *params, *extra)


def _backward_forward(ctx, dout, _dkey_state, _dprojections):
    q, k, v, key_state, projections, *rest = ctx.saved_tensors
    params, key_mask = rest[:ctx.num_params], (rest[ctx.num_params] if ctx.has_mask else None)
    dq, dk, dv, *learned = attention_backward(ctx.kind, dout, q, k, v, list(params), ctx.causal, key_mask,
                                              ctx.eps, key_state, projections)
    spec = get_attention(ctx.kind)
    by_name = dict(zip(spec.learnable, learned))
    dparams = [by_name.get(n) for n in spec.params]
    return None, dq, dk, dv, dparams, None, None, None, None


attention_forward.register_autograd(_backward_forward, setup_context=_setup_forward)


def _setup_backward(ctx, inputs, output):
    ctx.kind = inputs[0]


def _no_double_backward(ctx, *grads):
    raise RuntimeError(f"flexformer: the C kernels of {ctx.kind!r} have no second derivative, so double "
                       f"backward (a gradient of a gradient, e.g. create_graph=True then grad again) is not "
                       f"supported on this path; pass backend='torch' to flexformer.torch.attention for it")


attention_backward.register_autograd(_no_double_backward, setup_context=_setup_backward)


def kernel_attention(kind: str, q: Tensor, k: Tensor, v: Tensor, params: List[Tensor], *, causal: bool,
                     key_mask: Optional[Tensor], eps: Optional[float] = None) -> Tensor:
    """The C path of :func:`flexformer.torch.attention` through the operators above."""
    spec = get_attention(kind)
    keep = bool(spec.key_state and not causal and torch.is_grad_enabled()
                and any(t.requires_grad for t in (q, k, v, *params)))
    out, _, _ = torch.ops.flexformer.attention_forward(kind, q, k, v, params, causal, key_mask, eps, keep)
    return out
