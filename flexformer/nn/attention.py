"""Multi-head attention over any registered attention kind, and the pre-LN block."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from ..recurrent import RecurrentAttention, State
from ..registry import get_attention
from .core import MLP, LayerNorm, Linear, Module, Parameter

LINFORMER_SHARING = ("none", "headwise", "key-value", "layerwise")


class MultiHeadAttention(Module):
    """Q/K/V/output projections around one attention kind of :mod:`flexformer.registry`.

    Parameters
    ----------
    dim, num_heads : int
        Model width and heads (dim must be divisible by num_heads).
    attention : str
        A registered kind (``flexformer.attention_kinds()``).
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
    """

    def __init__(self, dim: int, num_heads: int, attention: str, rng: np.random.Generator, *,
                 causal: bool = False, max_len: int = 512, num_features: Optional[int] = None,
                 linformer_sharing: str = "none", shared: Optional[Dict[str, Parameter]] = None,
                 dtype=np.float32):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.kind = get_attention(attention)
        if causal and not self.kind.causal:
            raise ValueError(f"attention {attention!r} has no causal mode; choose another kind for a "
                             f"causal model")
        if linformer_sharing not in LINFORMER_SHARING:
            raise ValueError(f"linformer_sharing must be one of {LINFORMER_SHARING}, got {linformer_sharing!r}")
        self.dim, self.heads, self.causal = dim, num_heads, causal
        self.dh = dim // num_heads
        self.q = self.add_child("q", Linear(dim, dim, rng, dtype=dtype))
        self.k = self.add_child("k", Linear(dim, dim, rng, dtype=dtype))
        self.v = self.add_child("v", Linear(dim, dim, rng, dtype=dtype))
        self.o = self.add_child("o", Linear(dim, dim, rng, dtype=dtype))
        init = self.kind.init(num_heads, self.dh, num_features=num_features, max_len=max_len, rng=rng,
                              dtype=dtype)
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

    def forward(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        self._q, self._k, self._v = (self._split(layer.forward(x)) for layer in (self.q, self.k, self.v))
        self._mask = key_mask
        self._key_state = None
        if self.kind.key_state and not self.causal:  # kept for the backward: it skips the key pass
            out, self._key_state = self.kind.forward(self._q, self._k, self._v, self._kernel_values(),
                                                     key_mask=key_mask, return_key_state=True)
        else:
            out = self.kind.forward(self._q, self._k, self._v, self._kernel_values(), causal=self.causal,
                                    key_mask=key_mask)
        return self.o.forward(self._merge(out))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dout = self._split(self.o.backward(dy))
        dq, dk, dv, grads = self.kind.backward(dout, self._q, self._k, self._v, self._kernel_values(),
                                               causal=self.causal, key_mask=self._mask, key_state=self._key_state)
        if self.sharing in ("key-value", "layerwise"):
            self.kernel["E"].grad += grads["E"] + grads["F"]
        else:
            for name, g in grads.items():
                self.kernel[name].grad += g
        dx = self.q.backward(self._merge(dq))
        dx = dx + self.k.backward(self._merge(dk))
        return dx + self.v.backward(self._merge(dv))


    # ------------------------------------------------------- recurrent decoding
    def recurrent(self) -> RecurrentAttention:
        """This layer's attention as a recurrence (causal layers only)."""
        if not self.causal:
            raise ValueError("recurrent decoding needs a causal attention layer")
        return RecurrentAttention(self.kind.name, self._kernel_values())

    def prefill(self, x: np.ndarray, key_mask: Optional[np.ndarray] = None):
        """(y, state): the causal forward of x (B, T, dim) and the state after it."""
        q, k, v = (self._split(layer.forward(x)) for layer in (self.q, self.k, self.v))
        out, state = self.recurrent().prefill(q, k, v, key_mask)
        return self.o.forward(self._merge(out)), state

    def step(self, x: np.ndarray, state: State, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Outputs for T new positions x (B, T, dim), advancing ``state`` in place."""
        q, k, v = (self._split(layer.forward(x)) for layer in (self.q, self.k, self.v))
        return self.o.forward(self._merge(self.recurrent().step(state, q, k, v, key_mask)))


class Block(Module):
    """Pre-LN residual block: x + MHA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, num_heads: int, attention: str, rng: np.random.Generator, *,
                 mlp_ratio: int = 4, dtype=np.float32, **attn_kwargs):
        super().__init__()
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
