"""Plain NumPy reference twins of the kernels, in quadratic form.

These build the explicit (Nq, Nk) kernel matrix from the literal feature maps
phi(x) = exp(s(x)) f(x) (no stabilisation), so they are independent of the C code's
linear form, chunking and scaling. They are meant for tests and for reading, at
small N and moderate norms (exp(s) must not overflow float64).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ._checks import check_layouts


def flex_s_phi(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """phi(x) = exp(|x|^2 / (2 sqrt d)) m^-1/2 [cos(W x), sin(W x)]: (B, H, N, 2m).

    Parameters
    ----------
    x : ndarray (B, H, N, d)
    omega : ndarray (H, m, d)

    Returns
    -------
    ndarray
        (B, H, N, 2m)

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 8, 4))
    >>> omega = ff.init.flex_s_omega(2, 16, 4, rng=0)
    >>> phi = ff.reference.flex_s_phi(x, omega)
    >>> phi.shape
    (1, 2, 8, 32)
    """
    x, omega = check_layouts(x=(x, "BHNd"), omega=(omega, "Hmd"))
    d, m = x.shape[-1], omega.shape[1]
    proj = np.einsum("bhnd,hmd->bhnm", x, omega)
    scale = np.exp((x * x).sum(-1, keepdims=True) / (2.0 * np.sqrt(d))) / np.sqrt(m)
    return scale * np.concatenate([np.cos(proj), np.sin(proj)], axis=-1)


def flex_n_phi(x: np.ndarray, omega1: np.ndarray, omega2: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """phi(x) = exp(|x|^2 / exp(tau)) (4m)^-1/2 [cos(Ax) + cos(Bx), sin(Ax) + sin(Bx)].

    Parameters
    ----------
    x : ndarray (B, H, N, d)
    omega1, omega2 : ndarray (H, m, d)
    tau : ndarray (H,)

    Returns
    -------
    ndarray
        (B, H, N, 2m)

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 8, 4))
    >>> o1, o2, tau = ff.init.flex_n_params(2, 16, 4, rng=0)
    >>> phi = ff.reference.flex_n_phi(x, o1, o2, tau)
    >>> phi.shape
    (1, 2, 8, 32)
    """
    x, omega1, omega2, tau = check_layouts(x=(x, "BHNd"), omega1=(omega1, "Hmd"), omega2=(omega2, "Hmd"), tau=(tau, "H"))
    m = omega1.shape[1]
    pa = np.einsum("bhnd,hmd->bhnm", x, omega1)
    pb = np.einsum("bhnd,hmd->bhnm", x, omega2)
    tau = tau[None, :, None, None]
    scale = np.exp((x * x).sum(-1, keepdims=True) / np.exp(tau)) / np.sqrt(4.0 * m)
    return scale * np.concatenate([np.cos(pa) + np.cos(pb), np.sin(pa) + np.sin(pb)], axis=-1)


def visible_pairs(shape, *, causal: bool = False, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Bool (B, H, Nq, Nk): which keys each query row attends to.

    Parameters
    ----------
    shape : tuple
        (B, H, Nq, Nk).
    causal : bool, optional
    key_mask : ndarray of bool (B, Nk), optional

    Returns
    -------
    ndarray of bool (B, H, Nq, Nk)

    Examples
    --------
    >>> from flexformer.reference import visible_pairs
    >>> visible_pairs((1, 1, 3, 3), causal=True)[0, 0].astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    Nq, Nk = shape[-2:]
    visible = np.ones(shape, dtype=bool)
    if key_mask is not None:
        visible &= np.asarray(key_mask, dtype=bool)[:, None, None, :]
    if causal:
        visible &= np.tril(np.ones((Nq, Nk), dtype=bool))
    return visible


def kernel_attention(
    phi_q: np.ndarray,
    phi_k: np.ndarray,
    v: np.ndarray,
    bound_q: np.ndarray,
    bound_k: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = 1e-4,
):
    """Normalised kernel attention from explicit features, with the documented guard.

    K = phi_q phi_k^T (B, H, Nq, Nk); den_i = sum_j K_ij over visible keys; the guard
    compares den_i with eps * sum_j bound_q_i bound_k_j, where bound = exp(s(x)) bounds
    |phi(x)| (|f| <= 1). Returns (out, guarded) with guarded a bool (B, H, Nq).

    Parameters
    ----------
    phi_q, phi_k : ndarray
        Features (B, H, Nq, F) and (B, H, Nk, F).
    v : ndarray (B, H, Nk, e)
    bound_q, bound_k : ndarray
        (B, H, Nq) and (B, H, Nk): bounds on the features' norms.
    causal, key_mask, eps
        As in :func:`flexformer.flex_s_attention`.

    Returns
    -------
    out : ndarray (B, H, Nq, e)
    guarded : ndarray of bool (B, H, Nq)

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> pq, pk, v = (np.abs(rng.standard_normal((1, 1, 5, 3))) for _ in range(3))
    >>> out, guarded = ff.reference.kernel_attention(pq, pk, v, np.linalg.norm(pq, axis=-1),
    ...                                              np.linalg.norm(pk, axis=-1))
    >>> bool(np.allclose(out, ff.linear_attention(pq, pk, v))), bool(guarded.any())
    (True, False)
    """
    phi_q, phi_k, v, bound_q, bound_k = check_layouts(phi_q=(phi_q, "BHIF"), phi_k=(phi_k, "BHJF"), v=(v, "BHJe"),
                                                 bound_q=(bound_q, "BHI"), bound_k=(bound_k, "BHJ"))
    K = np.einsum("bhif,bhjf->bhij", phi_q, phi_k)
    Rb = bound_q[..., :, None] * bound_k[..., None, :]
    visible = visible_pairs(K.shape, causal=causal, key_mask=key_mask)
    K = np.where(visible, K, 0.0)
    Rb = np.where(visible, Rb, 0.0)
    den = K.sum(-1)
    R = Rb.sum(-1)
    guarded = (den < eps * R) & (R > 0)
    g = np.where(guarded, eps * R, den)
    g = np.where(R > 0, g, 1.0)
    out = np.einsum("bhij,bhje->bhie", K, v) / g[..., None]
    return out, guarded


def _bound(x: np.ndarray, coef) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp((x * x).sum(-1) * coef)


def flex_s_attention(q, k, v, omega, *, causal=False, key_mask=None, eps=1e-4):
    """Quadratic-form twin of :func:`flexformer.flex_s_attention` (float64 result).

    Parameters
    ----------
    q, k, v, omega, causal, key_mask, eps
        As in :func:`flexformer.flex_s_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> omega = ff.init.flex_s_omega(2, 16, 4, rng=0)
    >>> bool(np.allclose(ff.reference.flex_s_attention(q, k, v, omega, causal=True), ff.flex_s_attention(q, k, v, omega, causal=True)))
    True
    """
    q, k, v, omega = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"), omega=(omega, "Hmd"))
    coef = 1.0 / (2.0 * np.sqrt(q.shape[-1]))
    out, _ = kernel_attention(
        flex_s_phi(q, omega), flex_s_phi(k, omega), v, _bound(q, coef), _bound(k, coef),
        causal=causal, key_mask=key_mask, eps=eps,
    )
    return out


def flex_n_attention(q, k, v, omega1, omega2, tau, *, causal=False, key_mask=None, eps=1e-4):
    """Quadratic-form twin of :func:`flexformer.flex_n_attention` (float64 result).

    Parameters
    ----------
    q, k, v, omega1, omega2, tau, causal, key_mask, eps
        As in :func:`flexformer.flex_n_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> o1, o2, tau = ff.init.flex_n_params(2, 16, 4, rng=0)
    >>> bool(np.allclose(ff.reference.flex_n_attention(q, k, v, o1, o2, tau, causal=True), ff.flex_n_attention(q, k, v, o1, o2, tau, causal=True)))
    True
    """
    q, k, v, omega1, omega2, tau = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"), omega1=(omega1, "Hmd"),
                                            omega2=(omega2, "Hmd"), tau=(tau, "H"))
    coef = np.exp(-tau)[None, :, None]
    out, _ = kernel_attention(
        flex_n_phi(q, omega1, omega2, tau), flex_n_phi(k, omega1, omega2, tau), v,
        _bound(q, coef), _bound(k, coef), causal=causal, key_mask=key_mask, eps=eps,
    )
    return out


def softmax_attention(q, k, v, *, causal=False, key_mask=None, scale=None):
    """Exact softmax attention softmax(q k^T * scale) v, scale = 1/sqrt(d) by default.

    Parameters
    ----------
    q, k, v, causal, key_mask, scale
        As in :func:`flexformer.softmax_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> bool(np.allclose(ff.reference.softmax_attention(q, k, v, causal=True), ff.softmax_attention(q, k, v, causal=True)))
    True
    """
    q, k, v = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = np.einsum("bhid,bhjd->bhij", q, k) * scale
    visible = visible_pairs(logits.shape, causal=causal, key_mask=key_mask)
    logits = np.where(visible, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    w = np.exp(logits - top)
    den = w.sum(-1, keepdims=True)
    return np.einsum("bhij,bhje->bhie", w, v) / np.where(den > 0, den, 1.0)


def performer_phi(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """FAVOR+ features exp(w.x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4): (B, H, N, m).

    Parameters
    ----------
    x : ndarray (B, H, N, d)
    omega : ndarray (H, m, d)

    Returns
    -------
    ndarray
        (B, H, N, m), positive

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 8, 4))
    >>> omega = ff.init.performer_omega(2, 16, 4, rng=0)
    >>> phi = ff.reference.performer_phi(x, omega)
    >>> phi.shape
    (1, 2, 8, 16)
    """
    x, omega = check_layouts(x=(x, "BHNd"), omega=(omega, "Hmd"))
    x = x * x.shape[-1] ** -0.25
    proj = np.einsum("bhnd,hmd->bhnm", x, omega)
    return np.exp(proj - 0.5 * (x * x).sum(-1, keepdims=True)) / np.sqrt(omega.shape[1])


def hedgehog_phi(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Hedgehog features softmax([x W, -x W]) over 2m entries: (B, H, N, 2m).

    Parameters
    ----------
    x : ndarray (B, H, N, d)
    W : ndarray (H, d, m)

    Returns
    -------
    ndarray
        (B, H, N, 2m), each row summing to one

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> x = 0.5 * np.random.default_rng(0).standard_normal((1, 2, 8, 4))
    >>> W = ff.init.hedgehog_weights(2, 4, rng=0)
    >>> phi = ff.reference.hedgehog_phi(x, W)
    >>> phi.shape
    (1, 2, 8, 8)
    """
    x, W = check_layouts(x=(x, "BHNd"), W=(W, "Hdm"))
    proj = np.einsum("bhnd,hdm->bhnm", x, W)
    z = np.concatenate([proj, -proj], axis=-1)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def linear_attention(phi_q, phi_k, v, *, causal=False, key_mask=None, eps=1e-4):
    """Quadratic-form twin of :func:`flexformer.linear_attention` (user features).

    Parameters
    ----------
    phi_q, phi_k, v, causal, key_mask, eps
        As in :func:`flexformer.linear_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> bool(np.allclose(ff.reference.linear_attention(np.exp(q), np.exp(k), v), ff.linear_attention(np.exp(q), np.exp(k), v)))
    True
    """
    phi_q, phi_k, v = check_layouts(phi_q=(phi_q, "BHIF"), phi_k=(phi_k, "BHJF"), v=(v, "BHJe"))
    out, _ = kernel_attention(phi_q, phi_k, v, np.linalg.norm(phi_q, axis=-1),
                              np.linalg.norm(phi_k, axis=-1), causal=causal, key_mask=key_mask, eps=eps)
    return out


def performer_attention(q, k, v, omega, *, causal=False, key_mask=None, eps=1e-4):
    """Quadratic-form twin of :func:`flexformer.performer_attention`.

    Parameters
    ----------
    q, k, v, omega, causal, key_mask, eps
        As in :func:`flexformer.performer_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> omega = ff.init.performer_omega(2, 16, 4, rng=0)
    >>> bool(np.allclose(ff.reference.performer_attention(q, k, v, omega, causal=True), ff.performer_attention(q, k, v, omega, causal=True)))
    True
    """
    q, k, v, omega = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"), omega=(omega, "Hmd"))
    x = q * q.shape[-1] ** -0.25
    y = k * k.shape[-1] ** -0.25
    # exp(-|x'|^2/2 + max_i w_i.x') bounds |phi(x)| (every entry is at most that / sqrt(m))
    bq = np.exp(-0.5 * (x * x).sum(-1) + np.einsum("bhnd,hmd->bhnm", x, omega).max(-1))
    bk = np.exp(-0.5 * (y * y).sum(-1) + np.einsum("bhnd,hmd->bhnm", y, omega).max(-1))
    out, _ = kernel_attention(performer_phi(q, omega), performer_phi(k, omega), v, bq, bk,
                              causal=causal, key_mask=key_mask, eps=eps)
    return out


def hedgehog_attention(q, k, v, W, *, causal=False, key_mask=None, eps=1e-4):
    """Quadratic-form twin of :func:`flexformer.hedgehog_attention` (|phi| <= 1).

    Parameters
    ----------
    q, k, v, W, causal, key_mask, eps
        As in :func:`flexformer.hedgehog_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> W = ff.init.hedgehog_weights(2, 4, rng=0)
    >>> bool(np.allclose(ff.reference.hedgehog_attention(q, k, v, W), ff.hedgehog_attention(q, k, v, W)))
    True
    """
    q, k, v, W = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"), W=(W, "Hdm"))
    ones_q = np.ones(q.shape[:-1])
    ones_k = np.ones(k.shape[:-1])
    out, _ = kernel_attention(hedgehog_phi(q, W), hedgehog_phi(k, W), v, ones_q, ones_k,
                              causal=causal, key_mask=key_mask, eps=eps)
    return out


def linformer_attention(q, k, v, E, F, *, key_mask=None, scale=None):
    """Twin of :func:`flexformer.linformer_attention`: project, then exact softmax.

    Parameters
    ----------
    q, k, v, E, F, key_mask, scale
        As in :func:`flexformer.linformer_attention`.

    Returns
    -------
    ndarray
        (B, H, Nq, e), float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> E = ff.init.linformer_projections(3, 8, rng=0)
    >>> bool(np.allclose(ff.reference.linformer_attention(q, k, v, E, E), ff.linformer_attention(q, k, v, E, E)))
    True
    """
    q, k, v = check_layouts(q=(q, "BHId"), k=(k, "BHJd"), v=(v, "BHJe"))
    Nk = k.shape[2]
    if key_mask is not None:
        keep = np.asarray(key_mask, dtype=bool)[:, None, :, None]
        k = np.where(keep, k, 0.0)
        v = np.where(keep, v, 0.0)
    E = np.asarray(E, dtype=np.float64)[..., :Nk]
    F = np.asarray(F, dtype=np.float64)[..., :Nk]
    spec = "pn,bhnx->bhpx" if E.ndim == 2 else "hpn,bhnx->bhpx"
    return softmax_attention(q, np.einsum(spec, E, k), np.einsum(spec, F, v),
                             scale=1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)

__all__ = ["flex_n_attention", "flex_n_phi", "flex_s_attention", "flex_s_phi", "hedgehog_attention", "hedgehog_phi", "kernel_attention", "linear_attention", "linformer_attention", "performer_attention", "performer_phi", "softmax_attention", "visible_pairs"]
