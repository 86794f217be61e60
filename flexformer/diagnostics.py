"""Kernel diagnostics: what a feature-map attention layer is doing, measured on the
queries and keys of its last forward call.

A random-feature kernel can look healthy in the loss curve's first steps while its
attention weights are noise. Three numbers per head make that visible:

* ``guard_fraction``: the share of query rows whose denominator fell on the guard
  (den_i < eps R_i; the C kernels count them). Many rows there means the kernel's
  estimate of sum_j k(q_i, k_j) is near zero or negative: noise.
* ``kernel_tv``: the total-variation distance, 0.5 sum_j |a_ij - p_ij|, between the
  layer's attention rows a_i and exact softmax rows p_i = softmax(c q_i.k_j) on a sample of
  rows, averaged. c is the softmax temperature the kernel estimates at its own
  initialisation: 2 / e^tau for flex_n (1 / sqrt d at tau = log(2 sqrt d)),
  mean |omega_row|^2 / d for flex_s and rfa (their frequencies' scale), 1 / sqrt d for the
  other kinds. 0 means the same rows; 1 means disjoint ones.
* the parameters: mean frequency-row norm, flex_n's tau and the pair's separation
  ||omega1 - omega2|| / ||omega1|| (0 when the pair is equal).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ._checks import check_bool, check_int, check_layouts, check_positive
from .functional import DEFAULT_EPS
from .registry import attention_kinds, check_param_shapes, features, get_attention, require_params

#: kinds whose rows the NumPy feature twins can rebuild (the registry's kinds with a feature map)
KERNEL_KINDS = tuple(k for k in attention_kinds() if get_attention(k).feature_map is not None)


def nominal_scale(kind: str, params: Dict[str, np.ndarray], head_dim: int) -> np.ndarray:
    """Per-head softmax temperature c (H,) that ``kind`` with ``params`` estimates at its start.

    Parameters
    ----------
    kind : str
    params : dict of ndarray
    head_dim : int

    Returns
    -------
    ndarray (H,)

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> from flexformer.diagnostics import nominal_scale
    >>> params = ff.get_attention("flex_n").init(2, 16, rng=0, symmetric=True)
    >>> bool(np.allclose(nominal_scale("flex_n", params, 16), 1 / 4))
    True
    """
    spec = get_attention(kind)
    head_dim = check_int("head_dim", head_dim)
    require_params(kind, params)
    if spec.nominal_scale is not None:
        return spec.nominal_scale(params, head_dim)
    H = next((np.shape(v)[0] for v in params.values()), None)
    return np.full(H if H is not None else 1, 1.0 / np.sqrt(head_dim))


def _check_rows(rows, n: int) -> np.ndarray:
    """The query positions: all n when None, else a 1-d integer array in 0..n-1."""
    if rows is None:
        return np.arange(n)
    r = np.asarray(rows)
    if r.ndim != 1 or (r.size and r.dtype.kind not in "iu"):
        raise ValueError(f"rows must be a 1-d array of integer query positions, got {r.dtype} {r.shape}")
    if r.size and (r.min() < 0 or r.max() >= n):
        raise ValueError(f"rows must lie in 0..{n - 1} (the query positions), got {r.min()}..{r.max()}")
    return r.astype(np.intp)


def _check_mask(key_mask, B: int, nk: int) -> Optional[np.ndarray]:
    """``key_mask`` as the attention functions take it: None or bool (B, Nk)."""
    if key_mask is None:
        return None
    m = np.asarray(key_mask)
    if m.dtype != np.bool_:
        raise TypeError(f"key_mask must have dtype bool, got {m.dtype}")
    if m.shape != (B, nk):
        raise ValueError(f"key_mask must have shape (B, Nk) = ({B}, {nk}) to match k, got {m.shape}")
    return m


def _visible(rows: np.ndarray, nk: int, causal: bool, key_mask: Optional[np.ndarray], lead) -> np.ndarray:
    """Which keys (B, H, len(rows), Nk) each query row at positions ``rows`` sees."""
    visible = np.ones(tuple(lead) + (len(rows), nk), bool)
    if causal:
        visible &= np.arange(nk)[None, :] <= rows[:, None]
    if key_mask is not None:
        visible &= np.asarray(key_mask, bool)[:, None, None, :]
    return visible


def _shifted_exp(z: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """exp(z - max z) over the visible keys of each row, 0 elsewhere (and on rows that see none)."""
    z = np.where(visible, z, -np.inf)
    top = z.max(-1, keepdims=True)
    return np.where(visible, np.exp(z - np.where(np.isfinite(top), top, 0.0)), 0.0)


def kernel_rows(kind: str, q: np.ndarray, k: np.ndarray, params: Dict[str, np.ndarray], *,
                causal: bool = False, key_mask: Optional[np.ndarray] = None, eps: float = DEFAULT_EPS,
                rows: Optional[np.ndarray] = None) -> np.ndarray:
    """The attention rows (B, H, Nq, Nk) of a feature-map kind, guard included, in float64;
    only the query rows at positions ``rows`` (all when None).

    a_ij = w_ij f(q_i).f(k_j) / max(den_i, eps R_i) with w_ij = exp(s(k_j) - max s) over the
    keys row i sees, as the C core computes them; rows that see no key are zero.

    Parameters
    ----------
    kind : str
        A feature-map kind (:data:`KERNEL_KINDS`).
    q, k : ndarray (B, H, N, d)
    params : dict of ndarray
    causal, key_mask, eps
        As in the attention functions.
    rows : ndarray of int, optional
        Query positions.

    Returns
    -------
    ndarray (B, H, len(rows), Nk), float64

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> from flexformer.diagnostics import kernel_rows
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 6, 4))
    >>> params = ff.get_attention("flex_s").init(2, 4, num_features=8, rng=0)
    >>> a = kernel_rows("flex_s", x, x, params, causal=True)
    >>> bool(np.allclose(a @ x, ff.flex_s_attention(x, x, x, params["omega"], causal=True)))
    True
    """
    if kind not in KERNEL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(KERNEL_KINDS)} (the kinds with a feature map), got {kind!r}")
    q64, k64 = check_layouts(q=(q, "BHId"), k=(k, "BHJd"))
    rows = _check_rows(rows, q64.shape[2])
    causal, eps = check_bool("causal", causal), check_positive("eps", eps)
    key_mask = _check_mask(key_mask, q64.shape[0], k64.shape[2])
    q64 = q64[:, :, rows]
    require_params(kind, params)
    p64 = {n: np.asarray(v, np.float64) for n, v in params.items()}
    check_param_shapes(kind, p64, q64.shape[1], q64.shape[3])
    fq, _ = features(kind, q64, p64)
    fk, sk = features(kind, k64, p64)
    visible = _visible(rows, k64.shape[2], causal, key_mask, q64.shape[:2])
    w = _shifted_exp(np.broadcast_to(sk[:, :, None, :], visible.shape), visible)
    kern = w * np.einsum("bhif,bhjf->bhij", fq, fk)
    den, R = kern.sum(-1, keepdims=True), w.sum(-1, keepdims=True)
    den = np.where(den < eps * R, eps * R, den)
    return np.where(R > 0, kern / np.where(R > 0, den, 1.0), 0.0)


def softmax_rows(q: np.ndarray, k: np.ndarray, scale, *, causal: bool = False,
                 key_mask: Optional[np.ndarray] = None, rows: Optional[np.ndarray] = None) -> np.ndarray:
    """Exact softmax rows (B, H, Nq, Nk) at per-head temperature ``scale`` (H,) or a scalar;
    only the query rows at positions ``rows`` (all when None).

    Parameters
    ----------
    q, k : ndarray (B, H, N, d)
    scale : float or ndarray (H,)
    causal, key_mask
        As in :func:`flexformer.softmax_attention`.
    rows : ndarray of int, optional

    Returns
    -------
    ndarray (B, H, len(rows), Nk)

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> from flexformer.diagnostics import softmax_rows
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 5, 4))
    >>> a = softmax_rows(x, x, 0.5, causal=True)
    >>> bool(np.allclose(a @ x, ff.softmax_attention(x, x, x, causal=True)))
    True
    """
    q, k = check_layouts(q=(q, "BHId"), k=(k, "BHJd"))
    rows, causal = _check_rows(rows, q.shape[2]), check_bool("causal", causal)
    key_mask = _check_mask(key_mask, q.shape[0], k.shape[2])
    scale = np.asarray(scale)
    if scale.dtype.kind not in "iuf" or scale.shape not in ((), (1,), (q.shape[1],)):
        raise ValueError(f"scale must be a number or one per head ({q.shape[1]},), got {scale.dtype} {scale.shape}")
    c = np.broadcast_to(scale.astype(np.float64), (q.shape[1],))[None, :, None, None]
    z = np.einsum("bhid,bhjd->bhij", q[:, :, rows], k) * c
    e = _shifted_exp(z, _visible(rows, k.shape[2], causal, key_mask, q.shape[:2]))
    tot = e.sum(-1, keepdims=True)
    return e / np.where(tot > 0, tot, 1.0)


def parameter_summary(kind: str, params: Dict[str, np.ndarray]) -> Dict[str, List[float]]:
    """The kind's per-head summary of its parameters (its registry entry's
    ``parameter_summary``): frequency-row norms, and flex_n's tau and pair separation;
    empty for the kinds without one.

    Parameters
    ----------
    kind : str
    params : dict of ndarray

    Returns
    -------
    dict of str to list of float

    Examples
    --------
    >>> import flexformer as ff
    >>> from flexformer.diagnostics import parameter_summary
    >>> summary = parameter_summary("flex_n", ff.get_attention("flex_n").init(2, 8, rng=0))
    >>> len(summary["tau"])
    2
    """
    summarise = get_attention(kind).parameter_summary
    if summarise is None:
        return {}
    require_params(kind, params)
    return summarise(params)


def sample_rows(n: int, count: int) -> np.ndarray:
    """``count`` evenly spaced row indices in 0..n-1 (all rows when n <= count).

    Parameters
    ----------
    n, count : int

    Returns
    -------
    ndarray of int

    Examples
    --------
    >>> from flexformer.diagnostics import sample_rows
    >>> sample_rows(10, 3)
    array([0, 4, 9])
    """
    n, count = check_int("n", n, 0), check_int("count", count, 0)
    if n <= count:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, count).round().astype(int))


def layer_diagnostics(kind: str, q: np.ndarray, k: np.ndarray, params: Dict[str, np.ndarray], *,
                      causal: bool = False, key_mask: Optional[np.ndarray] = None,
                      guard_count: Optional[np.ndarray] = None, rows: int = 32, batch: int = 1,
                      eps: float = DEFAULT_EPS) -> dict:
    """Diagnostics of one attention layer from its queries and keys (B, H, N, d).

    Parameters
    ----------
    kind : str
        The attention kind (any; the row error is computed for :data:`KERNEL_KINDS`).
    q, k : ndarray (B, H, N, d)
    params : dict of ndarray
    causal : bool
    key_mask : ndarray (B, N) of bool, optional
    guard_count : ndarray (B, H), optional
        The kernel's count of guarded rows for these inputs (``return_guard_count``).
    rows : int
        Query rows sampled (evenly spaced) for the error against softmax.
    batch : int
        Batch elements used for that error (the first ones).
    eps : float
        The layer's denominator guard.

    Returns
    -------
    dict with per-head lists: ``guard_fraction`` (when guard_count is given),
    ``kernel_tv`` and ``softmax_scale`` (kernel kinds) and :func:`parameter_summary`.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> from flexformer.diagnostics import layer_diagnostics
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 16, 4))
    >>> params = ff.get_attention("flex_n").init(2, 4, num_features=8, rng=0)
    >>> report = layer_diagnostics("flex_n", x, x, params, causal=True)
    >>> len(report["kernel_tv"])
    2
    """
    q, k = check_layouts(q=(q, "BHId"), k=(k, "BHJd"))
    rows, batch = check_int("rows", rows), check_int("batch", batch)
    B, H, N, d = q.shape
    out: dict = {}
    if guard_count is not None:
        out["guard_fraction"] = (np.asarray(guard_count, np.float64).sum(0) / max(B * N, 1)).tolist()
    if kind in KERNEL_KINDS and N > 0:
        nb = min(batch, B)
        idx = sample_rows(N, rows)
        mask = None if key_mask is None else np.asarray(key_mask, bool)[:nb]
        a = kernel_rows(kind, q[:nb], k[:nb], params, causal=causal, key_mask=mask, eps=eps, rows=idx)
        c = nominal_scale(kind, params, d)
        p = softmax_rows(q[:nb], k[:nb], c, causal=causal, key_mask=mask, rows=idx)
        if mask is not None:  # only rows that are real tokens
            keep = mask[:, idx]
            tv = (0.5 * np.abs(a - p).sum(-1) * keep[:, None, :]).sum((0, 2)) / np.maximum(keep.sum(), 1)
        else:
            tv = 0.5 * np.abs(a - p).sum(-1).mean((0, 2))
        out["kernel_tv"] = tv.tolist()
        out["softmax_scale"] = np.asarray(c, np.float64).tolist()
    out.update(parameter_summary(kind, params))
    return out

__all__ = ["KERNEL_KINDS", "kernel_rows", "layer_diagnostics", "nominal_scale", "parameter_summary", "sample_rows", "softmax_rows"]
