"""Flexformer attention: the public NumPy-in / NumPy-out functions over the C kernels.

Shapes (per call): ``q`` (B, H, Nq, d), ``k`` (B, H, Nk, d), ``v`` (B, H, Nk, e),
``out`` (B, H, Nq, e); ``omega``, ``omega1``, ``omega2`` (H, m, d); ``tau`` (H,);
``key_mask`` (B, Nk) bool with True = attend. All float arrays share one dtype,
float32 or float64, and the results come back in it. Inputs are never modified;
non-contiguous inputs are copied. Argument checks happen in the C glue, which raises
``TypeError`` (dtype) or ``ValueError`` (shape, value) naming the argument.

Numerics shared by both variants (details in ``csrc/linattn_core.inc``):

* phi(x) = exp(s(x)) f(x). The query factor exp(s(q)) cancels in the ratio and is
  never formed; the key factor is shifted by the running maximum of s over the keys a
  row can see (all keys when bidirectional, keys j <= i when causal), so inputs with
  |x|^2 / (2 sqrt d) in the hundreds stay finite in float32, and a late key never
  changes an earlier causal row.
* Denominator guard: the feature vectors satisfy |f(x)| <= 1, so the denominator
  den_i = sum_j w_ij f(q_i).f(k_j) never exceeds R_i = sum_j w_ij in magnitude. Where
  den_i < eps * R_i (random trig features can make it tiny or negative) the row is
  divided by eps * R_i instead. The backward differentiates exactly this guarded
  function. ``return_guard_count=True`` reports how many rows hit the guard.
* A query row that sees no unmasked key gets zeros, with zero gradient.
* Key state (bidirectional): every output row reads the same sums over the keys,
  [S (F, e), z (F), R, M] per (batch, head). ``return_key_state=True`` returns them
  packed, (B, H, F e + F + 2), and the backward takes them as ``key_state=`` instead of
  recomputing them, the way autograd frameworks keep activations (F = 2m for flex_s,
  flex_n and hedgehog, m for performer, the feature size for linear_attention). The
  gradients are the same bit for bit.
* Kept projections (flex_s and flex_n, bidirectional): ``return_projections=True`` also
  returns the queries' and keys' projections onto the frequencies, (B, H, Nq + Nk, R)
  with R = m (flex_s) or 2m (flex_n), and the backward takes them as ``projections=``
  instead of computing them again: two of flex_n's ten backward products (4-7% of
  forward + backward at N = 4096, d = m = 64, on a Zen 4, for (Nq + Nk) R more floats
  kept per (batch, head)). The gradients are the same bit for bit, except after a forward of at
  most 8 query and 8 key rows, which projects with row dots in another summing order
  (equal to float rounding).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from .runtime import _C
from ._checks import check_bool, check_overflow, check_real

DEFAULT_EPS = 1e-4

ArrayOrPair = Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]


def _check_flags(causal: bool, eps: float) -> None:
    check_bool("causal", causal)
    check_real("eps", eps)


_OVERFLOW_HINT = ("the feature maps are exp(|x|^2 / exp(tau)) or exp(w.x) in the dtype: large |q|, |k| "
                  "or frequencies, or a tau far below 0, overflow it")


def _check_keeps_projections(kernel, option: str) -> None:
    """Refuse ``option`` by name for a kernel that keeps no projections (the ones that do:
    ``_C.projection_kinds``, from csrc/kinds.h)."""
    kind = kernel.__name__.rsplit("_", 1)[0]
    if kind not in _C.projection_kinds:
        raise ValueError(f"{option}: {kind} keeps no projections (the kinds that do: "
                         f"{', '.join(_C.projection_kinds)})")


def _forward(kernel, *arrays, causal, key_mask, eps, return_guard_count, return_key_state,
             return_projections=False):
    """Run a forward kernel and shape the result: out, then the guard count, the key state
    and the kept projections when asked for."""
    _check_flags(causal, eps)
    want = check_bool("return_key_state", return_key_state)
    check_bool("return_guard_count", return_guard_count)
    keep = check_bool("return_projections", return_projections)
    extra = {}
    if keep:
        _check_keeps_projections(kernel, "return_projections")
        extra["return_projections"] = True
    *res, finite = kernel(*arrays, key_mask=key_mask, causal=bool(causal), eps=float(eps),
                          return_key_state=want, report_finite=True, **extra)
    if not finite:  # the kernel checked its output as it wrote it; this says why
        check_overflow(kernel.__name__.replace("_forward", "_attention"), res[0], arrays, _OVERFLOW_HINT)
    picked = (res[0],) + ((res[1],) if return_guard_count else ()) + tuple(res[2:])
    return picked[0] if len(picked) == 1 else picked


def _backward(kernel, *arrays, causal, key_mask, eps, key_state, projections=None):
    _check_flags(causal, eps)
    extra = {}
    if projections is not None:
        _check_keeps_projections(kernel, "projections")
        extra["projections"] = projections
    *res, finite = kernel(*arrays, key_mask=key_mask, causal=bool(causal), eps=float(eps), key_state=key_state,
                          report_finite=True, **extra)
    res = tuple(res)
    if not finite:
        check_overflow(kernel.__name__.replace("_backward", "_attention_backward"), res, arrays, _OVERFLOW_HINT)
    return res


def flex_s_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
    return_projections: bool = False,
) -> ArrayOrPair:
    """Flexformer_s (stationary) linear attention.

    phi(x) = exp(|x|^2 / (2 sqrt d)) m^(-1/2) [cos(W x), sin(W x)] with learnable
    frequencies W = ``omega[h]`` (m, d) per head; output row i is
    sum_j k(q_i, k_j) v_j / sum_j k(q_i, k_j) with k(x, y) = phi(x).phi(y), over all
    unmasked keys (or keys j <= i when ``causal``), computed in O(N) time and memory.

    Parameters
    ----------
    q, k, v : ndarray
        Queries (B, H, Nq, d), keys (B, H, Nk, d), values (B, H, Nk, e); float32 or
        float64, all the same dtype.
    omega : ndarray
        Spectral frequencies (H, m, d), m >= 1, finite.
    causal : bool, optional
        Row i sees only keys j <= i. Needs Nq == Nk.
    key_mask : ndarray of bool, optional
        (B, Nk); False keys count in neither numerator nor denominator.
    eps : float, optional
        Denominator guard (module docstring); finite and > 0. Default 1e-4.
    return_guard_count : bool, optional
        Also return an int64 array (B, H) counting the rows that hit the guard.
    return_key_state : bool, optional
        Bidirectional only: also return the keys' state (B, H, F e + F + 2), the packed
        sums [S, z, R, M] the outputs were read from (F = 2m features here). Hand it
        to the backward as ``key_state=`` and it skips recomputing them (about an
        eighth of forward + backward at N = 4096).
    return_projections : bool, optional
        Bidirectional only: also return the queries' and keys' projections onto the
        frequencies, (B, H, Nq + Nk, m) (``q[b, h] @ omega[h].T`` then the same for k,
        masked keys as zeros). Hand them to the backward as ``projections=`` and it
        skips computing them again (module docstring).

    Returns
    -------
    out : ndarray
        (B, H, Nq, e) in the input dtype; ``(out, guard_count)`` when
        ``return_guard_count``, then ``key_state`` when ``return_key_state`` and
        ``projections`` last when ``return_projections``.

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
    >>> omega = ff.init.flex_s_omega(2, 32, 8, rng=0)
    >>> out = ff.flex_s_attention(q, k, v, omega, causal=True)
    >>> out.shape
    (1, 2, 16, 8)
    >>> bool(np.allclose(out, ff.reference.flex_s_attention(q, k, v, omega, causal=True)))
    True
    """
    return _forward(_C.flex_s_forward, q, k, v, omega, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state,
                    return_projections=return_projections)


def flex_s_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
    projections: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`flex_s_attention` (recomputes the forward pass, but for the keys' state and
    the projections when ``key_state`` and ``projections`` from the forward are given).

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, omega, causal, key_mask, eps
        As in :func:`flex_s_attention`.
    key_state : ndarray, optional
        What the forward returned with ``return_key_state=True`` for these same k, v,
        parameters and mask (bidirectional). Its shape is checked, its content is not:
        a state from other inputs gives wrong gradients.
    projections : ndarray, optional
        What the forward returned with ``return_projections=True`` for these same q, k,
        omega and mask (bidirectional); checked and trusted like ``key_state``.

    Returns
    -------
    dq, dk, dv, domega : ndarray
        Same shapes and dtype as q, k, v and omega. Masked keys get zero gradient.

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
    >>> omega = ff.init.flex_s_omega(2, 32, 8, rng=0)
    >>> dout = np.ones((1, 2, 16, 8))
    >>> dq, dk, dv, domega = ff.flex_s_attention_backward(dout, q, k, v, omega)
    >>> domega.shape == omega.shape
    True
    """
    return _backward(_C.flex_s_backward, dout, q, k, v, omega, causal=causal, key_mask=key_mask, eps=eps,
                     key_state=key_state, projections=projections)


def flex_n_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega1: np.ndarray,
    omega2: np.ndarray,
    tau: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
    return_projections: bool = False,
) -> ArrayOrPair:
    """Flexformer_n (nonstationary, Yaglom) linear attention.

    phi(x) = exp(|x|^2 / exp(tau)) (4m)^(-1/2)
    [cos(A x) + cos(B x), sin(A x) + sin(B x)] with learnable frequency pairs
    A = ``omega1[h]``, B = ``omega2[h]`` (m, d) and scale ``tau[h]`` per head.
    With A = B and tau = log(2 sqrt d) it equals :func:`flex_s_attention`.

    Parameters
    ----------
    q, k, v : ndarray
        Queries (B, H, Nq, d), keys (B, H, Nk, d), values (B, H, Nk, e).
    omega1, omega2 : ndarray
        Frequency pairs (H, m, d), finite.
    tau : ndarray
        (H,), finite: log of the norm-factor scale.
    causal, key_mask, eps, return_guard_count, return_key_state
        As in :func:`flex_s_attention`.
    return_projections : bool, optional
        As in :func:`flex_s_attention`; here (B, H, Nq + Nk, 2m), each row
        ``[A x, B x]``.

    Returns
    -------
    out : ndarray
        (B, H, Nq, e); ``(out, guard_count)`` when ``return_guard_count``, then the key
        state and the projections as in :func:`flex_s_attention`.

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
    >>> omega1, omega2, tau = ff.init.flex_n_params(2, 32, 8, rng=0)
    >>> out = ff.flex_n_attention(q, k, v, omega1, omega2, tau, causal=True)
    >>> bool(np.allclose(out, ff.reference.flex_n_attention(q, k, v, omega1, omega2, tau, causal=True)))
    True

    One number for ``tau`` is every head's:

    >>> ff.flex_n_attention(q, k, v, omega1, omega2, 1.5).shape
    (1, 2, 16, 8)
    """
    return _forward(_C.flex_n_forward, q, k, v, omega1, omega2, tau, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state,
                    return_projections=return_projections)


def flex_n_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega1: np.ndarray,
    omega2: np.ndarray,
    tau: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
    projections: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`flex_n_attention` (recomputes the forward pass, but for the keys' state and
    the projections when ``key_state`` and ``projections`` from the forward are given; as in
    :func:`flex_s_attention_backward`).

    Returns
    -------
    dq, dk, dv, domega1, domega2, dtau : ndarray
        Same shapes and dtype as q, k, v, omega1, omega2 and tau.

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, omega1, omega2, tau, causal, key_mask, eps
        As in :func:`flex_n_attention`.
    key_state, projections : ndarray, optional
        What :func:`flex_n_attention` returned with ``return_key_state`` and
        ``return_projections`` for the same inputs (bidirectional only).

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
    >>> omega1, omega2, tau = ff.init.flex_n_params(2, 32, 8, rng=0)
    >>> grads = ff.flex_n_attention_backward(np.ones((1, 2, 16, 8)), q, k, v, omega1, omega2, tau)
    >>> [g.shape for g in grads[3:]]
    [(2, 32, 8), (2, 32, 8), (2,)]
    """
    return _backward(_C.flex_n_backward, dout, q, k, v, omega1, omega2, tau, causal=causal, key_mask=key_mask,
                     eps=eps, key_state=key_state, projections=projections)


def performer_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
) -> ArrayOrPair:
    """Performer FAVOR+ attention (Choromanski et al., 2021) with positive random features.

    phi(x) = exp(w_i.x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4), with fixed
    frequencies ``omega`` (H, m, d) drawn from N(0, I) (see
    :func:`flexformer.init.performer_omega`); phi(q).phi(k) estimates
    exp(q.k / sqrt d). Same stabilisation, guard and conventions as
    :func:`flex_s_attention`. The frequencies are not learned: the backward returns
    no gradient for them.

    Parameters
    ----------
    q, k, v : ndarray
        Queries (B, H, Nq, d), keys (B, H, Nk, d), values (B, H, Nk, e).
    omega : ndarray
        Fixed random frequencies (H, m, d) (:func:`flexformer.init.performer_omega`).
    causal, key_mask, eps, return_guard_count, return_key_state
        As in :func:`flex_s_attention`.

    Returns
    -------
    out : ndarray
        (B, H, Nq, e); with the guard count and key state after it when asked for.

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
    >>> omega = ff.init.performer_omega(2, 32, 8, rng=0)
    >>> out = ff.performer_attention(q, k, v, omega)
    >>> bool(np.allclose(out, ff.reference.performer_attention(q, k, v, omega)))
    True
    """
    return _forward(_C.performer_forward, q, k, v, omega, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state)


def performer_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of :func:`performer_attention` (omega is fixed).

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, omega, causal, key_mask, eps, key_state
        As in :func:`performer_attention`.

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
    >>> omega = ff.init.performer_omega(2, 32, 8, rng=0)
    >>> dq, dk, dv = ff.performer_attention_backward(np.ones((1, 2, 16, 8)), q, k, v, omega)
    >>> dq.shape
    (1, 2, 16, 8)
    """
    return _backward(_C.performer_backward, dout, q, k, v, omega, causal=causal, key_mask=key_mask, eps=eps,
                     key_state=key_state)


def hedgehog_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    W: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
) -> ArrayOrPair:
    """Hedgehog attention (Zhang et al., 2024): a learnable positive feature map.

    phi(x) = softmax([x W, -x W]) over its 2m entries, with W = ``W[h]`` of shape
    (d, m) per head, so ``W`` is (H, d, m) (see :func:`flexformer.init.hedgehog_weights`).
    Same conventions as :func:`flex_s_attention`.

    Parameters
    ----------
    q, k, v : ndarray
        Queries (B, H, Nq, d), keys (B, H, Nk, d), values (B, H, Nk, e).
    W : ndarray
        The feature map's weights (H, d, m) (:func:`flexformer.init.hedgehog_weights`).
    causal, key_mask, eps, return_guard_count, return_key_state
        As in :func:`flex_s_attention`.

    Returns
    -------
    out : ndarray
        (B, H, Nq, e); with the guard count and key state after it when asked for.

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
    >>> W = ff.init.hedgehog_weights(2, 8, 16, rng=0)
    >>> out = ff.hedgehog_attention(q, k, v, W, causal=True)
    >>> bool(np.allclose(out, ff.reference.hedgehog_attention(q, k, v, W, causal=True)))
    True
    """
    return _forward(_C.hedgehog_forward, q, k, v, W, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state)


def hedgehog_attention_backward(
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    W: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv, dW)`` of :func:`hedgehog_attention`.

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    q, k, v, W, causal, key_mask, eps, key_state
        As in :func:`hedgehog_attention`.

    Returns
    -------
    dq, dk, dv, dW : ndarray
        Same shapes and dtype as q, k, v and W.

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
    >>> W = ff.init.hedgehog_weights(2, 8, 16, rng=0)
    >>> dq, dk, dv, dW = ff.hedgehog_attention_backward(np.ones((1, 2, 16, 8)), q, k, v, W)
    >>> dW.shape
    (2, 8, 16)
    """
    return _backward(_C.hedgehog_backward, dout, q, k, v, W, causal=causal, key_mask=key_mask, eps=eps,
                     key_state=key_state)


def linear_attention(
    phi_q: np.ndarray,
    phi_k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
) -> ArrayOrPair:
    """Normalised linear attention on features you computed yourself.

    out_i = sum_j (phi_q_i . phi_k_j) v_j / sum_j (phi_q_i . phi_k_j) over unmasked keys
    (j <= i when ``causal``), in O(N F e), for any feature map (elu + 1, ReLU, ...).

    Parameters
    ----------
    phi_q, phi_k : ndarray
        Query features (B, H, Nq, F) and key features (B, H, Nk, F); non-negative
        features give a proper weighted average, any finite features are accepted.
    v : ndarray
        Values (B, H, Nk, e).
    causal, key_mask, eps, return_guard_count, return_key_state
        As in :func:`flex_s_attention`. Internally each row is split into its norm
        and direction (phi = |phi| f, |f| = 1), which keeps large features from
        overflowing; the guard compares the denominator of row i with
        eps * |phi_q_i| * sum_j |phi_k_j| (its Cauchy-Schwarz bound). A query row with
        phi_q_i = 0 returns zeros; a key row with phi_k_j = 0 adds nothing and gets zero
        gradient.

    Returns
    -------
    out : ndarray
        (B, H, Nq, e); ``(out, guard_count)`` when ``return_guard_count``.

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
    >>> phi_q, phi_k = np.exp(q), np.exp(k)           # any non-negative features
    >>> out = ff.linear_attention(phi_q, phi_k, v, causal=True)
    >>> bool(np.allclose(out, ff.reference.linear_attention(phi_q, phi_k, v, causal=True)))
    True
    """
    return _forward(_C.linear_forward, phi_q, phi_k, v, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state)


def linear_attention_backward(
    dout: np.ndarray,
    phi_q: np.ndarray,
    phi_k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dphi_q, dphi_k, dv)`` of :func:`linear_attention`.

    Parameters
    ----------
    dout : ndarray
        Gradient of the loss with respect to the output, (B, H, Nq, e).
    phi_q, phi_k, v, causal, key_mask, eps, key_state
        As in :func:`linear_attention`.

    Returns
    -------
    dphi_q, dphi_k, dv : ndarray
        Same shapes and dtype as phi_q, phi_k and v.

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
    >>> dphi_q, dphi_k, dv = ff.linear_attention_backward(np.ones((1, 2, 16, 8)), np.exp(q), np.exp(k), v)
    >>> dphi_q.shape
    (1, 2, 16, 8)
    """
    return _backward(_C.linear_backward, dout, phi_q, phi_k, v, causal=causal, key_mask=key_mask, eps=eps,
                     key_state=key_state)


def kernel_attention(
    kernel: str,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *params: np.ndarray,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    return_guard_count: bool = False,
    return_key_state: bool = False,
    return_projections: bool = False,
) -> ArrayOrPair:
    """Linear attention through the C kernel pair named ``kernel`` (``csrc/kinds.h``), with
    its parameters in order: the path the registry's linear kinds run on. The functions
    above are this call with named parameters; arguments and results as in
    :func:`flex_s_attention` (``return_projections`` for the kernels in
    ``_C.projection_kinds``)."""
    return _forward(_kernel(kernel, "_forward"), q, k, v, *params, causal=causal, key_mask=key_mask, eps=eps,
                    return_guard_count=return_guard_count, return_key_state=return_key_state,
                    return_projections=return_projections)


def kernel_attention_backward(
    kernel: str,
    dout: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *params: np.ndarray,
    causal: bool = False,
    key_mask: Optional[np.ndarray] = None,
    eps: float = DEFAULT_EPS,
    key_state: Optional[np.ndarray] = None,
    projections: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, ...]:
    """Gradients of :func:`kernel_attention`: ``(dq, dk, dv)`` and then the gradients of the
    kernel's learnable parameters."""
    return _backward(_kernel(kernel, "_backward"), dout, q, k, v, *params, causal=causal, key_mask=key_mask,
                     eps=eps, key_state=key_state, projections=projections)


def _kernel(kernel: str, direction: str):
    fn = getattr(_C, f"{kernel}{direction}", None) if isinstance(kernel, str) else None
    if fn is None:
        raise ValueError(f"no C kernel called {kernel!r}")
    return fn
