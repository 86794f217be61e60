"""Multi-head attention over any registered attention kind, and the pre-LN block."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from ..functional import DEFAULT_EPS
from ..recurrent import RecurrentAttention, State
from ..registry import get_attention
from .._checks import check_bool, check_float_dtype, check_int, check_positive
from ..init import RngLike, as_generator
from .core import MLP, LayerNorm, Linear, Module, Parameter, ShortConv, check_input, check_short_conv

LINFORMER_SHARING = ("none", "headwise", "key-value", "layerwise")


def check_layer_options(qk_norm, learn_scale, linformer_sharing):
    """``(qk_norm, learn_scale, linformer_sharing)`` as this layer and the torch one take
    them: two bools, not both True, and one of :data:`LINFORMER_SHARING`; TypeError or
    ValueError naming the one that is off."""
    qk_norm, learn_scale = check_bool("qk_norm", qk_norm), check_bool("learn_scale", learn_scale)
    if qk_norm and learn_scale:
        raise ValueError("qk_norm and learn_scale are alternatives (qk_norm learns a length of its own); "
                         "choose one")
    if linformer_sharing not in LINFORMER_SHARING:
        raise ValueError(f"linformer_sharing must be one of {LINFORMER_SHARING}, got {linformer_sharing!r}")
    return qk_norm, learn_scale, linformer_sharing


class MultiHeadAttention(Module):
    """Q/K/V/output projections around one attention kind of :mod:`flexformer.registry`.

    Parameters
    ----------
    dim, num_heads : int
        Model width and heads (dim must be divisible by num_heads).
    attention : str
        A registered kind (``flexformer.attention_kinds()``).
    rng : None, int or numpy.random.Generator
        Draws the projections and the kind's initial parameters.
    causal : bool
        Attend to earlier positions only.
    max_len : int
        Longest sequence (sizes Linformer's projections).
    num_features : int, optional
        m for the feature-map kinds, kp for Linformer.
    linformer_sharing : {"none", "headwise", "key-value", "layerwise"}
        Linformer's projections: per head; one (E, F) pair for all heads; one array for
        E and F; or (with ``shared``) one array for every layer.
    shared : dict, optional
        Parameters shared across layers (layerwise Linformer sharing).
    eps : float, optional
        The denominator guard of the linear kinds (default ``flexformer.DEFAULT_EPS``);
        ignored by softmax and Linformer.
    qk_norm : bool
        Scale every query and key to the same learned length per head before the kernel:
        q' = e^g q / |q|, k' = e^g k / |k|, with g (H,) learned (``attn.qk_log_scale``,
        starting at log sqrt(head size), so |q'|^2 = head size). Bounds |q' - k'|, and so the
        random-feature kernels' noise, whatever the projections do (as RFA does).
    learn_scale : bool
        Scale queries and keys by a learned factor per head before the kernel:
        q' = e^g q, k' = e^g k, with g (H,) learned (``attn.log_scale``, starting at 0, so
        the model starts as without it). For flex_s this learns the kernel's bandwidth, as
        tau learns flex_n's norm scale; for softmax it is a learned temperature. Not
        together with ``qk_norm`` (which has its own learned length).
    short_conv : int
        0 (default) or a width >= 2: queries, keys and values each pass through a causal
        depthwise convolution of that width along the sequence (:class:`ShortConv`, starting
        as the identity) after their projection, so every position also sees the few
        positions before it. Padded positions (``key_mask`` False) enter it as zeros.
    kernel_init : dict, optional
        Initialisation options of the kind (``AttentionKind.init_options``, e.g.
        ``{"scale": 0.3, "spread": 0.3}``); options the kind does not take are ignored, so
        one dict serves every kind.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 2, "flex_n", rng, causal=True)
    >>> x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    >>> y = mha.forward(x)
    >>> y.shape, mha.backward(np.ones_like(y)).shape
    ((2, 8, 16), (2, 8, 16))
    """

    def __init__(self, dim: int, num_heads: int, attention: str, rng: RngLike, *,
                 causal: bool = False, max_len: int = 512, num_features: Optional[int] = None,
                 linformer_sharing: str = "none", shared: Optional[Dict[str, Parameter]] = None,
                 kernel_init: Optional[Dict[str, object]] = None, eps: Optional[float] = None,
                 qk_norm: bool = False, learn_scale: bool = False, short_conv: int = 0,
                 dtype=np.float32):
        super().__init__()
        dim, num_heads, dtype = check_int("dim", dim), check_int("num_heads", num_heads), check_float_dtype(dtype)
        max_len = check_int("max_len", max_len)
        causal = check_bool("causal", causal)
        qk_norm, learn_scale, linformer_sharing = check_layer_options(qk_norm, learn_scale, linformer_sharing)
        eps = check_positive("eps", eps, optional=True)
        rng = as_generator(rng)
        short_conv = check_short_conv(short_conv)
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.kind = get_attention(attention)
        if causal and not self.kind.causal:
            raise ValueError(f"attention {attention!r} has no causal mode; choose another kind for a "
                             f"causal model")
        self.dim, self.heads, self.causal = dim, num_heads, causal
        self.dh = dim // num_heads
        self.q = self.add_child("q", Linear(dim, dim, rng, dtype=dtype))
        self.k = self.add_child("k", Linear(dim, dim, rng, dtype=dtype))
        self.v = self.add_child("v", Linear(dim, dim, rng, dtype=dtype))
        self.o = self.add_child("o", Linear(dim, dim, rng, dtype=dtype))
        self.convs = [self.add_child(f"conv_{name}", ShortConv(dim, short_conv, dtype=dtype))
                      if short_conv else None for name in "qkv"]
        if kernel_init is not None and not isinstance(kernel_init, dict):
            raise TypeError(f"kernel_init must be a dict of the kind's initialisation options or None, got "
                            f"{type(kernel_init).__name__}")
        options = {k: v for k, v in (kernel_init or {}).items() if k in self.kind.init_options}
        init = self.kind.init(num_heads, self.dh, num_features=num_features, max_len=max_len, rng=rng,
                              dtype=dtype, **options)
        self.sharing = linformer_sharing if attention == "linformer" else "none"
        if self.sharing != "none":
            E = init["E"][0]  # (kp, Nmax): one pair for all heads
            if self.sharing == "layerwise" and shared is not None and "linformer" in shared:
                P = shared["linformer"]
            else:
                P = Parameter(E, kind="kernel")
                if self.sharing == "layerwise" and shared is not None:
                    shared["linformer"] = P
            if self.sharing == "headwise":
                init = {"E": E, "F": init["F"][0]}
            else:
                init = {"E": P}
        self.kernel: Dict[str, Parameter] = {}
        for name, value in init.items():
            self.kernel[name] = self.add_param("attn." + name, value, kind="kernel",
                                               trainable=name in self.kind.learnable)
        self._mask = None
        self._recurrent = None  # (eps, parameter arrays, RecurrentAttention): recurrent()
        self.eps = eps if self.kind.key_state else None
        self.qk_scale, self.qk_mode = None, None
        if qk_norm:
            self.qk_scale, self.qk_mode = self.add_param(
                "attn.qk_log_scale", np.full(num_heads, 0.5 * np.log(self.dh), dtype), kind="kernel"), "norm"
        elif learn_scale:
            self.qk_scale, self.qk_mode = self.add_param("attn.log_scale", np.zeros(num_heads, dtype),
                                                         kind="kernel"), "scale"

    def _kernel_values(self) -> Dict[str, np.ndarray]:
        if self.sharing in ("key-value", "layerwise"):
            E = self.kernel["E"].value
            return {"E": E, "F": E}
        return {name: p.value for name, p in self.kernel.items()}

    def _split(self, x: np.ndarray) -> np.ndarray:
        B, N, _ = x.shape
        return np.ascontiguousarray(x.reshape(B, N, self.heads, self.dh).transpose(0, 2, 1, 3))

    def _merge(self, x: np.ndarray) -> np.ndarray:
        B, H, N, dh = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, N, H * dh)

    def _normalise(self, x: np.ndarray):
        """(x', |x|) with x' = e^g x / |x| per head (qk_norm), (e^g x, None) (learn_scale),
        or (x, None)."""
        if self.qk_scale is None:
            return x, None
        if self.qk_mode == "scale":
            return np.ascontiguousarray(x * np.exp(self.qk_scale.value).astype(x.dtype)[None, :, None, None]), None
        norm = np.sqrt((x * x).sum(-1, keepdims=True))
        norm = np.maximum(norm, np.finfo(x.dtype).tiny)
        gain = np.exp(self.qk_scale.value).astype(x.dtype)[None, :, None, None]
        return np.ascontiguousarray(x * (gain / norm)), norm

    def _normalise_backward(self, dy: np.ndarray, y: np.ndarray, norm: np.ndarray) -> np.ndarray:
        """dx for y = e^g x / |x| (or y = e^g x), adding dg = sum dy.y to the scale's gradient."""
        if self.qk_scale is None:
            return dy
        self.qk_scale.grad += (dy * y).sum(axis=(0, 2, 3)).astype(self.qk_scale.grad.dtype)
        gain = np.exp(self.qk_scale.value).astype(y.dtype)[None, :, None, None]
        if self.qk_mode == "scale":
            return gain * dy
        unit = y / gain
        return (gain / norm) * (dy - unit * (unit * dy).sum(-1, keepdims=True))

    def _project(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None, tails=None):
        """Queries, keys, values (B, H, N, dh) and the norms of ``_normalise``. With short
        convolutions, ``tails`` continues a decoded sequence and ``self._conv_in`` keeps
        the convolutions' inputs (for the next tails)."""
        heads, self._conv_in = [], []
        for i, (layer, conv) in enumerate(zip((self.q, self.k, self.v), self.convs)):
            y = layer.forward(x)
            if conv is not None:
                if key_mask is not None:  # padding enters the window as zeros
                    y = y * np.asarray(key_mask, y.dtype)[..., None]
                self._conv_in.append(y)
                y = conv.forward(y, None if tails is None else tails[i])
            heads.append(self._split(y))
        q, k, v = heads
        (q, qn), (k, kn) = self._normalise(q), self._normalise(k)
        return q, k, v, qn, kn

    def _next_tails(self, tails):
        return [conv.next_tail(y, tail) for conv, y, tail in zip(self.convs, self._conv_in, tails)]

    def _conv_backward(self, i: int, dy: np.ndarray) -> np.ndarray:
        conv = self.convs[i]
        if conv is None:
            return dy
        dy = conv.backward(dy)
        return dy if self._mask is None else dy * np.asarray(self._mask, dy.dtype)[..., None]

    def _check_x(self, x) -> np.ndarray:
        W = self.q.W.value
        return check_input("x", x, self.dim, W.dtype, ndim=3, layout="(B, N, dim)")

    def forward(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        x = self._check_x(x)
        self._q, self._k, self._v, self._qn, self._kn = self._project(x, key_mask)
        self._mask = key_mask
        self._key_state = self._projections = None
        self.guard_count = None
        if self.kind.key_state:  # linear kinds: the guard count comes with the output
            # bidirectional: the backward skips the key pass, and the projections where kept
            keep = self.kind.projections and not self.causal
            res = self.kind.forward(self._q, self._k, self._v, self._kernel_values(), causal=self.causal,
                                    key_mask=key_mask, return_guard_count=True, eps=self.eps,
                                    return_key_state=not self.causal, return_projections=keep)
            out, self.guard_count = res[0], res[1]
            if not self.causal:
                self._key_state = res[2]
            if keep:
                self._projections = res[3]
        else:
            out = self.kind.forward(self._q, self._k, self._v, self._kernel_values(), causal=self.causal,
                                    key_mask=key_mask)
        return self.o.forward(self._merge(out))

    def diagnostics(self, *, rows: int = 32) -> dict:
        """Kernel diagnostics of the last forward call (:func:`flexformer.diagnostics.layer_diagnostics`)."""
        from ..diagnostics import layer_diagnostics

        if getattr(self, "_q", None) is None:
            raise RuntimeError("diagnostics need a forward call first")
        return layer_diagnostics(self.kind.name, self._q, self._k, self._kernel_values(), causal=self.causal,
                                 key_mask=self._mask, guard_count=self.guard_count, rows=rows,
                                 eps=self.eps if self.eps is not None else DEFAULT_EPS)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dout = self._split(self.o.backward(dy))
        dq, dk, dv, grads = self.kind.backward(dout, self._q, self._k, self._v, self._kernel_values(),
                                               causal=self.causal, key_mask=self._mask, key_state=self._key_state,
                                               eps=self.eps, projections=self._projections)
        if self.sharing in ("key-value", "layerwise"):
            self.kernel["E"].grad += grads["E"] + grads["F"]
        else:
            for name, g in grads.items():
                self.kernel[name].grad += g
        dq = self._normalise_backward(dq, self._q, self._qn)
        dk = self._normalise_backward(dk, self._k, self._kn)
        dx = self.q.backward(self._conv_backward(0, self._merge(dq)))
        dx = dx + self.k.backward(self._conv_backward(1, self._merge(dk)))
        return dx + self.v.backward(self._conv_backward(2, self._merge(dv)))


    # ------------------------------------------------------- recurrent decoding
    def recurrent(self) -> RecurrentAttention:
        """This layer's attention as a recurrence (causal layers only).

        Built on the first call and returned again while ``eps`` and every parameter array
        stay the same objects: it holds those arrays, not copies, so in-place updates reach
        it, and a replaced array (a loaded checkpoint, a cast) builds a new one. Building it
        cost 8 us of a decoding step per layer."""
        if not self.causal:
            raise ValueError("recurrent decoding needs a causal attention layer")
        values = self._kernel_values()
        cached = self._recurrent
        if (cached is not None and cached[0] == self.eps and cached[1].keys() == values.keys()
                and all(cached[1][name] is value for name, value in values.items())):
            return cached[2]
        extra = {} if self.eps is None else {"eps": self.eps}
        rec = RecurrentAttention(self.kind.name, values, **extra)
        self._recurrent = (self.eps, values, rec)
        return rec

    def __getstate__(self) -> dict:
        # copies and pickles leave the recurrence behind: its kernel call is bound to this
        # layer's arrays (and cannot be pickled); the copy builds its own on first use
        state = self.__dict__.copy()
        state["_recurrent"] = None
        return state

    def prefill(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None):
        """(y, state): the causal forward of x (B, T, dim) and the state after it (a
        :class:`ConvDecodeState` when the layer has short convolutions)."""
        x = self._check_x(x)
        q, k, v, _, _ = self._project(x, key_mask)
        out, state = self.recurrent().prefill(q, k, v, key_mask)
        if self.convs[0] is not None:
            B, _, dim = x.shape
            empty = np.zeros((B, self.convs[0].width - 1, dim), q.dtype)
            state = ConvDecodeState(state, self._next_tails([empty] * 3))
        return self.o.forward(self._merge(out)), state

    def step(self, x: np.ndarray, state, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Outputs for T new positions x (B, T, dim), advancing ``state`` in place."""
        x = self._check_x(x)
        if self.convs[0] is None:
            q, k, v, _, _ = self._project(x, key_mask)
            return self.o.forward(self._merge(self.recurrent().step(state, q, k, v, key_mask)))
        if not isinstance(state, ConvDecodeState):
            raise TypeError(f"this layer has short convolutions: state must be the ConvDecodeState its prefill "
                            f"returned, got {type(state).__name__}")
        q, k, v, _, _ = self._project(x, key_mask, state.tails)
        out = self.recurrent().step(state.attention, q, k, v, key_mask)
        state.tails = self._next_tails(state.tails)
        return self.o.forward(self._merge(out))


class ConvDecodeState:
    """One layer's decoding state when it has short convolutions: the attention's
    recurrent ``State`` and ``tails``, the last width - 1 inputs of the query, key and value
    convolutions, each (B, width - 1, dim).

    Parameters
    ----------
    attention : LinearAttentionState or KVCacheState
    tails : sequence of ndarray
        The query, key and value convolutions' last inputs.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import CausalLM
    >>> lm = CausalLM(16, dim=8, depth=1, heads=2, max_len=32, short_conv=4, rng=0)
    >>> _, cache = lm.prefill(np.array([[1, 2, 3]]))
    >>> type(cache.states[0]).__name__, cache.states[0].tails[0].shape
    ('ConvDecodeState', (1, 3, 8))
    """

    __slots__ = ("attention", "tails")

    def __init__(self, attention: State, tails) -> None:
        self.attention, self.tails = attention, list(tails)

    @property
    def tokens(self) -> int:
        return self.attention.tokens

    @property
    def nbytes(self) -> int:
        return self.attention.nbytes + sum(t.nbytes for t in self.tails)

    def copy(self) -> "ConvDecodeState":
        return ConvDecodeState(self.attention.copy(), [t.copy() for t in self.tails])

    def __repr__(self) -> str:
        return f"ConvDecodeState({self.attention!r}, width={self.tails[0].shape[1] + 1})"


class Block(Module):
    """Pre-LN residual block: x + MHA(LN(x)), then x + MLP(LN(x)).

    Parameters
    ----------
    dim, num_heads : int
    attention : str
        A registered attention kind.
    rng : None, int or numpy.random.Generator
    mlp_ratio : int, optional
        The MLP's hidden width over ``dim``.
    dtype : float32 or float64, optional
    **attn_kwargs
        Passed to :class:`MultiHeadAttention` (``causal``, ``max_len``, ...).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import Block
    >>> block = Block(16, 2, "softmax", rng)
    >>> block.forward(np.ones((1, 4, 16), np.float32)).shape
    (1, 4, 16)
    """

    def __init__(self, dim: int, num_heads: int, attention: str, rng: RngLike, *,
                 mlp_ratio: int = 4, dtype=np.float32, **attn_kwargs):
        super().__init__()
        rng = as_generator(rng)  # one generator for both halves
        mlp_ratio = check_int("mlp_ratio", mlp_ratio)
        self.ln1 = self.add_child("ln1", LayerNorm(dim, dtype=dtype))
        self.attn = self.add_child("attn", MultiHeadAttention(dim, num_heads, attention, rng, dtype=dtype,
                                                              **attn_kwargs))
        self.ln2 = self.add_child("ln2", LayerNorm(dim, dtype=dtype))
        self.mlp = self.add_child("mlp", MLP(dim, mlp_ratio * dim, rng, dtype=dtype))

    def forward(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        x = x + self.attn.forward(self.ln1.forward(x), key_mask)
        return x + self.mlp.forward(self.ln2.forward(x))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dx = dy + self.ln2.backward(self.mlp.backward(dy))
        return dx + self.ln1.backward(self.attn.backward(dx))

    def prefill(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None):
        y, state = self.attn.prefill(self.ln1.forward(x), key_mask)
        x = x + y
        return x + self.mlp.forward(self.ln2.forward(x)), state

    def step(self, x: np.ndarray, state: State, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        x = x + self.attn.step(self.ln1.forward(x), state, key_mask)
        return x + self.mlp.forward(self.ln2.forward(x))
