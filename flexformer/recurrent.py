"""Recurrent (token-by-token) inference for causal attention.

Causal linear attention is a recurrent network: row i only needs the prefix sums over
keys j <= i, a fixed-size state per (batch, head). With phi(x) = exp(s(x)) f(x) as in
the C core (see :mod:`flexformer.functional`), the state kept here is, at the running
log-scale M = max_j s(k_j) over the keys seen so far,

* ``S`` (B, H, F, e): sum_j exp(s(k_j) - M) f(k_j) v_j^T,
* ``z`` (B, H, F):    sum_j exp(s(k_j) - M) f(k_j),
* ``R`` (B, H):       sum_j exp(s(k_j) - M)  (the bound the denominator guard uses),
* ``M`` (B, H):       the running log-scale (-inf before the first key).

A new key larger than all before it raises M and rescales the old sums by
exp(M_old - M_new) <= 1, so nothing overflows however the key norms grow; the output
of row i is (f(q_i)^T S) / max(f(q_i).z, eps R), exactly the parallel causal forward's
function, so stepping reproduces ``causal=True`` outputs to float rounding.

Softmax attention has no fixed-size state: its recurrent form keeps every key and
value (a key-value cache) and each new token costs O(t) at context length t.

Use::

    rec = RecurrentAttention("flex_n", params)       # params as from get_attention(...).init
    out, state = rec.prefill(q, k, v)                # the prompt, one parallel call
    y = rec.step(state, q1, k1, v1)                  # then one (or a few) tokens at a time
    branch = state.copy()                            # independent copy
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import numpy as np

from .runtime import _C
from . import functional as lin
from ._checks import check_float_dtype, check_int, check_overflow, check_positive, check_sizes, native
from .registry import USER_FEATURES, attention_kinds, check_param_shapes, get_attention, require_params
from .registry import features as _features
from .registry import num_features as _num_features

Params = Dict[str, np.ndarray]

#: the registry's kinds marked ``recurrent``, and "linear" (q and k are the features)
RECURRENT_KINDS = tuple(sorted([k for k in attention_kinds() if get_attention(k).recurrent] + [USER_FEATURES]))
_CHUNK = 64        # tokens per vectorised block when stepping several tokens at once
_PREFILL_BLOCK = 4096  # keys per block when building the state after a parallel prefill


_LINE = 64  # bytes


def _packed_zeros(B: int, H: int, F: int, e: int, dtype) -> np.ndarray:
    """Zeros (B, H, P) for a packed state (P = ``_C.packed_state_length(F, e)``), starting
    on a 64-byte line: a view into a slightly larger block, since NumPy's own arrays start
    16 bytes into one as often as not."""
    dtype, P = np.dtype(dtype), _C.packed_state_length(F, e)
    block = np.zeros(B * H * P + _LINE // dtype.itemsize, dtype)
    start = (-block.ctypes.data % _LINE) // dtype.itemsize
    return block[start:start + B * H * P].reshape(B, H, P)


class LinearAttentionState:
    """The fixed-size state of causal linear attention for (B, H) sequences.

    Held in one packed array, ``packed`` (B, H, P) = [S, z, R, M, zero padding] per (b, h),
    P = F*e + F + 2 rounded up to a multiple of 16 (``flexformer._C.packed_state_length``):
    the layout the C kernels continue from (``state=`` of a causal forward), starting on a
    64-byte line so that every (b, h)'s S does; the attributes below are views into it.

    Attributes
    ----------
    S : ndarray (B, H, F, e)
    z : ndarray (B, H, F)
    R, M : ndarray (B, H)
        Key-weight sum and running log-scale (module docstring).
    tokens : int
        Tokens consumed so far.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rec = ff.RecurrentAttention("flex_s", ff.get_attention("flex_s").init(2, 8, num_features=16, rng=0))
    >>> state = rec.empty_state(batch=1, heads=2, head_dim=8, value_dim=8, dtype=np.float64)
    >>> state.tokens, state.packed.shape          # F = 2m = 32 features: 32 * 8 + 32 + 2 = 290, padded
    (0, (1, 2, 304))
    """

    def __init__(self, S: np.ndarray, z: np.ndarray, R: np.ndarray, M: np.ndarray, tokens: int = 0):
        S = native(np.asarray(S))
        if S.dtype not in (np.float32, np.float64):
            raise TypeError(f"S must have dtype float32 or float64, got {S.dtype}")
        if S.ndim != 4:
            raise ValueError(f"S must be a 4-d array (B, H, F, e), got shape {S.shape}")
        tokens = check_int("tokens", tokens, 0)
        B, H, F, e = S.shape
        packed = _packed_zeros(B, H, F, e, S.dtype)
        self._bind(packed, F, e)
        self.S, self.z, self.R, self.M = S, z, R, M
        self.tokens = int(tokens)

    def _bind(self, packed: np.ndarray, F: int, e: int) -> None:
        B, H = packed.shape[:2]
        self._packed = packed
        self._S = packed[..., : F * e].reshape(B, H, F, e)  # splitting an axis: a view
        self._z = packed[..., F * e: F * e + F]
        self._R = packed[..., F * e + F]
        self._M = packed[..., F * e + F + 1]

    @classmethod
    def _from_packed(cls, packed: np.ndarray, F: int, e: int, tokens: int) -> "LinearAttentionState":
        state = cls.__new__(cls)
        state._bind(packed, F, e)
        state.tokens = int(tokens)
        return state

    @property
    def packed(self) -> np.ndarray:
        """The packed array (B, H, P), updated in place by every step; read-only as an
        attribute (S, z, R and M are views into it: assign through them)."""
        return self._packed

    def _setter(name: str, layout: str):
        def put(self, x) -> None:
            view, x = getattr(self, "_" + name), np.asarray(x)
            if x.shape != view.shape:
                raise ValueError(f"state arrays are inconsistent: {name} must be {layout} = {view.shape}, "
                                 f"got {x.shape}")
            view[...] = x
        return property(lambda self: getattr(self, "_" + name), put)

    S = _setter("S", "(B, H, F, e)")
    z = _setter("z", "(B, H, F)")
    R = _setter("R", "(B, H)")
    M = _setter("M", "(B, H)")
    del _setter

    @classmethod
    def empty(cls, batch: int, heads: int, features: int, value_dim: int,
              dtype=np.float32) -> "LinearAttentionState":
        """A state that has seen no tokens."""
        check_sizes(batch=batch, heads=heads, features=features, value_dim=value_dim)
        dtype = check_float_dtype(dtype, "dtype")
        state = cls._from_packed(_packed_zeros(batch, heads, features, value_dim, dtype), features, value_dim, 0)
        state._M[...] = -np.inf
        return state

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        """(B, H, F, e)."""
        return self._S.shape

    @property
    def dtype(self) -> np.dtype:
        return self.packed.dtype

    @property
    def nbytes(self) -> int:
        """Memory held by the state; independent of the number of tokens seen."""
        return self.packed.nbytes

    def copy(self) -> "LinearAttentionState":
        """An independent copy (advancing one leaves the other unchanged)."""
        B, H, F, e = self.shape
        packed = _packed_zeros(B, H, F, e, self.dtype)
        packed[...] = self.packed
        return LinearAttentionState._from_packed(packed, F, e, self.tokens)

    def __repr__(self) -> str:
        B, H, F, e = self.shape
        return f"LinearAttentionState(B={B}, H={H}, F={F}, e={e}, dtype={self.dtype}, tokens={self.tokens})"


class KVCacheState:
    """Softmax attention's recurrent state: every key and value so far (grows with t).

    Made by :meth:`RecurrentAttention.prefill` and :meth:`RecurrentAttention.empty_state`
    for ``"softmax"``; a user does not build one directly.

    Parameters
    ----------
    keys, values : ndarray
        Preallocated (B, H, capacity, d) and (B, H, capacity, e) buffers.
    keep : ndarray of bool
        (B, capacity): which cached positions are real (unmasked) keys.
    length : int, optional
        Positions already filled.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rec = ff.RecurrentAttention("softmax")
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 5, 8))
    >>> out, cache = rec.prefill(x, x, x)
    >>> cache.tokens
    5
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray, keep: np.ndarray, length: int = 0):
        self._k, self._v, self._keep = keys, values, keep  # (B,H,cap,d), (B,H,cap,e), (B,cap) bool
        self.tokens = int(length)

    @classmethod
    def empty(cls, batch: int, heads: int, head_dim: int, value_dim: int, dtype=np.float32,
              capacity: int = 64) -> "KVCacheState":
        check_sizes(batch=batch, heads=heads, head_dim=head_dim, value_dim=value_dim)
        dtype = check_float_dtype(dtype, "dtype")
        capacity = check_int("capacity", capacity, 0)
        return cls(np.zeros((batch, heads, capacity, head_dim), dtype),
                   np.zeros((batch, heads, capacity, value_dim), dtype), np.zeros((batch, capacity), bool))

    @property
    def keys(self) -> np.ndarray:
        """(B, H, t, d) view of the cached keys."""
        return self._k[:, :, : self.tokens]

    @property
    def values(self) -> np.ndarray:
        """(B, H, t, e) view of the cached values."""
        return self._v[:, :, : self.tokens]

    @property
    def dtype(self) -> np.dtype:
        return self._k.dtype

    @property
    def nbytes(self) -> int:
        """Memory of the cached keys and values (grows linearly with t)."""
        return self.keys.nbytes + self.values.nbytes

    @property
    def key_mask(self) -> np.ndarray:
        """(B, t) bool: which cached keys are attended to (False: masked when added)."""
        return self._keep[:, : self.tokens]

    def append(self, k: np.ndarray, v: np.ndarray, keep: np.ndarray) -> None:
        """Add T keys (B, H, T, d), values (B, H, T, e) of the cache's dtype and their mask
        ``keep`` (B, T) bool (False: a masked key, never attended to)."""
        B, H, _, d = self._k.shape
        e = self._v.shape[3]
        k, v, keep = native(np.asarray(k)), native(np.asarray(v)), np.asarray(keep)
        if k.dtype != self.dtype or v.dtype != self.dtype:
            raise TypeError(f"k and v must have the cache's dtype {self.dtype}, got {k.dtype} and {v.dtype}")
        if k.ndim != 4 or k.shape[:2] != (B, H) or k.shape[3] != d:
            raise ValueError(f"k must have shape (B, H, T, d) = ({B}, {H}, T, {d}), got {k.shape}")
        T = k.shape[2]
        if v.shape != (B, H, T, e):
            raise ValueError(f"v must have shape (B, H, T, e) = ({B}, {H}, {T}, {e}), got {v.shape}")
        if keep.dtype != np.bool_ or keep.shape != (B, T):
            raise ValueError(f"keep must be a bool array of shape (B, T) = ({B}, {T}), got {keep.dtype} {keep.shape}")
        need = self.tokens + T
        if need > self._k.shape[2]:  # grow geometrically: amortised O(1) per token
            cap = max(need, 2 * self._k.shape[2])
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = np.zeros(old.shape[:2] + (cap,) + old.shape[3:], old.dtype)
                new[:, :, : self.tokens] = old[:, :, : self.tokens]
                setattr(self, name, new)
            keep_new = np.zeros((self._keep.shape[0], cap), bool)
            keep_new[:, : self.tokens] = self._keep[:, : self.tokens]
            self._keep = keep_new
        # masked rows are stored as zeros (never read, as in the C kernels)
        self._k[:, :, self.tokens: need] = np.where(keep[:, None, :, None], k, 0)
        self._v[:, :, self.tokens: need] = np.where(keep[:, None, :, None], v, 0)
        self._keep[:, self.tokens: need] = keep
        self.tokens = need

    def copy(self) -> "KVCacheState":
        return KVCacheState(self._k.copy(), self._v.copy(), self._keep.copy(), self.tokens)

    def __repr__(self) -> str:
        B, H, _, d = self._k.shape
        return f"KVCacheState(B={B}, H={H}, d={d}, e={self._v.shape[-1]}, dtype={self.dtype}, tokens={self.tokens})"


State = Union[LinearAttentionState, KVCacheState]


def _shift_exp(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp(a - b) for b >= a, with exp(-inf - anything) = 0 (no NaN from -inf - -inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isneginf(a), 0, np.exp(a - b)).astype(a.dtype, copy=False)


def _absorb(state: LinearAttentionState, fk, sk, v) -> None:
    """Add keys with features fk (B,H,T,F), log-scales sk (B,H,T) (-inf: masked) and values
    v (B,H,T,e) to the state, in place, at the new running scale max(M, max sk)."""
    Mn = np.maximum(state.M, sk.max(-1))
    keep = _shift_exp(state.M, Mn)                 # old sums move to the new scale (<= 1)
    wk = _shift_exp(sk, Mn[..., None])
    wf = wk[..., None] * fk
    state.S *= keep[..., None, None]
    state.S += np.matmul(np.swapaxes(wf, -1, -2), v)
    state.z *= keep[..., None]
    state.z += wf.sum(2)
    state.R = keep * state.R + wk.sum(-1)
    state.M = Mn
    state.tokens += fk.shape[2]


def _normalise(num, den, R, eps) -> np.ndarray:
    """num / max(den, eps R) per row, zero rows where no key is visible (R = 0)."""
    bound = num.dtype.type(eps) * R
    g = np.where(den < bound, bound, den)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where((R > 0)[..., None], num / np.where(R > 0, g, 1)[..., None], 0)
    return out.astype(num.dtype, copy=False)


def _advance_one(state: LinearAttentionState, fq, fk, sk, v, eps) -> np.ndarray:
    """_advance for a single token (T = 1): the key joins the state first, then the query
    reads it; no (T, T) block. Same shapes as _advance."""
    _absorb(state, fk, sk, v)
    num = np.matmul(fq, state.S)                                    # (B,H,1,e)
    den = np.matmul(fq, state.z[..., None])[..., 0]                 # (B,H,1)
    return _normalise(num, den, state.R[..., None], eps)


def _causal_call(kernel, params: tuple):
    """``kernel(q, k, v, *params, causal=True, key_mask=, eps=, state=, report_finite=True)``
    as ``f(q, k, v, key_mask, eps, packed)``, the parameters bound by position. A call spelled
    with ``*params`` and keywords makes CPython build a tuple and a dict of the keywords
    every time, about half a microsecond of a decoding step; spelled out, the C entry gets
    them in place (its fast argument path)."""
    if len(params) == 0:
        return lambda q, k, v, mask, eps, packed: kernel(
            q, k, v, causal=True, key_mask=mask, eps=eps, state=packed, report_finite=True)
    if len(params) == 1:
        (a,) = params
        return lambda q, k, v, mask, eps, packed: kernel(
            q, k, v, a, causal=True, key_mask=mask, eps=eps, state=packed, report_finite=True)
    if len(params) == 2:
        a, b = params
        return lambda q, k, v, mask, eps, packed: kernel(
            q, k, v, a, b, causal=True, key_mask=mask, eps=eps, state=packed, report_finite=True)
    if len(params) == 3:
        a, b, c = params
        return lambda q, k, v, mask, eps, packed: kernel(
            q, k, v, a, b, c, causal=True, key_mask=mask, eps=eps, state=packed, report_finite=True)
    raise AssertionError(f"no kind's kernel takes {len(params)} parameters")


def _advance(state: LinearAttentionState, fq, fk, sk, v, eps) -> np.ndarray:
    """Outputs of T <= _CHUNK new rows and the state moved past them (in place).

    fq, fk (B,H,T,F); sk (B,H,T) key log-scales, -inf for masked keys; v (B,H,T,e)."""
    T = fk.shape[2]
    Mi = np.maximum(state.M[..., None], np.maximum.accumulate(sk, axis=-1))   # (B,H,T) row scales
    carry = _shift_exp(np.broadcast_to(state.M[..., None], Mi.shape), Mi)   # old state's weight per row
    with np.errstate(invalid="ignore", over="ignore"):
        W = np.exp(sk[..., None, :] - Mi[..., :, None])                      # (B,H,T,T)
    W = np.where(np.tril(np.ones((T, T), bool)) & ~np.isneginf(sk)[..., None, :], W, 0).astype(fq.dtype)
    A = W * np.matmul(fq, np.swapaxes(fk, -1, -2))
    num = np.matmul(A, v) + carry[..., None] * np.matmul(fq, state.S)
    den = A.sum(-1) + carry * np.matmul(fq, state.z[..., None])[..., 0]
    out = _normalise(num, den, W.sum(-1) + carry * state.R[..., None], eps)
    _absorb(state, fk, sk, v)
    return out


_NO_STATE = object()  # _check_inputs called without a state to check (prefill)


class RecurrentAttention:
    """Causal attention of one kind, run as a recurrence.

    Parameters
    ----------
    kind : str
        One of ``RECURRENT_KINDS``: the kinds of :mod:`flexformer.registry` marked
        ``recurrent`` (softmax and every linear kind) or ``"linear"``, where
        q and k are the features themselves as in :func:`flexformer.linear_attention`.
    params : dict of ndarray, optional
        The kind's parameters (``get_attention(kind).init(...)``); none for linear, elu
        and softmax.
    eps : float
        Denominator guard, as in the parallel functions.

    Raises
    ------
    ValueError
        ``kind`` cannot be decoded recurrently (Linformer), a parameter is missing or
        unknown, or ``eps`` is not a finite number > 0.

    Examples
    --------
    Token-by-token decoding equals the parallel causal forward:

    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 12, 8)) for _ in range(3))
    >>> params = ff.get_attention("flex_n").init(2, 8, rng=0)
    >>> rec = ff.RecurrentAttention("flex_n", params)
    >>> out, state = rec.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    >>> tail = [rec.step(state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(8, 12)]
    >>> full = ff.get_attention("flex_n").forward(q, k, v, params, causal=True)
    >>> bool(np.allclose(np.concatenate([out] + tail, axis=2), full))
    True
    """

    def __init__(self, kind: str, params: Optional[Params] = None, *, eps: float = lin.DEFAULT_EPS):
        if kind not in RECURRENT_KINDS:
            why = " (Linformer projects along the whole sequence and has no causal form)" if kind == "linformer" else ""
            raise ValueError(f"kind must be one of {', '.join(RECURRENT_KINDS)}, got {kind!r}{why}")
        params = {} if params is None else dict(params)
        require_params(kind, params)
        self.kind = kind
        spec = None if kind == USER_FEATURES else get_attention(kind)
        self.params = {n: np.asarray(params[n]) for n in (spec.params if spec else ())}
        self._kv_cache = spec is not None and spec.feature_map is None  # softmax: keys and values kept
        # the C causal forward continues a packed state (state=): prefill and step in one call each;
        # kinds with a Python forward (elu) step with the NumPy recurrence below
        name = USER_FEATURES if spec is None else spec.kernel if spec._forward is None and spec.key_state else None
        self._kernel = None
        if name:  # the parameters in the kernel's order
            self._kernel = _causal_call(getattr(_C, f"{name}_forward"),
                                        tuple(self.params[n] for n in (spec.params if spec else ())))
        self.eps = check_positive("eps", eps)

    # ------------------------------------------------------------------ helpers
    def _run_kernel(self, state: LinearAttentionState, q, k, v, key_mask) -> np.ndarray:
        """Outputs of these rows through the C causal forward, moving ``state`` past them."""
        out, _, finite = self._kernel(q, k, v, key_mask, self.eps, state.packed)
        if not finite:
            check_overflow(f"RecurrentAttention({self.kind!r})", out, (q, k, v), "the state of earlier keys")
        state.tokens += out.shape[2]  # out (B, H, T, e): q may be a nested list
        return out

    def _parallel(self, q, k, v, key_mask):
        if self.kind == USER_FEATURES:
            return lin.linear_attention(q, k, v, causal=True, key_mask=key_mask, eps=self.eps)
        spec = get_attention(self.kind)
        return spec.forward(q, k, v, self.params, causal=True, key_mask=key_mask,
                            eps=self.eps if spec.key_state else None)

    def _check_inputs(self, q, k, v, key_mask, state=_NO_STATE):
        arrays = []
        for name, x in (("q", q), ("k", k), ("v", v)):
            x = native(np.asarray(x))
            if x.dtype not in (np.float32, np.float64):
                raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
            if x.ndim != 4:
                raise ValueError(f"{name} must be 4-d (B, H, T, {'e' if name == 'v' else 'd'}), got shape {x.shape}")
            arrays.append(x)
        q, k, v = arrays
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if q.shape[:3] != k.shape[:3] or q.shape[-1] != k.shape[-1] or v.shape[:3] != k.shape[:3]:
            raise ValueError(f"q (B,H,T,d), k (B,H,T,d) and v (B,H,T,e) must agree on B, H, T (and d for q, k); "
                             f"got {q.shape}, {k.shape}, {v.shape}")
        if q.shape[2] < 1:
            raise ValueError("q, k and v need at least one token (T >= 1)")
        B, H, T, d = q.shape
        self._check_params(H, d)
        if key_mask is not None:
            key_mask = np.asarray(key_mask)
            if key_mask.dtype != np.bool_ or key_mask.shape != (B, T):
                raise ValueError(f"key_mask must be a bool array of shape (B, T) = {(B, T)}, got "
                                 f"{key_mask.dtype} {key_mask.shape}")
        if state is not _NO_STATE:
            self._check_state(state, q, v)
        return q, k, v, key_mask

    def _check_params(self, H: int, d: int) -> None:
        check_param_shapes(self.kind, self.params, H, d)

    def _check_state(self, state, q, v) -> None:
        B, H, _, d = q.shape
        e = v.shape[-1]
        if self._kv_cache:
            if not isinstance(state, KVCacheState):
                raise TypeError(f"state for softmax must be a KVCacheState (from prefill or empty_state), "
                                f"got {type(state).__name__}")
            want, got = (B, H, d, e), state._k.shape[:2] + (state._k.shape[3], state._v.shape[3])
            what = "(B, H, d, e)"
        else:
            if not isinstance(state, LinearAttentionState):
                raise TypeError(f"state for {self.kind} must be a LinearAttentionState (from prefill or "
                                f"empty_state), got {type(state).__name__}")
            want, got = (B, H, _num_features(self.kind, self.params, d), e), state.S.shape
            what = "(B, H, F, e)"
            if state.z.shape != got[:3] or state.R.shape != got[:2] or state.M.shape != got[:2]:
                raise ValueError("state arrays are inconsistent: z must be (B, H, F), R and M (B, H)")
        if tuple(got) != tuple(want):
            raise ValueError(f"state has shape {what} = {tuple(got)} but these inputs need {tuple(want)}")
        if state.dtype != q.dtype:
            raise TypeError(f"state is {state.dtype} but q, k, v are {q.dtype}")

    # --------------------------------------------------------------------- API
    def empty_state(self, batch: int, heads: int, head_dim: int, value_dim: int, dtype=np.float32) -> State:
        """A state that has seen no tokens, for inputs of head size ``head_dim`` (d) and
        values of size ``value_dim`` (e)."""
        if self._kv_cache:
            return KVCacheState.empty(batch, heads, head_dim, value_dim, dtype)
        self._check_params(heads, head_dim)
        return LinearAttentionState.empty(batch, heads, _num_features(self.kind, self.params, head_dim),
                                          value_dim, dtype)

    def prefill(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                key_mask: Optional[np.ndarray] = None) -> Tuple[np.ndarray, State]:
        """Process a prompt in one parallel causal call; returns (out (B, H, T, e), state).

        ``out`` is exactly the parallel causal forward; ``state`` continues it."""
        q, k, v, key_mask = self._check_inputs(q, k, v, key_mask)
        B, H, T, d = q.shape
        state = self.empty_state(B, H, d, v.shape[-1], q.dtype)
        if self._kv_cache:
            out = self._parallel(q, k, v, key_mask)
            state.append(k, v, np.ones((B, T), bool) if key_mask is None else key_mask)
            return out, state
        if self._kernel is not None:  # one C pass gives the outputs and the state
            return self._run_kernel(state, q, k, v, key_mask), state
        out = self._parallel(q, k, v, key_mask)
        for lo in range(0, T, _PREFILL_BLOCK):
            hi = min(T, lo + _PREFILL_BLOCK)
            fk, sk = _features(self.kind, k[:, :, lo:hi], self.params)
            if key_mask is not None:
                sk = np.where(key_mask[:, None, lo:hi], sk, -np.inf).astype(sk.dtype)
            _absorb(state, fk, sk, v[:, :, lo:hi])
        return out, state

    def step(self, state: State, q: np.ndarray, k: np.ndarray, v: np.ndarray,
             key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Advance ``state`` in place by T >= 1 tokens (q, k: (B, H, T, d); v: (B, H, T, e));
        returns their outputs (B, H, T, e), row t seeing every earlier key and keys <= t."""
        # The fast path, inline (a decoding step is about 20 us; checks written in Python, or
        # another method call or two, cost a microsecond of it): the C kernel checks every
        # dtype and shape itself and moves the state only once they pass, so it goes first.
        # When it refuses the arguments, or they hold no token (T = 0, which it accepts), the
        # full checks below say what is wrong in this class's terms.
        if self._kernel is not None and type(state) is LinearAttentionState:
            try:
                out = self._run_kernel(state, q, k, v, key_mask)
            except (TypeError, ValueError):
                out = None
            if out is not None and out.shape[2]:
                return out
        q, k, v, key_mask = self._check_inputs(q, k, v, key_mask, state)
        if self._kv_cache:
            return self._softmax_step(state, q, k, v, key_mask)
        if self._kernel is not None:
            return self._run_kernel(state, q, k, v, key_mask)
        outs = []
        for lo in range(0, q.shape[2], _CHUNK):
            hi = min(q.shape[2], lo + _CHUNK)
            fq, _ = _features(self.kind, q[:, :, lo:hi], self.params)
            fk, sk = _features(self.kind, k[:, :, lo:hi], self.params)
            if key_mask is not None:
                sk = np.where(key_mask[:, None, lo:hi], sk, -np.inf).astype(sk.dtype)
            advance = _advance_one if hi - lo == 1 else _advance
            outs.append(advance(state, fq, fk, sk, v[:, :, lo:hi], self.eps))
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=2)

    def _softmax_step(self, state: KVCacheState, q, k, v, key_mask) -> np.ndarray:
        B, H, T, d = q.shape
        t0 = state.tokens
        state.append(k, v, np.ones((B, T), bool) if key_mask is None else key_mask)
        logits = np.matmul(q, np.swapaxes(state.keys, -1, -2)) * q.dtype.type(1.0 / np.sqrt(d))  # (B,H,T,t)
        visible = np.arange(state.tokens)[None, :] <= (t0 + np.arange(T))[:, None]
        visible = visible[None, None] & state.key_mask[:, None, None, :]
        logits = np.where(visible, logits, -np.inf)
        top = logits.max(-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0)
        w = np.exp(logits - top)
        den = w.sum(-1, keepdims=True)
        out = np.matmul(w, state.values) / np.where(den > 0, den, 1)
        return out.astype(q.dtype, copy=False)

__all__ = ["RECURRENT_KINDS", "KVCacheState", "LinearAttentionState", "RecurrentAttention"]
