"""The softmax family: exact softmax attention and Linformer, NumPy in / NumPy out.

Shapes as in :mod:`flexformer.functional`: q (B, H, Nq, d), k (B, H, Nk, d),
v (B, H, Nk, e), key_mask (B, Nk) bool (True = attend); float32 or float64.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .runtime import _C
from ._checks import check_bool, check_overflow, check_real


_SOFTMAX_HINT = "the logits q.k * scale overflow it: large |q|, |k| or scale"


def _check(causal: bool, scale: Optional[float]) -> None:
    check_bool("causal", causal)
    check_real("scale", scale, optional=True)


def softmax_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    scale: Optional[float] = None,
) -> np.ndarray:
    """Exact softmax attention softmax(q k^T * scale) v, in O(N^2) time and O(N) memory.

    Keys are processed in tiles with a running maximum and sum per query row (online
    softmax), so no (Nq, Nk) matrix is ever allocated.

    Parameters
    ----------
    q, k, v : ndarray
        (B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, e).
    causal : bool
        Row i attends to keys j <= i (needs Nq == Nk).
    key_mask : ndarray of bool, optional
        (B, Nk); False keys are left out. A row with no visible key returns zeros.
    scale : float, optional
        Logit scale, default 1 / sqrt(d).

    Returns
    -------
    ndarray (B, H, Nq, e)

    Raises
    ------
    TypeError
        An array has a dtype other than the call's (float32 or float64, set by the first
        array argument), or cannot be converted; the message names the argument.
    ValueError
        A shape does not fit the others, a parameter is not finite, ``causal=True`` with
        Nq != Nk, or ``eps`` is not a finite number > 0.
    FloatingPointError
        Finite inputs whose result overflows the dtype.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 16, 8)) for _ in range(3))
    >>> out = ff.softmax_attention(q, k, v, causal=True)
    >>> bool(np.allclose(out, ff.reference.softmax_attention(q, k, v, causal=True)))
    True
    """
    _check(causal, scale)
    out = _C.softmax_forward(q, k, v, key_mask=key_mask, causal=bool(causal),
                             scale=None if scale is None else float(scale))
    check_overflow("softmax_attention", out, (q, k, v), _SOFTMAX_HINT)
    return out


def softmax_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    scale: Optional[float] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of :func:`softmax_attention` (recomputes the forward).

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, causal, key_mask, scale
        As in :func:`softmax_attention`.

    Returns
    -------
    dq, dk, dv : ndarray
        Same shapes and dtype as q, k and v.

    Raises
    ------
    TypeError
        An array has a dtype other than the call's (float32 or float64, set by the first
        array argument), or cannot be converted; the message names the argument.
    ValueError
        A shape does not fit the others, a parameter is not finite, ``causal=True`` with
        Nq != Nk, or ``eps`` is not a finite number > 0.
    FloatingPointError
        Finite inputs whose result overflows the dtype.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 16, 8)) for _ in range(3))
    >>> dq, dk, dv = ff.softmax_attention_backward(np.ones((1, 2, 16, 8)), q, k, v)
    >>> bool(np.allclose(dv.sum(axis=2), 16.0))      # every row's weights sum to one
    True
    """
    _check(causal, scale)
    res = _C.softmax_backward(dout, q, k, v, key_mask=key_mask, causal=bool(causal),
                              scale=None if scale is None else float(scale))
    check_overflow("softmax_attention_backward", res, (dout, q, k, v), _SOFTMAX_HINT)
    return res


def linformer_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    E: np.ndarray,
    F: np.ndarray,
    *,
    key_mask: Optional[np.ndarray] = None,
    scale: Optional[float] = None,
    causal: bool = False,
) -> np.ndarray:
    """Linformer attention (Wang et al., 2020): softmax(q (E k)^T * scale) (F v).

    Parameters
    ----------
    q, k, v : ndarray
        (B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, e).
    E, F : ndarray
        Sequence projections, (kp, Nmax) shared by all heads or (H, kp, Nmax) per head,
        both the same layout, Nmax >= Nk; a shorter sequence uses the first Nk columns.
        Passing one array as both E and F (key-value sharing), or the same arrays in
        several layers (layerwise sharing), works: sum the returned gradients.
    key_mask : ndarray of bool, optional
        (B, Nk); masked keys and values are left out of the projected sums.
    scale : float, optional
        Logit scale, default 1 / sqrt(d).
    causal : bool
        Must be False: the projection mixes every position, so causal attention is not
        defined; True raises ValueError saying so.

    Returns
    -------
    ndarray (B, H, Nq, e)

    Raises
    ------
    TypeError
        An array has a dtype other than the call's (float32 or float64, set by the first
        array argument), or cannot be converted; the message names the argument.
    ValueError
        A shape does not fit the others, a parameter is not finite, ``causal=True`` with
        Nq != Nk, or ``eps`` is not a finite number > 0.
    FloatingPointError
        Finite inputs whose result overflows the dtype.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 16, 8)) for _ in range(3))
    >>> E = ff.init.linformer_projections(4, 16, rng=0)
    >>> F = ff.init.linformer_projections(4, 16, rng=1)
    >>> out = ff.linformer_attention(q, k, v, E, F)
    >>> bool(np.allclose(out, ff.reference.linformer_attention(q, k, v, E, F)))
    True
    """
    _check(causal, scale)
    out = _C.linformer_forward(q, k, v, E, F, key_mask=key_mask, causal=bool(causal),
                               scale=None if scale is None else float(scale))
    check_overflow("linformer_attention", out, (q, k, v, E, F), _SOFTMAX_HINT)
    return out


def linformer_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    E: np.ndarray,
    F: np.ndarray,
    *,
    key_mask: Optional[np.ndarray] = None,
    scale: Optional[float] = None,
    causal: bool = False,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv, dE, dF)`` of :func:`linformer_attention`; dE and dF have
    the shapes of E and F (columns at or beyond Nk, and of masked keys, are zero).

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, E, F, key_mask, scale
        As in :func:`linformer_attention`.

    Returns
    -------
    dq, dk, dv, dE, dF : ndarray
        Same shapes and dtype as q, k, v, E and F.

    Raises
    ------
    TypeError
        An array has a dtype other than the call's (float32 or float64, set by the first
        array argument), or cannot be converted; the message names the argument.
    ValueError
        A shape does not fit the others, a parameter is not finite, ``causal=True`` with
        Nq != Nk, or ``eps`` is not a finite number > 0.
    FloatingPointError
        Finite inputs whose result overflows the dtype.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 16, 8)) for _ in range(3))
    >>> E = ff.init.linformer_projections(4, 16, rng=0)
    >>> dq, dk, dv, dE, dF = ff.linformer_attention_backward(np.ones((1, 2, 16, 8)), q, k, v, E, E)
    >>> dE.shape
    (4, 16)
    """
    _check(causal, scale)
    res = _C.linformer_backward(dout, q, k, v, E, F, key_mask=key_mask, causal=bool(causal),
                                scale=None if scale is None else float(scale))
    check_overflow("linformer_attention_backward", res, (dout, q, k, v, E, F), _SOFTMAX_HINT)
    return res
