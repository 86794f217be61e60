"""Initialisers for the Flexformer kernel parameters.

Frequencies are drawn from N(0, s^2 I / sqrt d), where s is the *bandwidth scale*
(``scale``). With s = 1, Flexformer_s and a symmetric Flexformer_n (A = B,
tau = log(2 sqrt d)) are the unbiased random-feature estimate of the softmax kernel
exp(q.k / sqrt d). That estimate's relative noise grows like
exp(s^2 |q - k|^2 / (2 sqrt d)) / sqrt(m): at head size 16 with unit-variance queries and
keys, s = 1 leaves E[cos] near 0.02 against a per-feature spread near 0.7, so the
attention weights start as noise. A smaller s trades temperature for signal:

* Flexformer_s has no tau: its norm factor stays exp(|x|^2 / (2 sqrt d)), so it starts
  as exp(s^2 q.k / sqrt d) times a key weight exp((1 - s^2) |k|^2 / (2 sqrt d)) (the
  query factor cancels in the normalisation).
* Flexformer_n by default does the same (tau = log(2 sqrt d) whatever s is,
  :data:`DEFAULT_MATCH_TAU`). ``match_tau=True`` sets tau = log(2 sqrt d / s^2) instead,
  which keeps the estimate unbiased for the softmax kernel at a lower temperature,
  exp(s^2 q.k / sqrt d): attention rows start nearly flat, and on the text and image
  classification tasks Flexformer_n then learned far more slowly (docs/results.md);
  distillation, which fits one layer's rows, measured better with it.

Flexformer_n's pair starts apart by default: A = sqrt(1 - r^2) C + r Z1 and
B = sqrt(1 - r^2) C + r Z2 with C, Z1, Z2 independent draws and r the ``spread``.
Each of A and B keeps the law N(0, s^2 I / sqrt d); their rows have correlation
rho = 1 - r^2, and the expected kernel at step 0 is
(exp(s^2 q.k / sqrt d) + exp(rho s^2 q.k / sqrt d)) / 2 with matched tau: a mix of two
softmax kernels whose temperatures differ by the factor rho (with the default tau, the same
mix times Flexformer_s's key weight). With A = B (``symmetric=True``,
the exact old starting point) the loss is symmetric in A and B, which makes A = B a
fixed point of gradient descent: the pair would never separate.

The defaults (:data:`DEFAULT_SCALE`, :data:`DEFAULT_SPREAD`, :data:`DEFAULT_MATCH_TAU`) were chosen by the sweep
recorded in ``docs/results.md``. ``orthogonal=True`` draws orthogonal random features
(rows orthogonal within each block of d, each row's norm redrawn so every row keeps the
Gaussian law; Choromanski et al., 2021), which lowers the estimator's variance.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from ._checks import check_float_dtype, check_sizes

RngLike = Union[None, int, np.random.Generator]

#: default bandwidth scale s of the trig kinds' frequencies (1.0 = the unbiased estimate
#: of exp(q.k / sqrt d)); chosen by the sweep in docs/results.md
DEFAULT_SCALE = 0.3
#: default spread r between Flexformer_n's omega1 and omega2 (0 = equal)
DEFAULT_SPREAD = 0.6
#: Flexformer_n's default tau: False keeps tau = log(2 sqrt d) at any scale (the norm factor
#: of Flexformer_s); True matches it to the scale, tau = log(2 sqrt d / s^2)
DEFAULT_MATCH_TAU = False


def as_generator(rng: RngLike) -> np.random.Generator:
    """A numpy Generator from None (fresh entropy), an int seed or a Generator.

    Parameters
    ----------
    rng : None, int or numpy.random.Generator

    Returns
    -------
    numpy.random.Generator
        ``rng`` itself when it is a Generator.

    Raises
    ------
    TypeError
        ``rng`` is none of those.

    Examples
    --------
    >>> from flexformer.init import as_generator
    >>> float(as_generator(0).random()) == float(as_generator(0).random())
    True
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        if rng is not None and rng < 0:
            raise ValueError(f"rng must be a seed >= 0, got {rng}")
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be None, an int seed or a numpy Generator, got {type(rng).__name__}")


def check_scale(scale) -> float:
    """``scale`` as a float; ValueError unless it is a finite number > 0.

    Parameters
    ----------
    scale : real number

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``scale`` is not finite or not > 0.

    Examples
    --------
    >>> from flexformer.init import check_scale
    >>> check_scale(1)
    1.0
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale (the kernel's initial bandwidth) must be a finite number > 0, got {scale!r}")
    return float(scale)


def check_spread(spread) -> float:
    """``spread`` as a float; ValueError unless it lies in [0, 1].

    Parameters
    ----------
    spread : real number

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``spread`` is outside [0, 1].

    Examples
    --------
    >>> from flexformer.init import check_spread
    >>> check_spread(0.5)
    0.5
    """
    if isinstance(spread, bool) or not isinstance(spread, (int, float, np.integer, np.floating)) \
            or not np.isfinite(spread) or not 0 <= spread <= 1:
        raise ValueError(f"spread (between omega1 and omega2) must be a number in [0, 1], got {spread!r}")
    return float(spread)


def gaussian_frequencies(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    scale: float = 1.0,
    dtype=np.float64,
) -> np.ndarray:
    """Frequencies (num_heads, num_features, head_dim) with rows ~ N(0, scale^2 I / sqrt(head_dim)).

    Parameters
    ----------
    num_heads, num_features, head_dim : int
        H, m and d; each >= 1.
    rng : None, int or numpy.random.Generator, optional
        Seed or generator; the same seed gives the same frequencies.
    orthogonal : bool, optional
        Orthogonal random features instead of i.i.d. rows.
    scale : float, optional
        Bandwidth scale s > 0 (1 = the softmax kernel's own frequencies).
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (num_heads, num_features, head_dim)

    Raises
    ------
    ValueError
        A size is < 1 or ``scale`` is not a finite number > 0.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> W = ff.init.gaussian_frequencies(1, 4, 8, rng=0, orthogonal=True)
    >>> bool(np.allclose((W[0] / np.linalg.norm(W[0], axis=1, keepdims=True)) @
    ...                  (W[0] / np.linalg.norm(W[0], axis=1, keepdims=True)).T, np.eye(4)))
    True
    """
    check_sizes(num_heads=num_heads, num_features=num_features, head_dim=head_dim)
    dt = check_float_dtype(dtype)
    scale = check_scale(scale)
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
    return (w * (scale * d ** -0.25)).astype(dt)


def flex_s_omega(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    scale: float = DEFAULT_SCALE,
    dtype=np.float64,
) -> np.ndarray:
    """Initial ``omega`` (H, m, d) for :func:`flexformer.flex_s_attention`: rows
    ~ N(0, scale^2 I / sqrt d). ``scale=1.0`` is the unbiased estimate of
    exp(q.k / sqrt d); see the module notes for what a smaller scale starts from.

    Parameters
    ----------
    num_heads, num_features, head_dim : int
        H, m and d; each >= 1.
    rng : None, int or numpy.random.Generator, optional
        Seed or generator.
    orthogonal : bool, optional
        Orthogonal random features instead of i.i.d. rows.
    scale : float, optional
        Bandwidth scale s > 0 (default :data:`DEFAULT_SCALE`).
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (H, m, d)

    Raises
    ------
    ValueError
        A size is < 1 or ``scale`` is not a finite number > 0.

    Examples
    --------
    >>> import flexformer as ff
    >>> omega = ff.init.flex_s_omega(2, 64, 16, rng=0, scale=1.0)
    >>> omega.shape
    (2, 64, 16)
    """
    return gaussian_frequencies(num_heads, num_features, head_dim, rng=rng, orthogonal=orthogonal, scale=scale,
                                dtype=dtype)


def flex_n_params(
    num_heads: int,
    num_features: int,
    head_dim: int,
    *,
    rng: RngLike = None,
    orthogonal: bool = False,
    scale: float = DEFAULT_SCALE,
    spread: float = DEFAULT_SPREAD,
    match_tau: bool = DEFAULT_MATCH_TAU,
    symmetric: bool = False,
    dtype=np.float64,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Initial ``(omega1, omega2, tau)`` for :func:`flexformer.flex_n_attention`.

    Parameters
    ----------
    num_heads, num_features, head_dim : int
        H, m and d; each >= 1.
    rng : None, int or numpy.random.Generator, optional
    orthogonal : bool, optional
        Orthogonal random features for the shared centre and both offsets.
    scale : float, optional
        Bandwidth scale s > 0: each of omega1, omega2 has rows ~ N(0, s^2 I / sqrt d).
    spread : float, optional
        r in [0, 1]: omega1 = sqrt(1 - r^2) C + r Z1, omega2 = sqrt(1 - r^2) C + r Z2,
        so rows of the pair have correlation 1 - r^2 and
        ||omega1 - omega2|| / ||omega1|| is about sqrt(2) r. 0 gives omega1 = omega2.
    match_tau : bool, optional
        tau = log(2 sqrt d / s^2) (True: the symmetric kernel estimates
        exp(s^2 q.k / sqrt d)) or log(2 sqrt d) whatever s is (False, the default
        :data:`DEFAULT_MATCH_TAU`: the norm factor of Flexformer_s).
    symmetric : bool, optional
        The exact unbiased-softmax start of earlier versions: omega1 = omega2 drawn with
        s = 1 and tau = log(2 sqrt d); overrides ``scale``, ``spread`` and ``match_tau``.
        A = B is a fixed point of gradient descent, so the pair then never separates.
    dtype : float32 or float64, optional

    Returns
    -------
    omega1, omega2 : ndarray (H, m, d)
    tau : ndarray (H,)

    Raises
    ------
    ValueError
        A size is < 1, or ``scale`` or ``spread`` is out of range.
    TypeError
        ``dtype`` is not float32 or float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> omega1, omega2, tau = ff.init.flex_n_params(4, 16, 8, rng=0, dtype=np.float32)
    >>> omega1.shape, tau.shape, tau.dtype
    ((4, 16, 8), (4,), dtype('float32'))
    >>> bool(np.allclose(tau, np.log(2 * np.sqrt(8))))
    True
    """
    if symmetric:
        scale, spread, match_tau = 1.0, 0.0, True
    scale, spread = check_scale(scale), check_spread(spread)
    gen = as_generator(rng)
    centre = gaussian_frequencies(num_heads, num_features, head_dim, rng=gen, orthogonal=orthogonal, scale=scale)
    if spread == 0.0:
        omega1 = centre
        omega2 = centre.copy()
    else:
        keep = np.sqrt(1.0 - spread * spread)
        z1, z2 = (gaussian_frequencies(num_heads, num_features, head_dim, rng=gen, orthogonal=orthogonal,
                                       scale=scale) for _ in range(2))
        omega1, omega2 = keep * centre + spread * z1, keep * centre + spread * z2
    dt = check_float_dtype(dtype)
    tau_value = np.log(2.0 * np.sqrt(head_dim) / (scale * scale if match_tau else 1.0))
    tau = np.full(int(num_heads), tau_value, dtype=dt)
    return omega1.astype(dt), omega2.astype(dt), tau


def flex_n_expected_kernel(
    q: np.ndarray,
    k: np.ndarray,
    *,
    scale: float = DEFAULT_SCALE,
    spread: float = DEFAULT_SPREAD,
    match_tau: bool = DEFAULT_MATCH_TAU,
) -> np.ndarray:
    """The kernel a start of :func:`flex_n_params` estimates: its expectation over the draw.

    ``(exp(t) + exp(rho t)) / 2`` with ``t = s^2 q.k / sqrt d`` and ``rho = 1 - r^2``,
    times ``exp((1 - s^2) (|q|^2 + |k|^2) / (2 sqrt d))`` when tau is not matched (the query
    factor cancels in attention rows; the key factor weights keys by length).

    Parameters
    ----------
    q, k : ndarray (..., Nq, d) and (..., Nk, d)
    scale, spread, match_tau
        As for :func:`flex_n_params` (``symmetric=True`` is ``scale=1, spread=0,
        match_tau=True``).

    Returns
    -------
    ndarray (..., Nq, Nk), float64

    Raises
    ------
    ValueError
        ``scale`` or ``spread`` is out of range, or the shapes of q and k disagree.

    Examples
    --------
    The average of many random starts approaches the expected kernel:

    >>> import numpy as np, flexformer as ff
    >>> x = 0.3 * np.random.default_rng(0).standard_normal((1, 4, 8))
    >>> want = ff.init.flex_n_expected_kernel(x, x)
    >>> o1, o2, tau = ff.init.flex_n_params(1, 20000, 8, rng=1)
    >>> phi = ff.reference.flex_n_phi(x[None], o1, o2, tau)[0]
    >>> got = phi @ phi.transpose(0, 2, 1)
    >>> bool(np.allclose(got, want, rtol=0.05))
    True
    """
    scale, spread = check_scale(scale), check_spread(spread)
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if q.ndim < 2 or k.ndim < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be (..., N, d) arrays with the same d, got shapes {q.shape} and {k.shape}")
    root_d = np.sqrt(q.shape[-1])
    t = scale * scale * np.einsum("...id,...jd->...ij", q, k) / root_d
    kernel = 0.5 * (np.exp(t) + np.exp((1.0 - spread * spread) * t))
    if not match_tau:
        norms = (q * q).sum(-1)[..., :, None] + (k * k).sum(-1)[..., None, :]
        kernel = kernel * np.exp((1.0 - scale * scale) * norms / (2.0 * root_d))
    return kernel


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
    again with a new seed to redraw (see :func:`redraw`).

    Parameters
    ----------
    num_heads, num_features, head_dim : int
        H, m and d; each >= 1.
    rng : None, int or numpy.random.Generator, optional
    orthogonal : bool, optional
        Orthogonal blocks of rows (default True).
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (H, m, d)

    Raises
    ------
    ValueError
        A size is < 1.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.init.performer_omega(2, 32, 16, rng=0).shape
    (2, 32, 16)
    """
    w = gaussian_frequencies(num_heads, num_features, head_dim, rng=rng, orthogonal=orthogonal)
    return (w * head_dim ** 0.25).astype(check_float_dtype(dtype))


def redraw(omega: np.ndarray, *, rng: RngLike = None, orthogonal: bool = True) -> np.ndarray:
    """New Performer frequencies of the same shape and dtype as ``omega`` (the periodic
    feature redraw of FAVOR+); ``omega`` itself is left unchanged.

    Parameters
    ----------
    omega : ndarray (H, m, d)
        The frequencies to replace.
    rng : None, int or numpy.random.Generator, optional
    orthogonal : bool, optional

    Returns
    -------
    ndarray
        New frequencies, same shape and dtype.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> omega = ff.init.performer_omega(2, 32, 16, rng=0)
    >>> fresh = ff.init.redraw(omega, rng=1)
    >>> fresh.shape == omega.shape and not np.array_equal(fresh, omega)
    True
    """
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
    otherwise N(0, 1/d) entries.

    Parameters
    ----------
    num_heads, head_dim : int
        H and d.
    num_features : int, optional
        m (default d).
    rng : None, int or numpy.random.Generator, optional
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (H, d, m)

    Raises
    ------
    ValueError
        A size is < 1.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> W = ff.init.hedgehog_weights(2, 8)
    >>> bool((W == np.eye(8)).all())
    True
    """
    m = head_dim if num_features is None else num_features
    check_sizes(num_heads=num_heads, head_dim=head_dim, num_features=m)
    dt = check_float_dtype(dtype)
    if m == head_dim:
        # a C-ordered copy: astype of the broadcast view kept its strides, and the kernels
        # copied the non-contiguous W on every call (a third of a decoding step)
        return np.ascontiguousarray(np.broadcast_to(np.eye(head_dim, dtype=dt), (num_heads, head_dim, m)))
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
    key-value sharing).

    Parameters
    ----------
    proj_len : int
        kp, the projected length.
    max_len : int
        Nmax, the longest sequence the projection takes.
    num_heads : int, optional
        H for one projection per head.
    rng : None, int or numpy.random.Generator, optional
    dtype : float32 or float64, optional

    Returns
    -------
    ndarray of shape (kp, Nmax) or (H, kp, Nmax)

    Raises
    ------
    ValueError
        A size is < 1.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.init.linformer_projections(64, 1024, 8, rng=0).shape
    (8, 64, 1024)
    """
    check_sizes(proj_len=proj_len, max_len=max_len)
    shape = (proj_len, max_len)
    if num_heads is not None:
        check_sizes(num_heads=num_heads)
        shape = (num_heads,) + shape
    dt = check_float_dtype(dtype)
    return (as_generator(rng).standard_normal(shape) / np.sqrt(proj_len)).astype(dt)

__all__ = ["DEFAULT_SCALE", "DEFAULT_SPREAD", "DEFAULT_MATCH_TAU", "as_generator", "check_scale", "check_spread", "flex_n_expected_kernel", "flex_n_params", "flex_s_omega", "gaussian_frequencies", "hedgehog_weights", "linformer_projections", "performer_omega", "redraw"]
