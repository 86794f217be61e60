"""Initialisers for the Flexformer kernel parameters.

At these starting points both variants are the unbiased random-feature estimate of
the softmax kernel exp(q.k / sqrt d): frequencies are drawn from N(0, I / sqrt d),
Flexformer_n starts with A = B and tau = log(2 sqrt d), which makes it equal to
Flexformer_s. ``orthogonal=True`` draws orthogonal random features (rows orthogonal
within each block of d, each row's norm redrawn so every row keeps the Gaussian law;
Choromanski et al., 2021), which lowers the estimator's variance.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

RngLike = Union[None, int, np.random.Generator]


def as_generator(rng: RngLike) -> np.random.Generator:
    """A numpy Generator from None (fresh entropy), an int seed or a Generator."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be None, an int seed or a numpy Generator, got {type(rng).__name__}")


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    return dt


def gaussian_frequencies(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    dtype=np.float64,
) -> np.ndarray:
    """Frequencies (num_heads, num_features, head_dim) with rows ~ N(0, I / sqrt(head_dim)).

    Parameters
    ----------
    num_heads, num_features, head_dim : int
        H, m and d; each >= 1.
    rng : None, int or numpy.random.Generator, optional
        Seed or generator; the same seed gives the same frequencies.
    orthogonal : bool, optional
        Orthogonal random features instead of i.i.d. rows.
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (num_heads, num_features, head_dim)
    """
    _check_sizes(num_heads=num_heads, num_features=num_features, head_dim=head_dim)
    dt = _check_dtype(dtype)
    gen = as_generator(rng)
    H, m, d = int(num_heads), int(num_features), int(head_dim)
    if not orthogonal:
        w = gen.standard_normal((H, m, d))
    else:
        w = np.empty((H, m, d))
        for h in range(H):
            for start in range(0, m, d):
                rows = min(d, m - start)
                qmat, rmat = np.linalg.qr(gen.standard_normal((d, d)))
                qmat = qmat * np.sign(np.diag(rmat))  # a Haar-distributed rotation
                norms = np.linalg.norm(gen.standard_normal((rows, d)), axis=1)
                w[h, start:start + rows] = qmat.T[:rows] * norms[:, None]
    return (w * d ** -0.25).astype(dt)


def flex_s_omega(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    dtype=np.float64,
) -> np.ndarray:
    """Initial ``omega`` (H, m, d) for :func:`flexformer.flex_s_attention`."""
    return gaussian_frequencies(num_heads, num_features, head_dim, rng=rng, orthogonal=orthogonal, dtype=dtype)


def flex_n_params(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    dtype=np.float64,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Initial ``(omega1, omega2, tau)`` for :func:`flexformer.flex_n_attention`.

    omega1 = omega2 (independent copies) drawn as in :func:`gaussian_frequencies`, and
    tau = log(2 sqrt(head_dim)) for every head.
    """
    omega1 = gaussian_frequencies(num_heads, num_features, head_dim, rng=rng, orthogonal=orthogonal, dtype=dtype)
    tau = np.full(int(num_heads), np.log(2.0 * np.sqrt(head_dim)), dtype=omega1.dtype)
    return omega1, omega1.copy(), tau


def performer_omega(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = True,
    dtype=np.float64,
) -> np.ndarray:
    """Fixed FAVOR+ frequencies (H, m, d) with rows ~ N(0, I) (the features rescale x
    by d^(-1/4) themselves). Orthogonal by default, as in the Performer paper; call
    again with a new seed to redraw (see :func:`redraw`)."""
    w = gaussian_frequencies(num_heads, num_features, head_dim, rng=rng, orthogonal=orthogonal)
    return (w * head_dim ** 0.25).astype(_check_dtype(dtype))


def redraw(omega: np.ndarray, *, rng: RngLike = None, orthogonal: bool = True) -> np.ndarray:
    """New Performer frequencies of the same shape and dtype as ``omega`` (the periodic
    feature redraw of FAVOR+); ``omega`` itself is left unchanged."""
    omega = np.asarray(omega)
    if omega.ndim != 3:
        raise ValueError(f"omega must have shape (H, m, d), got {omega.shape}")
    return performer_omega(*omega.shape, rng=rng, orthogonal=orthogonal, dtype=omega.dtype)


def hedgehog_weights(
    num_heads: int,
    head_dim: int,
    num_features: Optional[int] = None,
    *,
    rng: RngLike = None,
    dtype=np.float64,
) -> np.ndarray:
    """Hedgehog feature-map weights W (H, d, m): the identity when m = d (the default),
    otherwise N(0, 1/d) entries."""
    m = head_dim if num_features is None else num_features
    _check_sizes(num_heads=num_heads, head_dim=head_dim, num_features=m)
    dt = _check_dtype(dtype)
    if m == head_dim:
        return np.broadcast_to(np.eye(head_dim), (num_heads, head_dim, m)).astype(dt)
    return (as_generator(rng).standard_normal((num_heads, head_dim, m)) / np.sqrt(head_dim)).astype(dt)


def linformer_projections(
    proj_len: int,
    max_len: int,
    num_heads: Optional[int] = None,
    *,
    rng: RngLike = None,
    dtype=np.float64,
) -> np.ndarray:
    """A Linformer projection (kp, Nmax), or (H, kp, Nmax) per head when ``num_heads`` is
    given, with N(0, 1/kp) entries. Draw E and F separately (or reuse one array for
    key-value sharing)."""
    _check_sizes(proj_len=proj_len, max_len=max_len)
    shape = (proj_len, max_len)
    if num_heads is not None:
        _check_sizes(num_heads=num_heads)
        shape = (num_heads,) + shape
    dt = _check_dtype(dtype)
    return (as_generator(rng).standard_normal(shape) / np.sqrt(proj_len)).astype(dt)
