"""The two models: an encoder classifier (mean-pooled) and a causal language model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from .._checks import check_int, check_positive
from ..init import RngLike, as_generator
from ..recurrent import State
from .attention import Block
from .core import GELU, Embedding, LayerNorm, Linear, Module, Parameter, PositionalEncoding, check_grad


class _Backbone(Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, max_len: int, attention: str,
                 rng: np.random.Generator, *, causal: bool, positional: str, mlp_ratio: int,
                 num_features: Optional[int], linformer_sharing: str, kernel_init, dtype, eps=None,
                 qk_norm=False, learn_scale=False, short_conv=0):
        super().__init__()
        depth = check_int("depth", depth, 0)
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        self.embed = self.add_child("embed", Embedding(vocab, dim, rng, dtype=dtype))
        self.pos = self.add_child("pos", PositionalEncoding(max_len, dim, rng, learned=positional == "learned",
                                                            dtype=dtype))
        shared: Dict[str, Parameter] = {}
        self.blocks = [self.add_child(f"blocks.{i}", Block(
            dim, heads, attention, rng, mlp_ratio=mlp_ratio, dtype=dtype, causal=causal, max_len=max_len,
            num_features=num_features, linformer_sharing=linformer_sharing, shared=shared,
            kernel_init=kernel_init, eps=eps, qk_norm=qk_norm, learn_scale=learn_scale, short_conv=short_conv))
            for i in range(depth)]
        self.norm = self.add_child("norm", LayerNorm(dim, dtype=dtype))

    def forward(self, ids: np.ndarray, key_mask: Optional[np.ndarray]) -> np.ndarray:
        ids = _check_ids(ids, self.embed.vocab)
        x = self.pos.forward(self.embed.forward(ids))
        for block in self.blocks:
            x = block.forward(x, key_mask)
        return self.norm.forward(x)

    def prefill(self, ids: np.ndarray) -> "DecodeCache":
        x = self.pos.forward(self.embed.forward(ids))
        states = []
        for block in self.blocks:
            x, state = block.prefill(x)
            states.append(state)
        return self.norm.forward(x), DecodeCache(states, ids.shape[1])

    def step(self, ids: np.ndarray, cache: "DecodeCache") -> np.ndarray:
        x = self.pos.forward(self.embed.forward(ids), offset=cache.position)
        for block, state in zip(self.blocks, cache.states):
            x = block.step(x, state)
        cache.position += ids.shape[1]
        return self.norm.forward(x)

    def backward(self, dh: np.ndarray) -> None:
        dx = self.norm.backward(dh)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.embed.backward(self.pos.backward(dx))


@dataclass
class DecodeCache:
    """Per-layer recurrent states of a causal LM and the next position to fill.

    Parameters
    ----------
    states : list
        One recurrent state per layer.
    position : int
        The next position.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import CausalLM
    >>> lm = CausalLM(16, dim=8, depth=2, heads=2, max_len=32, rng=0)
    >>> _, cache = lm.prefill(np.array([[1, 2, 3]]))
    >>> len(cache.states), cache.position
    (2, 3)
    """

    states: List[State]
    position: int

    def copy(self) -> "DecodeCache":
        return DecodeCache([s.copy() for s in self.states], self.position)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.states)


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
    kernel_init : dict, optional
        Initialisation options for the attention kind (``scale`` of the trig kinds,
        ``spread`` of flex_n; see :mod:`flexformer.init`); ignored by kinds without them.
    eps : float, optional
        The linear kinds' denominator guard (default ``flexformer.DEFAULT_EPS``).
    qk_norm : bool
        Queries and keys scaled to a learned length per head before the kernel
        (:class:`flexformer.nn.MultiHeadAttention`).
    learn_scale : bool
        Queries and keys multiplied by a learned factor per head before the kernel (a
        learned bandwidth for flex_s; :class:`flexformer.nn.MultiHeadAttention`).
    short_conv : int
        0 (off) or the width of a causal depthwise convolution on queries, keys and values
        after their projections (:class:`flexformer.nn.MultiHeadAttention`).
    rng : seed or Generator
    dtype : float32 or float64

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import EncoderClassifier, cross_entropy
    >>> model = EncoderClassifier(vocab=16, num_classes=3, dim=16, depth=1, heads=2, max_len=8, rng=0)
    >>> ids = np.random.default_rng(0).integers(0, 16, (4, 8))
    >>> logits = model.forward(ids, np.ones((4, 8), bool))
    >>> loss, dlogits = cross_entropy(logits, np.array([0, 1, 2, 0]))
    >>> model.zero_grad(); model.backward(dlogits)
    >>> logits.shape, model.gradients()["head.W"].shape
    ((4, 3), (16, 3))
    """

    def __init__(self, vocab: int, num_classes: int, *, dim: int = 64, depth: int = 2, heads: int = 4,
                 max_len: int = 512, attention: str = "flex_n", positional: str = "learned",
                 mlp_ratio: int = 4, num_features: Optional[int] = None, linformer_sharing: str = "none",
                 kernel_init: Optional[Dict[str, object]] = None, eps: Optional[float] = None,
                 qk_norm: bool = False, learn_scale: bool = False, short_conv: int = 0, rng: RngLike = 0,
                 dtype=np.float32):
        super().__init__()
        num_classes = check_int("num_classes", num_classes)
        gen = as_generator(rng)
        self.backbone = self.add_child("backbone", _Backbone(
            vocab, dim, depth, heads, max_len, attention, gen, causal=False, positional=positional,
            mlp_ratio=mlp_ratio, num_features=num_features, linformer_sharing=linformer_sharing,
            kernel_init=kernel_init, eps=eps, qk_norm=qk_norm, learn_scale=learn_scale, short_conv=short_conv,
            dtype=dtype))
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


class TwoTowerClassifier(EncoderClassifier):
    """Pairs of token sequences (B, 2, N) -> logits (B, C), as in the Long Range Arena's
    retrieval task: one encoder (shared weights; :class:`EncoderClassifier`'s backbone,
    mean-pooled over unmasked positions) gives u and v for the two sequences, and a head
    compares them:

    * ``head="concat"`` (the LRA head): [u, v, u * v, u - v] goes through
      Linear(4 dim, dim), GELU and Linear(dim, C);
    * ``head="cosine"`` (two classes): with z = u P (P: dim x dim, no bias), the logits are
      [0, a cos(z_u, z_v) + b] for a learned scale a (from 5) and offset b (from -2), a
      metric the encoder can be trained on with every pair of a batch
      (:meth:`forward_pairs`).

    The keyword arguments are :class:`EncoderClassifier`'s.

    Parameters
    ----------
    vocab, num_classes : int
    dim : int, optional
    head : {"concat", "cosine"}, optional
    rng : None, int or numpy.random.Generator, optional
    dtype : float32 or float64, optional
    **kwargs
        The encoder's options, as for :class:`EncoderClassifier`.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import TwoTowerClassifier
    >>> model = TwoTowerClassifier(16, dim=8, depth=1, heads=2, max_len=6, rng=0)
    >>> pairs = np.random.default_rng(0).integers(0, 16, (3, 2, 6))
    >>> model.forward(pairs, np.ones((3, 2, 6), bool)).shape
    (3, 2)
    >>> cosine = TwoTowerClassifier(16, dim=8, depth=1, heads=2, max_len=6, head="cosine", rng=0)
    >>> first, second = np.triu_indices(4, 1)       # every pair of 4 sequences
    >>> cosine.forward_pairs(pairs.reshape(6, 6)[:4], None, first, second).shape
    (6, 2)
    """

    HEADS = ("concat", "cosine")
    _cos = None  # the cosine head's last forward: the pairs' cosines

    def __init__(self, vocab: int, num_classes: int = 2, *, dim: int = 64, head: str = "concat", rng: RngLike = 0,
                 dtype=np.float32, **kwargs):
        if head not in self.HEADS:
            raise ValueError(f"head must be one of {', '.join(self.HEADS)}, got {head!r}")
        if head == "cosine" and num_classes != 2:
            raise ValueError(f"head='cosine' scores same/different: num_classes must be 2, got {num_classes}")
        gen = as_generator(rng)
        super().__init__(vocab, num_classes, dim=dim, rng=gen, dtype=dtype, **kwargs)
        self.head_kind = head
        if head == "concat":
            self.mix = self.add_child("mix", Linear(4 * dim, dim, gen, dtype=dtype))
            self.act = self.add_child("act", GELU())
        else:
            self.head = self.add_child("head", Linear(dim, dim, gen, bias=False, dtype=dtype))
            self.scale = self.add_param("scale", np.array([5.0, -2.0], dtype), kind="bias")

    def forward(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Logits (B, num_classes) for ids (B, 2, N); ``mask`` (B, 2, N) marks real tokens."""
        ids = np.asarray(ids)
        if ids.ndim != 3 or ids.shape[1] != 2:
            raise ValueError(f"ids must have shape (B, 2, N): two sequences per example, got {ids.shape}")
        B, _, N = ids.shape
        flat_mask = None if mask is None else np.asarray(mask).reshape(2 * B, N)
        pairs = np.arange(2 * B).reshape(B, 2)
        return self.forward_pairs(ids.reshape(2 * B, N), flat_mask, pairs[:, 0], pairs[:, 1])

    def forward_pairs(self, ids: np.ndarray, mask: Optional[np.ndarray], first: np.ndarray,
                      second: np.ndarray) -> np.ndarray:
        """Logits (P, num_classes) comparing sequence ``first[p]`` with ``second[p]`` of ids
        (M, N): each sequence is encoded once, however many pairs it is in."""
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"ids must have shape (M, N), got {ids.shape}")
        first, second = np.asarray(first), np.asarray(second)
        if first.shape != second.shape or first.ndim != 1:
            raise ValueError(f"first and second must be index vectors of one length, got shapes {first.shape} "
                             f"and {second.shape}")
        M = len(ids)
        if len(first) and (min(first.min(), second.min()) < 0 or max(first.max(), second.max()) >= M):
            raise ValueError(f"first and second must index the {M} sequences of ids (0 to {M - 1})")
        h = self.backbone.forward(ids, mask)
        w = np.ones(h.shape[:2], h.dtype) if mask is None else np.asarray(mask, h.dtype)
        self._w = w / np.maximum(w.sum(1, keepdims=True), 1)
        pooled = (h * self._w[..., None]).sum(1)
        self._first, self._second, self._M = first, second, M
        if self.head_kind == "concat":
            self._u, self._v = pooled[first], pooled[second]
            pair = np.concatenate([self._u, self._v, self._u * self._v, self._u - self._v], axis=-1)
            return self.head.forward(self.act.forward(self.mix.forward(pair)))
        z = self.head.forward(pooled)
        norm = np.sqrt((z * z).sum(1, keepdims=True) + np.asarray(1e-12, z.dtype))
        self._zhat, self._norm = z / norm, norm
        self._cos = (self._zhat[first] * self._zhat[second]).sum(1)
        a, b = self.scale.value
        return np.stack([np.zeros_like(self._cos), a * self._cos + b], axis=1)

    def _to_sequences(self, du: np.ndarray, dv: np.ndarray) -> np.ndarray:
        """The pairs' gradients (P, D) summed onto the M sequences they were taken from."""
        dseq = np.zeros((self._M, du.shape[-1]), du.dtype)
        np.add.at(dseq, self._first, du)
        np.add.at(dseq, self._second, dv)
        return dseq

    def backward(self, dlogits: np.ndarray) -> None:
        if self.head_kind == "concat":
            dpair = self.mix.backward(self.act.backward(self.head.backward(dlogits)))
            du_, dv_, dprod, ddiff = np.split(dpair, 4, axis=-1)
            dpooled = self._to_sequences(du_ + dprod * self._v + ddiff, dv_ + dprod * self._u - ddiff)
        else:
            dlogits = check_grad(dlogits, None if self._cos is None else (len(self._cos), 2), self.scale.value.dtype)
            g = dlogits[:, 1]  # the logits are [0, a cos + b]: the first is a constant
            a = self.scale.value[0]
            self.scale.grad += np.array([(g * self._cos).sum(), g.sum()], self.scale.grad.dtype)
            dcos, zhat = (g * a)[:, None], self._zhat
            dzhat = self._to_sequences(dcos * zhat[self._second], dcos * zhat[self._first])
            # through zhat = z / |z|, then z = pooled P
            dz = (dzhat - zhat * (dzhat * zhat).sum(1, keepdims=True)) / self._norm
            dpooled = self.head.backward(dz)
        self.backbone.backward(dpooled[:, None, :] * self._w[..., None])


class CausalLM(Module):
    """Tokens (B, N) -> next-token logits (B, N, vocab) with causal attention; the
    parameters are those of :class:`EncoderClassifier` (no Linformer, which has no
    causal mode).

    Parameters
    ----------
    vocab : int
    **options
        As for :class:`EncoderClassifier` (except ``linformer_sharing``).

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import CausalLM
    >>> lm = CausalLM(16, dim=8, depth=1, heads=2, max_len=32, rng=0, dtype=np.float64)
    >>> ids = np.array([[1, 2, 3, 4, 5]])
    >>> full = lm.forward(ids)
    >>> _, cache = lm.prefill(ids[:, :4])
    >>> bool(np.allclose(lm.step(ids[:, 4:], cache), full[:, 4:]))    # recurrent decoding
    True
    >>> len(lm.generate(np.array([1, 2]), 5, temperature=0))
    5
    """

    def __init__(self, vocab: int, *, dim: int = 64, depth: int = 2, heads: int = 4, max_len: int = 512,
                 attention: str = "flex_n", positional: str = "learned", mlp_ratio: int = 4,
                 num_features: Optional[int] = None, kernel_init: Optional[Dict[str, object]] = None,
                 eps: Optional[float] = None, qk_norm: bool = False, learn_scale: bool = False,
                 short_conv: int = 0, rng: RngLike = 0, dtype=np.float32):
        super().__init__()
        gen = as_generator(rng)
        self.backbone = self.add_child("backbone", _Backbone(
            vocab, dim, depth, heads, max_len, attention, gen, causal=True, positional=positional,
            mlp_ratio=mlp_ratio, num_features=num_features, linformer_sharing="none", kernel_init=kernel_init,
            eps=eps, qk_norm=qk_norm, learn_scale=learn_scale, short_conv=short_conv, dtype=dtype))
        self.head = self.add_child("head", Linear(dim, vocab, gen, dtype=dtype))

    def forward(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        return self.head.forward(self.backbone.forward(ids, mask))

    def backward(self, dlogits: np.ndarray) -> None:
        self.backbone.backward(self.head.backward(dlogits))

    # ------------------------------------------------------- recurrent decoding
    def prefill(self, ids: np.ndarray):
        """(logits (B, T, vocab), cache): the prompt ids (B, T) in one parallel pass per
        layer; the cache continues from there with :meth:`step`."""
        ids = _check_ids(ids, self.backbone.embed.vocab)
        h, cache = self.backbone.prefill(ids)
        return self.head.forward(h), cache

    def step(self, ids: np.ndarray, cache: DecodeCache) -> np.ndarray:
        """Logits (B, T, vocab) of T >= 1 further tokens (B, T); advances ``cache``."""
        ids = _check_ids(ids, self.backbone.embed.vocab)
        if ids.shape[1] < 1:
            raise ValueError(f"ids must hold at least one token (B, T >= 1), got shape {ids.shape}")
        if not isinstance(cache, DecodeCache):
            raise TypeError(f"cache must be a DecodeCache (the second value prefill returns), "
                            f"got {type(cache).__name__}")
        if len(cache.states) != len(self.backbone.blocks):
            raise ValueError(f"cache holds states for {len(cache.states)} layers, but this model has "
                             f"{len(self.backbone.blocks)}: a cache continues the model that made it")
        return self.head.forward(self.backbone.step(ids, cache))

    def generate(self, prompt: np.ndarray, num_tokens: int, *, temperature: float = 1.0,
                 top_k: Optional[int] = None, rng: RngLike = None,
                 on_token: Optional[Callable[[int], None]] = None) -> np.ndarray:
        """Sample ``num_tokens`` tokens after ``prompt`` (1-d ids) with the recurrent state.

        The prompt is processed in one parallel call per layer, then each new token costs
        the same whatever the context length (linear kinds). ``temperature`` 0 is greedy;
        ``top_k`` keeps the k most likely tokens; ``on_token(id)`` is called as each token
        is chosen (for streaming). Returns the new ids (num_tokens,)."""
        prompt = np.asarray(prompt)
        if prompt.ndim != 1 or prompt.size < 1:
            raise ValueError(f"prompt must be a non-empty 1-d array of token ids, got shape {prompt.shape}")
        num_tokens = check_int("num_tokens", num_tokens, 0)
        temperature, top_k = _check_sampling(temperature, top_k, self.head.W.value.shape[1])
        gen = as_generator(rng)
        logits, cache = self.prefill(prompt[None, :])
        out = []
        for i in range(num_tokens):
            token = _sample(logits[0, -1].astype(np.float64), temperature, top_k, gen)
            out.append(token)
            if on_token is not None:
                on_token(token)
            if i + 1 < num_tokens:
                logits = self.step(np.array([[token]]), cache)
        return np.array(out, dtype=np.int64)


def sample_token(logits: np.ndarray, temperature: float, top_k: Optional[int], rng: np.random.Generator) -> int:
    """One id from logits (vocab,): argmax when temperature is 0, else softmax(logits / T)
    restricted to the top_k largest.

    Parameters
    ----------
    logits : ndarray (vocab,)
    temperature : float
        0 for the most likely token.
    top_k : int or None
    rng : numpy.random.Generator

    Returns
    -------
    int

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import sample_token
    >>> sample_token(np.array([0.1, 2.0, 0.3]), 0.0, None, np.random.default_rng(0))
    1
    """
    z = np.asarray(logits)
    if z.dtype.kind not in "iuf" or z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be a non-empty 1-d array of real numbers, got {z.dtype} {z.shape}")
    temperature, top_k = _check_sampling(temperature, top_k, z.size)
    return _sample(z.astype(np.float64), temperature, top_k, as_generator(rng))


def _check_sampling(temperature, top_k, vocab: int):
    """generate's and sample_token's ``temperature`` (a finite number >= 0) and ``top_k``
    (None or an int in 1..vocab), as a float and None or an int."""
    temperature = check_positive("temperature", temperature, zero_ok=True)
    if top_k is not None and (isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, (int, np.integer))
                              or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be an int in 1..{vocab} or None, got {top_k!r}")
    return temperature, None if top_k is None else int(top_k)


def _sample(z: np.ndarray, temperature: float, top_k: Optional[int], rng: np.random.Generator) -> int:
    """sample_token's draw from float64 logits z, on arguments already checked (generate
    checks them once, not at every token)."""
    if temperature == 0:
        return int(np.argmax(z))
    if top_k is not None and top_k < z.size:
        cut = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= cut, z, -np.inf)
    # shift before dividing: a tiny temperature sends the others to -inf, never inf - inf
    with np.errstate(over="ignore"):
        z = (z - z.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    return int(rng.choice(z.size, p=p))


def _check_ids(ids, vocab: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 2-d integer array (B, T), got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"ids must lie in 0..{vocab - 1}")
    return ids
