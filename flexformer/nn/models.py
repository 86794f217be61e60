"""The two models: an encoder classifier (mean-pooled) and a causal language model."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from ..init import RngLike, as_generator
from .attention import Block
from .core import Embedding, LayerNorm, Linear, Module, Parameter, PositionalEncoding


class _Backbone(Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, max_len: int, attention: str,
                 rng: np.random.Generator, *, causal: bool, positional: str, mlp_ratio: int,
                 num_features: Optional[int], linformer_sharing: str, dtype):
        super().__init__()
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        self.embed = self.add_child("embed", Embedding(vocab, dim, rng, dtype=dtype))
        self.pos = self.add_child("pos", PositionalEncoding(max_len, dim, rng, learned=positional == "learned",
                                                            dtype=dtype))
        shared: Dict[str, Parameter] = {}
        self.blocks = [self.add_child(f"blocks.{i}", Block(
            dim, heads, attention, rng, mlp_ratio=mlp_ratio, dtype=dtype, causal=causal, max_len=max_len,
            num_features=num_features, linformer_sharing=linformer_sharing, shared=shared))
            for i in range(depth)]
        self.norm = self.add_child("norm", LayerNorm(dim, dtype=dtype))

    def forward(self, ids: np.ndarray, key_mask: Optional[np.ndarray]) -> np.ndarray:
        x = self.pos.forward(self.embed.forward(ids))
        for block in self.blocks:
            x = block.forward(x, key_mask)
        return self.norm.forward(x)

    def backward(self, dh: np.ndarray) -> None:
        dx = self.norm.backward(dh)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.embed.backward(self.pos.backward(dx))


class EncoderClassifier(Module):
    """Tokens (B, N) -> class logits (B, C): embedding, positions, pre-LN blocks, final
    LayerNorm, mean over the unmasked positions, linear head.

    Parameters
    ----------
    vocab, num_classes, dim, depth, heads, max_len : int
    attention : str
        Any kind from ``flexformer.attention_kinds()``.
    positional : {"learned", "sinusoidal"}
    mlp_ratio : int
    num_features : int, optional
        m (feature maps) or kp (Linformer).
    linformer_sharing : {"none", "headwise", "key-value", "layerwise"}
    rng : seed or Generator
    dtype : float32 or float64
    """

    def __init__(self, vocab: int, num_classes: int, *, dim: int = 64, depth: int = 2, heads: int = 4,
                 max_len: int = 512, attention: str = "flex_n", positional: str = "learned",
                 mlp_ratio: int = 4, num_features: Optional[int] = None, linformer_sharing: str = "none",
                 rng: RngLike = 0, dtype=np.float32):
        super().__init__()
        gen = as_generator(rng)
        self.backbone = self.add_child("backbone", _Backbone(
            vocab, dim, depth, heads, max_len, attention, gen, causal=False, positional=positional,
            mlp_ratio=mlp_ratio, num_features=num_features, linformer_sharing=linformer_sharing, dtype=dtype))
        self.head = self.add_child("head", Linear(dim, num_classes, gen, dtype=dtype))

    def forward(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Logits (B, num_classes); ``mask`` (B, N) bool marks real tokens (True)."""
        h = self.backbone.forward(ids, mask)
        w = np.ones(h.shape[:2], h.dtype) if mask is None else np.asarray(mask, h.dtype)
        self._w = w / np.maximum(w.sum(1, keepdims=True), 1)
        self._shape = h.shape
        return self.head.forward((h * self._w[..., None]).sum(1))

    def backward(self, dlogits: np.ndarray) -> None:
        dpooled = self.head.backward(dlogits)
        self.backbone.backward(dpooled[:, None, :] * self._w[..., None])


class CausalLM(Module):
    """Tokens (B, N) -> next-token logits (B, N, vocab) with causal attention."""

    def __init__(self, vocab: int, *, dim: int = 64, depth: int = 2, heads: int = 4, max_len: int = 512,
                 attention: str = "flex_n", positional: str = "learned", mlp_ratio: int = 4,
                 num_features: Optional[int] = None, rng: RngLike = 0, dtype=np.float32):
        super().__init__()
        gen = as_generator(rng)
        self.backbone = self.add_child("backbone", _Backbone(
            vocab, dim, depth, heads, max_len, attention, gen, causal=True, positional=positional,
            mlp_ratio=mlp_ratio, num_features=num_features, linformer_sharing="none", dtype=dtype))
        self.head = self.add_child("head", Linear(dim, vocab, gen, dtype=dtype))

    def forward(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        return self.head.forward(self.backbone.forward(ids, mask))

    def backward(self, dlogits: np.ndarray) -> None:
        self.backbone.backward(self.head.backward(dlogits))
