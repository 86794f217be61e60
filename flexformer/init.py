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
