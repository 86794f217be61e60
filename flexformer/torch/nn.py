"""torch.nn versions of :mod:`flexformer.nn`, following torch's conventions.

The layers are torch's own where torch has one (``nn.Linear`` with its (out, in) weight,
``nn.LayerNorm``, ``nn.Embedding``), take ``device=`` and ``dtype=`` as factory
arguments and have ``reset_parameters()``. :class:`MultiHeadAttention` is a drop-in
attention layer in the spirit of ``torch.nn.MultiheadAttention`` (batch first,
``forward(query, key=None, value=None, key_padding_mask=None)``, cross-attention
included) over any attention kind of the registry, through
:func:`flexformer.torch.attention` (the C kernels on CPU, PyTorch elsewhere).

The models mirror the NumPy models layer for layer, so a checkpoint moves both ways
(:func:`from_numpy_checkpoint`, :func:`save_numpy_checkpoint`): :func:`numpy_names` maps
each torch parameter to its NumPy name, transposing the linear layers' weights (NumPy's
``W`` is (in, out)) and renaming ``weight``/``bias`` to ``W``/``b`` (``gamma``/``beta``
for LayerNorm). Values cross unchanged, bit for bit, in float32 and float64.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .._checks import check_int, check_positive
from ..nn.attention import check_layer_options
from ..nn.core import check_short_conv
from ..registry import get_attention
from .functional import attention, check_backend


def _numpy_dtype(dtype) -> type:
    """The NumPy dtype an initialiser draws in (float64 for float64, else float32)."""
    return np.float64 if dtype == torch.float64 else np.float32


class Linear(nn.Linear):
    """``torch.nn.Linear`` (weight (out, in)) initialised as the NumPy layer: weight ~
    N(0, 1/in), bias 0."""

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, 1.0 / math.sqrt(self.in_features))
            if self.bias is not None:
                self.bias.zero_()


class Embedding(nn.Embedding):
    """``torch.nn.Embedding`` initialised as the NumPy layer: N(0, 0.02^2)."""

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, 0.02)


class MLP(nn.Module):
    """Linear -> GELU (tanh form, as the NumPy layer) -> Linear."""

    def __init__(self, dim: int, hidden: int, *, device=None, dtype=None):
        super().__init__()
        self.fc1 = Linear(dim, hidden, device=device, dtype=dtype)
        self.fc2 = Linear(hidden, dim, device=device, dtype=dtype)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x), approximate="tanh"))


class PositionalEncoding(nn.Module):
    """Adds a learned (max_len, dim) table ``P`` or the fixed sinusoidal one."""

    def __init__(self, max_len: int, dim: int, *, learned: bool = True, device=None, dtype=None):
        super().__init__()
        from ..nn.core import sinusoidal_positions

        self.max_len, self.learned = max_len, learned
        if learned:
            self.P = nn.Parameter(torch.empty(max_len, dim, device=device, dtype=dtype))
        else:
            table = torch.from_numpy(sinusoidal_positions(np.arange(max_len), dim))
            self.register_buffer("table", table.to(device=device, dtype=dtype or torch.get_default_dtype()),
                                 persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.learned:
            with torch.no_grad():
                self.P.normal_(0.0, 0.02)

    def forward(self, x):
        N = x.shape[1]
        if N > self.max_len:
            raise ValueError(f"sequence length {N} exceeds the model's max_len {self.max_len}")
        return x + (self.P[:N] if self.learned else self.table[:N])


class KernelParams(nn.Module):
    """The attention kind's own parameters (names as in the registry); the ones the kind
    does not learn (rfa's and performer's omega) have requires_grad False. Drawn by the
    kind's initialiser from the seed ``rng`` (in float32, or float64 for float64). With
    ``qk_norm`` or ``learn_scale`` also the per-head log length or log scale of queries and
    keys, ``qk_log_scale`` or ``log_scale`` (H,), as :class:`flexformer.nn.MultiHeadAttention`
    names and starts them. Linformer's ``sharing`` is :class:`flexformer.nn.MultiHeadAttention`'s
    ``linformer_sharing``: "headwise" keeps one (kp, Nmax) pair E, F for all heads, "key-value"
    one array E for both, "layerwise" that array shared by every layer (``shared`` holds it;
    the first layer's draw, as in NumPy)."""

    def __init__(self, kind: str, num_heads: int, head_dim: int, *, num_features: Optional[int] = None,
                 max_len: int = 512, kernel_init: Optional[dict] = None, rng: int = 0, qk_norm: bool = False,
                 learn_scale: bool = False, sharing: str = "none", shared: Optional[dict] = None, device=None,
                 dtype=None):
        super().__init__()
        self.kind, self._init_args = kind, (num_heads, head_dim, num_features, max_len, dict(kernel_init or {}), rng)
        spec = get_attention(kind)
        self.sharing = sharing if kind == "linformer" else "none"
        self._owns_shared = True
        for name in spec.params:
            if self.sharing in ("key-value", "layerwise") and name == "F":
                continue  # F is E
            if self.sharing == "layerwise" and shared is not None and "linformer" in shared:
                setattr(self, name, shared["linformer"])  # another layer's draw
                self._owns_shared = False
                continue
            setattr(self, name, nn.Parameter(torch.empty(0, device=device, dtype=dtype),
                                             requires_grad=name in spec.learnable))
            if self.sharing == "layerwise" and shared is not None:
                shared["linformer"] = getattr(self, name)
        self.qk_mode = "norm" if qk_norm else "scale" if learn_scale else None
        if self.qk_mode is not None:
            setattr(self, self._scale_name, nn.Parameter(torch.empty(num_heads, device=device, dtype=dtype)))
        self.reset_parameters()

    @property
    def _scale_name(self) -> str:
        return "qk_log_scale" if self.qk_mode == "norm" else "log_scale"

    def reset_parameters(self) -> None:
        spec = get_attention(self.kind)
        heads, head_dim, num_features, max_len, kernel_init, rng = self._init_args
        first = getattr(self, spec.params[0]) if spec.params else None
        options = {k: v for k, v in kernel_init.items() if k in spec.init_options}
        values = spec.init(heads, head_dim, num_features=num_features, max_len=max_len, rng=rng,
                           dtype=_numpy_dtype(first.dtype if first is not None else None), **options)
        for name in spec.params:
            if not self._owns_shared or (self.sharing in ("key-value", "layerwise") and name == "F"):
                continue  # another layer draws the shared array; F is E
            p = getattr(self, name)
            value = values[name][0] if self.sharing != "none" else values[name]  # one pair: the first head's
            p.data = torch.from_numpy(np.array(value)).to(device=p.device, dtype=p.dtype)
        if self.qk_mode is not None:  # |q'|^2 = head size at the start (norm); the identity (scale)
            with torch.no_grad():
                getattr(self, self._scale_name).fill_(0.5 * math.log(head_dim) if self.qk_mode == "norm" else 0.0)

    def values(self) -> Dict[str, torch.Tensor]:
        """The kind's parameters by name (what :func:`flexformer.torch.attention` takes)."""
        if self.sharing in ("key-value", "layerwise"):
            return {"E": self.E, "F": self.E}
        return {name: getattr(self, name) for name in get_attention(self.kind).params}

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Queries or keys (B, H, N, dh) as the kernel sees them: e^g x / |x| per head
        (qk_norm), e^g x (learn_scale), or x itself."""
        if self.qk_mode is None:
            return x
        gain = getattr(self, self._scale_name).exp().to(x.dtype).view(1, -1, 1, 1)
        if self.qk_mode == "scale":
            return x * gain
        norm = x.square().sum(-1, keepdim=True).sqrt().clamp_min(torch.finfo(x.dtype).tiny)
        return x * (gain / norm)


class ShortConv(nn.Module):
    """Causal depthwise convolution along the sequence, like flexformer.nn.ShortConv:
    y[:, t] = sum_{j < width} w[j] * x[:, t - j]; w (width, dim) starts as the identity."""

    def __init__(self, dim: int, width: int, *, device=None, dtype=None):
        super().__init__()
        self.w = nn.Parameter(torch.empty(width, dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.w.zero_()
            self.w[0] = 1

    def forward(self, x):
        y = x * self.w[0]
        for j in range(1, min(self.w.shape[0], x.shape[1])):
            y = y + nn.functional.pad(x[:, :-j], (0, 0, j, 0)) * self.w[j]
        return y


class MultiHeadAttention(nn.Module):
    """Multi-head attention over any attention kind, in the spirit of ``torch.nn.MultiheadAttention``.

    Query, key and value projections, the kind's attention per head, an output
    projection; batch first: inputs and output are (B, N, dim). With only ``query`` it is
    self-attention; ``key`` and ``value`` (B, Nk, dim) make it cross-attention (causal
    attention needs Nq == Nk). Unlike ``torch.nn.MultiheadAttention`` it returns the
    output alone: linear attention never forms the attention weights.

    Parameters
    ----------
    dim, num_heads : int
        Model width and heads (dim divisible by num_heads).
    attention_kind : str, optional
        A kind from ``flexformer.attention_kinds()`` (default ``"flex_n"``).
    causal : bool, optional
        Query i sees keys j <= i.
    max_len : int, optional
        Linformer's Nmax (the longest key sequence).
    num_features : int, optional
        m for the feature-map kinds, kp for Linformer.
    kernel_init : dict, optional
        The kind's initialisation options (``scale``, ``spread``, ...).
    rng : int, optional
        Seed of the kind's parameters.
    backend : {"auto", "c", "torch"}, optional
        As in :func:`flexformer.torch.attention`.
    short_conv : int, optional
        Width of causal depthwise convolutions on queries, keys and values (0: none).
    eps : float, optional
        The linear kinds' denominator guard (default :data:`flexformer.DEFAULT_EPS`);
        the kinds without one ignore it, as :class:`flexformer.nn.MultiHeadAttention` does.
    qk_norm, learn_scale : bool, optional
        Queries and keys at a learned length per head, or scaled by a learned factor per
        head, before the kernel: as in :class:`flexformer.nn.MultiHeadAttention` (not both).
    linformer_sharing : {"none", "headwise", "key-value", "layerwise"}, optional
        Linformer's projections, as in :class:`flexformer.nn.MultiHeadAttention`;
        "layerwise" shares the array held in ``shared`` (a dict the layers of one model
        pass around; the first layer fills it).
    device, dtype : optional
        Factory arguments, as torch's layers take them.

    Examples
    --------
    >>> import torch
    >>> from flexformer.torch import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 2, "flex_n", causal=True)
    >>> mha(torch.randn(2, 8, 16)).shape
    torch.Size([2, 8, 16])

    Cross-attention, with torch's padding mask (True marks keys to ignore):

    >>> cross = MultiHeadAttention(16, 2, "flex_s", dtype=torch.float64)
    >>> memory = torch.randn(2, 12, 16, dtype=torch.float64)
    >>> pad = torch.zeros(2, 12, dtype=torch.bool); pad[1, 9:] = True
    >>> cross(torch.randn(2, 5, 16, dtype=torch.float64), memory, memory, key_padding_mask=pad).shape
    torch.Size([2, 5, 16])
    """

    def __init__(self, dim: int, num_heads: int, attention_kind: str = "flex_n", *, causal: bool = False,
                 max_len: int = 512, num_features: Optional[int] = None, kernel_init: Optional[dict] = None,
                 rng: int = 0, backend: str = "auto", short_conv: int = 0, eps: Optional[float] = None,
                 qk_norm: bool = False, learn_scale: bool = False, linformer_sharing: str = "none",
                 shared: Optional[dict] = None, device=None, dtype=None):
        super().__init__()
        dim, num_heads = check_int("dim", dim), check_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        spec = get_attention(attention_kind)  # a ValueError naming the kinds, before any allocation
        eps = check_positive("eps", eps, optional=True)
        self.eps = eps if spec.key_state else None
        qk_norm, learn_scale, linformer_sharing = check_layer_options(qk_norm, learn_scale, linformer_sharing)
        check_backend(backend)
        check_short_conv(short_conv, integer_types=int)
        self.kind, self.heads, self.dh, self.causal, self.backend = attention_kind, num_heads, dim // num_heads, causal, backend
        factory = dict(device=device, dtype=dtype)
        for name in ("q", "k", "v", "o"):
            setattr(self, name, Linear(dim, dim, **factory))
        self.short_conv = short_conv
        if short_conv:
            for name in ("q", "k", "v"):
                setattr(self, "conv_" + name, ShortConv(dim, short_conv, **factory))
        self.attn = KernelParams(attention_kind, num_heads, self.dh, num_features=num_features, max_len=max_len,
                                 kernel_init=kernel_init, rng=rng, qk_norm=qk_norm, learn_scale=learn_scale,
                                 sharing=linformer_sharing, shared=shared, **factory)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def _split(self, x):
        B, N, _ = x.shape
        return x.reshape(B, N, self.heads, self.dh).transpose(1, 2)

    def _projection(self, name: str, x, mask):
        y = getattr(self, name)(x)
        if self.short_conv:
            if mask is not None:  # padding enters the window as zeros
                y = y * mask.to(y.dtype).unsqueeze(-1)
            y = getattr(self, "conv_" + name)(y)
        return self._split(y)

    def forward(self, query, key=None, value=None, key_padding_mask=None, *, key_mask=None):
        """Attention output (B, Nq, dim).

        Parameters
        ----------
        query : Tensor (B, Nq, dim)
        key, value : Tensor (B, Nk, dim), optional
            Default: ``query`` (self-attention); ``value`` defaults to ``key``.
        key_padding_mask : bool Tensor (B, Nk), optional
            torch's convention: True marks a key to ignore.
        key_mask : bool Tensor (B, Nk), optional
            flexformer's convention: True marks a key to attend to (give one of the two).
        """
        if key_padding_mask is not None and key_mask is not None:
            raise ValueError("give key_padding_mask (True = ignore) or key_mask (True = attend), not both")
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool:
                raise TypeError(f"key_padding_mask must be a bool tensor, got {key_padding_mask.dtype}")
            key_mask = ~key_padding_mask
        self_attention = key is None
        key = query if key is None else key
        value = key if value is None else value
        q = self.attn.normalise(self._projection("q", query, key_mask if self_attention else None))
        k = self.attn.normalise(self._projection("k", key, key_mask))
        v = self._projection("v", value, key_mask)
        out = attention(self.kind, q, k, v, self.attn.values(), causal=self.causal, key_mask=key_mask,
                        eps=self.eps, backend=self.backend)
        B, H, N, dh = out.shape
        return self.o(out.transpose(1, 2).reshape(B, N, H * dh))


class Block(nn.Module):
    """Pre-LN residual block, as flexformer.nn.Block."""

    def __init__(self, dim: int, num_heads: int, attention_kind: str, *, mlp_ratio: int = 4, device=None,
                 dtype=None, **kw):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.ln1 = nn.LayerNorm(dim, eps=1e-5, **factory)
        self.attn = MultiHeadAttention(dim, num_heads, attention_kind, **factory, **kw)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5, **factory)
        self.mlp = MLP(dim, mlp_ratio * dim, **factory)

    def forward(self, x, key_mask=None):
        x = x + self.attn(self.ln1(x), key_mask=key_mask)
        return x + self.mlp(self.ln2(x))


class Backbone(nn.Module):
    """Embedding, positions, pre-LN blocks and a final LayerNorm, as flexformer.nn's."""

    def __init__(self, vocab, dim, depth, heads, max_len, attention_kind, *, causal, positional, mlp_ratio,
                 num_features, backend, kernel_init=None, short_conv=0, eps=None, qk_norm=False, learn_scale=False,
                 linformer_sharing="none", device=None, dtype=None):
        super().__init__()
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        factory = dict(device=device, dtype=dtype)
        self.embed = Embedding(vocab, dim, **factory)
        self.pos = PositionalEncoding(max_len, dim, learned=positional == "learned", **factory)
        shared: dict = {}  # layerwise Linformer: the one projection every layer uses
        self.blocks = nn.ModuleList([Block(dim, heads, attention_kind, mlp_ratio=mlp_ratio, causal=causal,
                                           max_len=max_len, num_features=num_features, kernel_init=kernel_init, rng=i,
                                           backend=backend, short_conv=short_conv, eps=eps, qk_norm=qk_norm,
                                           learn_scale=learn_scale, linformer_sharing=linformer_sharing,
                                           shared=shared, **factory)
                                     for i in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-5, **factory)

    def forward(self, ids, key_mask=None):
        x = self.pos(self.embed(ids))
        for block in self.blocks:
            x = block(x, key_mask)
        return self.norm(x)


class _Model(nn.Module):
    """Backbone + linear head; keyword arguments as flexformer.nn's models."""

    def __init__(self, vocab: int, out_dim: int, causal: bool, *, dim: int = 64, depth: int = 2, heads: int = 4,
                 max_len: int = 512, attention: str = "flex_n", positional: str = "learned", mlp_ratio: int = 4,
                 num_features: Optional[int] = None, kernel_init: Optional[dict] = None, backend: str = "auto",
                 short_conv: int = 0, eps: Optional[float] = None, qk_norm: bool = False, learn_scale: bool = False,
                 linformer_sharing: str = "none", device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.backbone = Backbone(vocab, dim, depth, heads, max_len, attention, causal=causal, positional=positional,
                                 mlp_ratio=mlp_ratio, num_features=num_features, backend=backend,
                                 kernel_init=kernel_init, short_conv=short_conv, eps=eps, qk_norm=qk_norm,
                                 learn_scale=learn_scale, linformer_sharing=linformer_sharing, **factory)
        self.head = Linear(dim, out_dim, **factory)

    def reset_parameters(self) -> None:
        """Draw every parameter again, as a new model would (the kinds' parameters from
        the same seeds)."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()


class EncoderClassifier(_Model):
    """flexformer.nn.EncoderClassifier in torch: mean over unmasked positions, linear head.

    Parameters
    ----------
    vocab, num_classes : int
    **kw
        As for :class:`flexformer.nn.EncoderClassifier` (``dim``, ``depth``, ``heads``,
        ``max_len``, ``attention``, ...).

    Examples
    --------
    >>> import torch
    >>> from flexformer.torch import EncoderClassifier
    >>> model = EncoderClassifier(16, 3, dim=16, depth=1, heads=2, max_len=8)
    >>> ids = torch.randint(0, 16, (4, 8))
    >>> model(ids, torch.ones(4, 8, dtype=torch.bool)).shape
    torch.Size([4, 3])
    """

    def __init__(self, vocab: int, num_classes: int, **kw):
        super().__init__(vocab, num_classes, False, **kw)

    def forward(self, ids, mask=None):
        h = self.backbone(ids, mask)
        w = torch.ones(h.shape[:2], dtype=h.dtype, device=h.device) if mask is None else mask.to(h.dtype)
        w = w / w.sum(1, keepdim=True).clamp(min=1)
        return self.head((h * w.unsqueeze(-1)).sum(1))


class CausalLM(_Model):
    """flexformer.nn.CausalLM in torch: next-token logits (B, N, vocab).

    Parameters
    ----------
    vocab : int
    **kw
        As for :class:`flexformer.nn.CausalLM`.

    Examples
    --------
    >>> import torch
    >>> from flexformer.torch import CausalLM
    >>> lm = CausalLM(16, dim=16, depth=1, heads=2, max_len=8)
    >>> lm(torch.randint(0, 16, (2, 8))).shape
    torch.Size([2, 8, 16])
    """

    def __init__(self, vocab: int, **kw):
        super().__init__(vocab, vocab, True, **kw)

    def forward(self, ids, mask=None):
        return self.head(self.backbone(ids, mask))


# -------------------------------------------------------------- checkpoints

def model_for_config(cfg, vocab: int, num_classes: Optional[int], max_len: int, *, backend: str = "auto"):
    """The torch twin of the model a :class:`flexformer.training.TrainConfig` describes.

    Parameters
    ----------
    cfg : flexformer.training.TrainConfig
    vocab : int
    num_classes : int or None
        None for a language model.
    max_len : int
    backend : {"auto", "c", "torch"}, optional

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    ValueError
        A retrieval configuration (the torch models have no two-tower classifier).

    Examples
    --------
    >>> from flexformer.training import TrainConfig
    >>> from flexformer.torch.nn import model_for_config
    >>> model = model_for_config(TrainConfig(dim=16, heads=2, depth=1), vocab=16, num_classes=10, max_len=32)
    >>> type(model).__name__
    'EncoderClassifier'
    """
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    common = dict(dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, max_len=max_len, attention=cfg.attention,
                  positional=cfg.positional, num_features=cfg.num_features, kernel_init=cfg.kernel_init(),
                  short_conv=int(getattr(cfg, "short_conv", 0)), eps=getattr(cfg, "attention_eps", None),
                  qk_norm=bool(getattr(cfg, "qk_norm", False)), learn_scale=bool(getattr(cfg, "learn_scale", False)),
                  linformer_sharing=cfg.linformer_sharing, dtype=dtype, backend=backend)
    if cfg.task == "text-lm":
        return CausalLM(vocab, **common)
    if cfg.task == "retrieval":
        raise ValueError("the torch models have no two-tower classifier: train retrieval with "
                         "python -m flexformer train --task retrieval")
    return EncoderClassifier(vocab, num_classes, **common)


def numpy_names(model: nn.Module) -> Dict[str, Tuple[str, bool]]:
    """torch parameter name -> (NumPy parameter name, transposed) for a model of this module.

    Linear layers' ``weight`` (out, in) is NumPy's ``W`` (in, out), transposed, and ``bias``
    is ``b``; LayerNorm's ``weight`` and ``bias`` are ``gamma`` and ``beta``; an
    Embedding's ``weight`` is ``W``; every other parameter keeps its name.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    dict of str to (str, bool)

    Examples
    --------
    >>> from flexformer.torch import MultiHeadAttention
    >>> from flexformer.torch.nn import numpy_names
    >>> names = numpy_names(MultiHeadAttention(8, 2, "flex_s"))
    >>> names["q.weight"], names["q.bias"], names["attn.omega"]
    (('q.W', True), ('q.b', False), ('attn.omega', False))
    """
    names, seen = {}, set()
    for prefix, module in model.named_modules():
        dot = prefix + "." if prefix else ""
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # shared (layerwise Linformer): its first name, as named_parameters gives
                continue
            seen.add(id(p))
            if isinstance(module, nn.Linear):
                names[dot + pname] = (dot + {"weight": "W", "bias": "b"}[pname], pname == "weight")
            elif isinstance(module, nn.LayerNorm):
                names[dot + pname] = (dot + {"weight": "gamma", "bias": "beta"}[pname], False)
            elif isinstance(module, nn.Embedding):
                names[dot + pname] = (dot + "W", False)
            else:
                names[dot + pname] = (dot + pname, False)
    return names


def load_numpy_parameters(model: nn.Module, params: Dict[str, np.ndarray]) -> None:
    """Copy NumPy parameters in by name; every parameter must be present with its shape.

    Parameters
    ----------
    model : torch.nn.Module
        A model of :mod:`flexformer.torch.nn`.
    params : dict of ndarray
        Under the NumPy model's names and layouts (:func:`numpy_names`).

    Raises
    ------
    ValueError
        A name is missing or unexpected, or a shape differs.

    Examples
    --------
    >>> import os, tempfile, numpy as np, flexformer as ff
    >>> from flexformer.training import TrainConfig, train
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1), run,
    ...           progress=False)
    >>> from flexformer.torch import from_numpy_checkpoint, load_numpy_parameters, numpy_parameters
    >>> model, cfg = from_numpy_checkpoint(run)
    >>> params = {n: np.zeros_like(p) for n, p in numpy_parameters(model).items()}
    >>> load_numpy_parameters(model, params)
    >>> float(sum(abs(p).sum() for p in numpy_parameters(model).values()))
    0.0
    """
    names = numpy_names(model)
    expected = {np_name for np_name, _ in names.values()}
    missing = sorted(expected - set(params))
    extra = sorted(set(params) - expected)
    if missing or extra:
        raise ValueError(f"parameter names differ: missing {missing[:5]}, unexpected {extra[:5]}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            np_name, transposed = names[name]
            src = np.asarray(params[np_name])
            src = src.T if transposed else src
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"parameter {np_name!r} has shape {tuple(src.T.shape if transposed else src.shape)} "
                                 f"in NumPy's layout; the model needs {tuple(p.T.shape if transposed else p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(src)))


def numpy_parameters(model: nn.Module) -> Dict[str, np.ndarray]:
    """The model's parameters as NumPy arrays under the NumPy model's names and layouts
    (:func:`numpy_names`); bfloat16 and float16 parameters come out as float32.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    dict of str to ndarray

    Examples
    --------
    >>> import os, tempfile, numpy as np, flexformer as ff
    >>> from flexformer.training import TrainConfig, train
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1), run,
    ...           progress=False)
    >>> from flexformer.torch import from_numpy_checkpoint, numpy_parameters
    >>> model, cfg = from_numpy_checkpoint(run)
    >>> numpy_parameters(model)["head.W"].shape, tuple(model.head.weight.shape)
    ((16, 10), (10, 16))
    """
    names = numpy_names(model)
    out = {}
    for name, p in model.named_parameters():
        np_name, transposed = names[name]
        value = p.detach()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        value = value.cpu().numpy()
        out[np_name] = np.ascontiguousarray(value.T if transposed else value).copy()
    return out


def from_numpy_checkpoint(path: str, *, backend: str = "auto"):
    """(torch model, TrainConfig) from a run folder or checkpoint.npz of ``python -m flexformer train``.

    Parameters
    ----------
    path : str
        A run folder or its ``checkpoint.npz``.
    backend : {"auto", "c", "torch"}, optional
        The attention backend of the model's layers.

    Returns
    -------
    model : torch.nn.Module
    cfg : TrainConfig

    Examples
    --------
    >>> import os, tempfile, numpy as np, flexformer as ff
    >>> from flexformer.training import TrainConfig, train
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1), run,
    ...           progress=False)
    >>> from flexformer.torch import from_numpy_checkpoint, numpy_parameters
    >>> model, cfg = from_numpy_checkpoint(run)
    >>> saved = ff.training.load_checkpoint(run + "/checkpoint.npz")[0]
    >>> all(np.array_equal(saved[n], p) for n, p in numpy_parameters(model).items())
    True
    """
    from ..training import load_model

    np_model, cfg, _ = load_model(path)
    params = np_model.parameters()
    vocab = params["backbone.embed.W"].shape[0]
    classes = params["head.W"].shape[1]
    max_len = np_model.backbone.pos.max_len
    model = model_for_config(cfg, vocab, None if cfg.task == "text-lm" else classes, max_len, backend=backend)
    load_numpy_parameters(model, params)
    return model, cfg


def save_numpy_checkpoint(model: nn.Module, cfg, path: str, *, step: int = 0) -> None:
    """Write the torch model as a NumPy checkpoint (no optimiser state) that
    :func:`flexformer.training.load_model` and ``python -m flexformer generate`` read.

    Parameters
    ----------
    model : torch.nn.Module
    cfg : TrainConfig
    path : str
    step : int, optional

    Examples
    --------
    >>> import os, tempfile, numpy as np, flexformer as ff
    >>> from flexformer.training import TrainConfig, train
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1), run,
    ...           progress=False)
    >>> from flexformer.torch import from_numpy_checkpoint, save_numpy_checkpoint
    >>> model, cfg = from_numpy_checkpoint(run)
    >>> out = os.path.join(tempfile.mkdtemp(), "checkpoint.npz")
    >>> save_numpy_checkpoint(model, cfg, out, step=2)
    >>> ff.training.load_model(out)[1] == cfg
    True
    """
    from ..training import checkpoint

    checkpoint.save(path, numpy_parameters(model), {}, {"step": int(step), "config": dataclasses.asdict(cfg)})

__all__ = ["CausalLM", "EncoderClassifier", "MultiHeadAttention", "from_numpy_checkpoint", "load_numpy_parameters",
           "model_for_config", "numpy_names", "numpy_parameters", "save_numpy_checkpoint"]
