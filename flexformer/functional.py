"""The normalised linear-attention core from NumPy: :func:`linear_attention` on features you
computed, :func:`kernel_attention` through a C kernel pair by name, and what every linear
kind shares (the per-kind named functions, ``flexformer.flex_s_attention`` and its peers,
are generated from the registry in :mod:`flexformer.named`).

Shapes (per call): ``q`` (B, H, Nq, d), ``k`` (B, H, Nk, d), ``v`` (B, H, Nk, e),
``out`` (B, H, Nq, e); ``omega``, ``omega1``, ``omega2`` (H, m, d); ``tau`` (H,);
``key_mask`` (B, Nk) bool with True = attend. All float arrays share one dtype,
float32 or float64, and the results come back in it. Inputs are never modified;
non-contiguous inputs are copied. Argument checks happen in the C glue, which raises
``TypeError`` (dtype) or ``ValueError`` (shape, value) naming the argument.

Numerics shared by every linear kind (details in ``csrc/linattn_core.inc``):

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
  packed, (B, H, P) with P = F e + F + 2 zero-padded to a multiple of 16
  (``_C.packed_state_length(F, e)``), and the backward takes them as ``key_state=`` instead of
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
        As in :func:`flexformer.flex_s_attention`. Internally each row is split into its norm
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
    its parameters in order: the path the registry's linear kinds run on (the named
    functions of :mod:`flexformer.named` call the kernel pair the same way); arguments and
    results as in :func:`flexformer.flex_s_attention` (``return_projections`` for the
    kernels in ``_C.projection_kinds``)."""
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
