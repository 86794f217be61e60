"""The registry: every attention kind by name, with a uniform init / forward / backward
triple and :func:`attention`, the one call for every kind.

Model layers switch attention by name::

    kind = flexformer.get_attention("flex_n")
    params = kind.init(num_heads=4, head_dim=32, rng=0)
    out = kind.forward(q, k, v, params, causal=True)
    dq, dk, dv, dparams = kind.backward(dout, q, k, v, params, causal=True)

``params`` is a dict of NumPy arrays; ``dparams`` holds the gradients of the learnable
ones only (``kind.learnable``). ``flexformer.attention_kinds()`` lists the names.

Each kind is defined once, in its module under :mod:`flexformer.kinds` (its feature map's
NumPy and torch twins, initialiser, diagnostics hooks and capabilities; its parameter
names, layouts, learnable subset and causal support from its row of csrc/kinds.h). Every
other list of kinds (recurrent decoding, distillation, the torch bridge, the command line's
defaults, the diagnostics) is derived from this table. Adding a kind: docs/architecture.md.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .features import normalised
from .kinds import TABLE as _KINDS
from .kinds.base import AttentionKind, Params


def attention_kinds() -> List[str]:
    """Names of the registered attention kinds.

    Returns
    -------
    list of str
        The names :func:`get_attention` takes, in registration order.

    Examples
    --------
    >>> import flexformer as ff
    >>> {"flex_s", "flex_n", "softmax", "linformer"} <= set(ff.attention_kinds())
    True
    """
    return sorted(_KINDS)


def get_attention(name: str) -> AttentionKind:
    """The kind called ``name``; ValueError listing the choices for an unknown name.

    Parameters
    ----------
    name : str
        One of :func:`attention_kinds`.

    Returns
    -------
    AttentionKind
        The kind's parameters, capabilities and its ``init`` / ``forward`` / ``backward``.

    Raises
    ------
    ValueError
        ``name`` is not a registered kind (the message lists them).

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> kind = ff.get_attention("flex_n")
    >>> kind.params, kind.learnable
    (('omega1', 'omega2', 'tau'), ('omega1', 'omega2', 'tau'))
    >>> params = kind.init(2, 8, num_features=16, rng=0)
    >>> q = np.random.default_rng(0).standard_normal((1, 2, 10, 8))
    >>> dq, dk, dv, dparams = kind.backward(np.ones_like(q), q, q, q, params, causal=True)
    >>> sorted(dparams)
    ['omega1', 'omega2', 'tau']
    """
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention kind {name!r}; choose one of: {', '.join(attention_kinds())}") from None


def attention(kind: str, q, k, v, params: Optional[Params] = None, *, causal: bool = False, key_mask=None,
              eps: Optional[float] = None, return_guard_count: bool = False, return_key_state: bool = False,
              return_projections: bool = False):
    """Attention of any registered kind: the one call every kind answers the same way, with
    every option of the named functions (:func:`flexformer.flex_n_attention` and the like).

    Parameters
    ----------
    kind : str
        One of :func:`attention_kinds`.
    q, k, v : ndarray
        (B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, e), float32 or float64.
    params : dict of str to ndarray, optional
        The kind's parameters, as ``get_attention(kind).init(...)`` makes them; None (or
        ``{}``) for the kinds without parameters (softmax, taylor, elu).
    causal : bool, optional
        Row i sees keys j <= i (not for Linformer).
    key_mask : ndarray (B, Nk) of bool, optional
        True = attend.
    eps : float, optional
        The linear kinds' denominator guard (default :data:`flexformer.DEFAULT_EPS`).
    return_guard_count : bool, optional
        The linear kinds: also the rows per (batch, head) that hit the guard, (B, H).
    return_key_state : bool, optional
        The linear kinds, bidirectional: also the keys' state, for :func:`attention_backward`'s
        ``key_state``.
    return_projections : bool, optional
        The kinds that keep projections (``get_attention(kind).projections``: flex_s,
        flex_n), bidirectional: also the projections, for ``projections``.

    Returns
    -------
    ndarray (B, H, Nq, e)
        Then, each when asked for and in this order: the guard count, the key state and
        the projections.

    Raises
    ------
    ValueError
        An unknown kind, ``params`` without the kind's names, or an option the kind does
        not have (the message says which).

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> q = k = v = np.random.default_rng(0).standard_normal((1, 2, 6, 4))
    >>> params = ff.get_attention("flex_n").init(2, 4, rng=0)
    >>> out = ff.attention("flex_n", q, k, v, params, causal=True)
    >>> bool(np.array_equal(out, ff.flex_n_attention(q, k, v, *params.values(), causal=True)))
    True
    >>> ff.attention("taylor", q, k, v).shape
    (1, 2, 6, 4)
    >>> out, guard = ff.attention("rebased", q, k, v, ff.get_attention("rebased").init(2, 4), return_guard_count=True)
    >>> guard.shape
    (1, 2)
    """
    return get_attention(kind).forward(q, k, v, {} if params is None else params, causal=causal,
                                       key_mask=key_mask, eps=eps, return_guard_count=return_guard_count,
                                       return_key_state=return_key_state, return_projections=return_projections)


def attention_backward(kind: str, dout, q, k, v, params: Optional[Params] = None, *, causal: bool = False,
                       key_mask=None, eps: Optional[float] = None, key_state=None,
                       projections=None) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Params]:
    """Gradients of :func:`attention`: ``(dq, dk, dv, dparams)``, dparams keyed by the
    kind's learnable parameter names (``get_attention(kind).learnable``).

    Parameters
    ----------
    kind, q, k, v, params, causal, key_mask, eps
        As for :func:`attention`.
    dout : ndarray (B, H, Nq, e)
        The gradient of the loss with respect to the output.
    key_state, projections : ndarray, optional
        What :func:`attention` returned with ``return_key_state`` / ``return_projections``
        for the same inputs: the backward skips recomputing them (same bits).

    Returns
    -------
    tuple
        dq, dk, dv like q, k, v, and a dict of the learnable parameters' gradients.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> q = k = v = np.random.default_rng(0).standard_normal((1, 2, 6, 4))
    >>> params = ff.get_attention("hedgehog").init(2, 4, rng=0)
    >>> dq, dk, dv, dparams = ff.attention_backward("hedgehog", np.ones_like(v), q, k, v, params)
    >>> sorted(dparams), dparams["W"].shape
    (['W'], (2, 4, 4))
    """
    return get_attention(kind).backward(dout, q, k, v, {} if params is None else params, causal=causal,
                                        key_mask=key_mask, eps=eps, key_state=key_state, projections=projections)


# ------------------------------------------------------------- feature maps by kind name

#: the user's own features (recurrent decoding and the generic core): not an attention kind
USER_FEATURES = "linear"


def _with_features(kind: str) -> AttentionKind:
    spec = _KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None or spec.feature_map is None:
        choices = sorted([k for k, s in _KINDS.items() if s.feature_map is not None] + [USER_FEATURES])
        raise ValueError(f"kind must be one of {', '.join(choices)} (the kinds with a feature map), got {kind!r}")
    return spec


def require_params(kind: str, params) -> None:
    """ValueError naming what is missing unless ``params`` has every name ``kind`` needs."""
    names = () if kind == USER_FEATURES else get_attention(kind).params
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params for {kind} need {', '.join(names)}; missing {', '.join(missing)}")


def check_param_shapes(kind: str, params: Params, H: int, d: int) -> None:
    """ValueError naming the parameter whose shape does not fit the kind's layout for H
    heads of size d (the feature-map kinds; m, any size >= 1; ``"linear"`` has none)."""
    if kind == USER_FEATURES:
        return
    spec = get_attention(kind)
    for name, layout in zip(spec.params, spec.layouts):
        x = params[name]
        axes = layout.strip("()").rstrip(",").split(", ")
        fits = x.ndim == len(axes) and all(
            n == {"H": H, "d": d}.get(a, n) and n >= 1 for a, n in zip(axes, x.shape))
        if not fits:
            raise ValueError(f"{name} must have shape {layout} with H = {H}, d = {d}; got {x.shape}")


def features(kind: str, x: np.ndarray, params: Params) -> Tuple[np.ndarray, np.ndarray]:
    """(f, s) of ``kind``'s feature map for x (B, H, T, d): phi(x) = exp(s) f (NumPy twin of
    the C map); ``"linear"``: x itself, normalised."""
    if kind == USER_FEATURES:
        return normalised(x)
    return _with_features(kind).feature_map(x, params)


def num_features(kind: str, params: Params, d: int) -> int:
    """F, the length of f for this kind and parameters."""
    return d if kind == USER_FEATURES else _with_features(kind).feature_size(params, d)


def feature_backward(kind: str, x: np.ndarray, params: Params, df: np.ndarray, ds: np.ndarray) -> Params:
    """Gradients of the kind's learnable parameters given df (B,H,T,F) and ds (B,H,T), the
    gradients with respect to f and s at x (empty for kinds without learnable ones)."""
    if kind == USER_FEATURES:
        return {}
    spec = _with_features(kind)
    return {} if spec.feature_grad is None else spec.feature_grad(x, params, df, ds)
