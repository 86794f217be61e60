"""torch.nn versions of :mod:`flexformer.nn`, parameter for parameter.

Every module here has the NumPy model's parameter names, shapes and layout (``Linear.W``
is (in, out) as in NumPy, not torch's (out, in)), so ``model.state_dict()`` keys are the
NumPy model's ``parameters()`` names and checkpoints move both ways
(:func:`from_numpy_checkpoint`, :func:`save_numpy_checkpoint`). Attention runs through
:func:`flexformer.torch.attention` (C kernels on CPU, PyTorch elsewhere).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from ..nn.core import check_short_conv
from ..registry import get_attention
from .functional import attention

_GELU_C = math.sqrt(2.0 / math.pi)


class Linear(nn.Module):
    """y = x W + b with W (in, out), like flexformer.nn.Linear."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool = True, dtype=torch.float32):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d_in, d_out, dtype=dtype) / math.sqrt(d_in))
        self.b = nn.Parameter(torch.zeros(d_out, dtype=dtype)) if bias else None

    def forward(self, x):
        y = x @ self.W
        return y + self.b if self.b is not None else y


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, dtype=torch.float32):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        xc = x - mu
        return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + self.eps) * self.gamma + self.beta


class MLP(nn.Module):
    """Linear -> GELU (tanh form, as the NumPy layer) -> Linear."""

    def __init__(self, dim: int, hidden: int, dtype=torch.float32):
        super().__init__()
        self.fc1 = Linear(dim, hidden, dtype=dtype)
        self.fc2 = Linear(hidden, dim, dtype=dtype)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(0.5 * h * (1.0 + torch.tanh(_GELU_C * (h + 0.044715 * h ** 3))))


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int, dtype=torch.float32):
        super().__init__()
        self.W = nn.Parameter(torch.randn(vocab, dim, dtype=dtype) * 0.02)

    def forward(self, ids):
        return self.W[ids]


class PositionalEncoding(nn.Module):
    def __init__(self, max_len: int, dim: int, *, learned: bool = True, dtype=torch.float32):
        super().__init__()
        from ..nn.core import sinusoidal_positions

        self.max_len, self.learned = max_len, learned
        if learned:
            self.P = nn.Parameter(torch.randn(max_len, dim, dtype=dtype) * 0.02)
        else:
            self.register_buffer("table", torch.from_numpy(sinusoidal_positions(np.arange(max_len), dim)).to(dtype),
                                 persistent=False)

    def forward(self, x):
        N = x.shape[1]
        if N > self.max_len:
            raise ValueError(f"sequence length {N} exceeds the model's max_len {self.max_len}")
        return x + (self.P[:N] if self.learned else self.table[:N])


class KernelParams(nn.Module):
    """The attention kind's own parameters (names as in the registry); the ones the kind
    does not learn (rfa's and performer's omega) have requires_grad False."""

    def __init__(self, kind: str, values: Dict[str, np.ndarray]):
        super().__init__()
        spec = get_attention(kind)
        for name in spec.params:
            setattr(self, name, nn.Parameter(torch.from_numpy(np.array(values[name])),
                                             requires_grad=name in spec.learnable))

    def values(self) -> Dict[str, torch.Tensor]:
        return dict(self.named_parameters())


class ShortConv(nn.Module):
    """Causal depthwise convolution along the sequence, like flexformer.nn.ShortConv:
    y[:, t] = sum_{j < width} w[j] * x[:, t - j]; w (width, dim) starts as the identity."""

    def __init__(self, dim: int, width: int, dtype=torch.float32):
        super().__init__()
        w = torch.zeros(width, dim, dtype=dtype)
        w[0] = 1
        self.w = nn.Parameter(w)

    def forward(self, x):
        y = x * self.w[0]
        for j in range(1, min(self.w.shape[0], x.shape[1])):
            y = y + nn.functional.pad(x[:, :-j], (0, 0, j, 0)) * self.w[j]
        return y


class MultiHeadAttention(nn.Module):
    """Q/K/V/output projections around one attention kind (Linformer: per-head E and F
    only; its shared variants stay in the NumPy model), with the NumPy layer's optional
    short convolutions on queries, keys and values.

    Parameters
    ----------
    dim, num_heads : int
    attention_kind : str
    causal : bool, optional
    max_len : int, optional
        Linformer's Nmax.
    num_features : int, optional
    kernel_init : dict, optional
    rng : int, optional
    dtype : torch.dtype, optional

    Examples
    --------
    >>> import torch
    >>> from flexformer.torch import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 2, "flex_n", causal=True)
    >>> mha(torch.randn(2, 8, 16)).shape
    torch.Size([2, 8, 16])
    """

    def __init__(self, dim: int, num_heads: int, attention_kind: str, *, causal: bool = False, max_len: int = 512,
                 num_features: Optional[int] = None, kernel_init: Optional[dict] = None, rng=0,
                 dtype=torch.float32, backend: str = "auto", short_conv: int = 0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        check_short_conv(short_conv, integer_types=int)
        self.kind, self.heads, self.dh, self.causal, self.backend = attention_kind, num_heads, dim // num_heads, causal, backend
        for name in ("q", "k", "v", "o"):
            setattr(self, name, Linear(dim, dim, dtype=dtype))
        self.short_conv = short_conv
        if short_conv:
            for name in ("q", "k", "v"):
                setattr(self, "conv_" + name, ShortConv(dim, short_conv, dtype=dtype))
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        spec = get_attention(attention_kind)
        options = {k: v for k, v in (kernel_init or {}).items() if k in spec.init_options}
        init = spec.init(num_heads, self.dh, num_features=num_features, max_len=max_len, rng=rng, dtype=np_dtype,
                         **options)
        self.attn = KernelParams(attention_kind, init)

    def _split(self, x):
        B, N, _ = x.shape
        return x.reshape(B, N, self.heads, self.dh).transpose(1, 2)

    def _projection(self, name: str, x, key_mask):
        y = getattr(self, name)(x)
        if self.short_conv:
            if key_mask is not None:  # padding enters the window as zeros
                y = y * key_mask.to(y.dtype).unsqueeze(-1)
            y = getattr(self, "conv_" + name)(y)
        return self._split(y)

    def forward(self, x, key_mask=None):
        q, k, v = (self._projection(name, x, key_mask) for name in "qkv")
        out = attention(self.kind, q, k, v, self.attn.values(), causal=self.causal, key_mask=key_mask,
                        backend=self.backend)
        B, H, N, dh = out.shape
        return self.o(out.transpose(1, 2).reshape(B, N, H * dh))


class Block(nn.Module):
    """Pre-LN residual block, as flexformer.nn.Block."""

    def __init__(self, dim: int, num_heads: int, attention_kind: str, *, mlp_ratio: int = 4, dtype=torch.float32,
                 **kw):
        super().__init__()
        self.ln1 = LayerNorm(dim, dtype=dtype)
        self.attn = MultiHeadAttention(dim, num_heads, attention_kind, dtype=dtype, **kw)
        self.ln2 = LayerNorm(dim, dtype=dtype)
        self.mlp = MLP(dim, mlp_ratio * dim, dtype=dtype)

    def forward(self, x, key_mask=None):
        x = x + self.attn(self.ln1(x), key_mask)
        return x + self.mlp(self.ln2(x))


class Backbone(nn.Module):
    def __init__(self, vocab, dim, depth, heads, max_len, attention_kind, *, causal, positional, mlp_ratio,
                 num_features, dtype, backend, kernel_init=None, short_conv=0):
        super().__init__()
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        self.embed = Embedding(vocab, dim, dtype=dtype)
        self.pos = PositionalEncoding(max_len, dim, learned=positional == "learned", dtype=dtype)
        self.blocks = nn.ModuleList([Block(dim, heads, attention_kind, mlp_ratio=mlp_ratio, dtype=dtype, causal=causal,
                                           max_len=max_len, num_features=num_features, kernel_init=kernel_init, rng=i,
                                           backend=backend, short_conv=short_conv)
                                     for i in range(depth)])
        self.norm = LayerNorm(dim, dtype=dtype)

    def forward(self, ids, key_mask=None):
        x = self.pos(self.embed(ids))
        for block in self.blocks:
            x = block(x, key_mask)
        return self.norm(x)


class _Model(nn.Module):
    """Backbone + linear head; keyword arguments as flexformer.nn's models."""

    def __init__(self, vocab: int, out_dim: int, causal: bool, *, dim: int = 64, depth: int = 2, heads: int = 4,
                 max_len: int = 512, attention: str = "flex_n", positional: str = "learned", mlp_ratio: int = 4,
                 num_features: Optional[int] = None, kernel_init: Optional[dict] = None, dtype=torch.float32,
                 backend: str = "auto", short_conv: int = 0):
        super().__init__()
        self.backbone = Backbone(vocab, dim, depth, heads, max_len, attention, causal=causal, positional=positional,
                                 mlp_ratio=mlp_ratio, num_features=num_features, dtype=dtype, backend=backend,
                                 kernel_init=kernel_init, short_conv=short_conv)
        self.head = Linear(dim, out_dim, dtype=dtype)


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
        A Linformer configuration with shared projections.

    Examples
    --------
    >>> from flexformer.training import TrainConfig
    >>> from flexformer.torch.nn import model_for_config
    >>> model = model_for_config(TrainConfig(dim=16, heads=2, depth=1), vocab=16, num_classes=10, max_len=32)
    >>> type(model).__name__
    'EncoderClassifier'
    """
    if cfg.linformer_sharing != "none":
        raise ValueError("the torch models support Linformer with per-head projections only "
                         f"(linformer_sharing 'none'), got {cfg.linformer_sharing!r}")
    for option in ("qk_norm", "learn_scale"):
        if getattr(cfg, option, False):
            raise ValueError(f"the torch models have no {option} option; this configuration sets it")
    if getattr(cfg, "attention_eps", None) is not None:
        raise ValueError(f"the torch models use the default denominator guard; this configuration sets "
                         f"attention_eps {cfg.attention_eps}")
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    common = dict(dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, max_len=max_len, attention=cfg.attention,
                  positional=cfg.positional, num_features=cfg.num_features, kernel_init=cfg.kernel_init(),
                  short_conv=int(getattr(cfg, "short_conv", 0)), dtype=dtype, backend=backend)
    if cfg.task == "text-lm":
        return CausalLM(vocab, **common)
    if cfg.task == "retrieval":
        raise ValueError("the torch models have no two-tower classifier: train retrieval with "
                         "python -m flexformer train --task retrieval")
    return EncoderClassifier(vocab, num_classes, **common)


def load_numpy_parameters(model: nn.Module, params: Dict[str, np.ndarray]) -> None:
    """Copy NumPy parameters in by name; every parameter must be present with its shape.

    Parameters
    ----------
    model : torch.nn.Module
        A model of :mod:`flexformer.torch.nn`.
    params : dict of ndarray
        Under the NumPy model's names.

    Raises
    ------
    KeyError
        A parameter is missing.
    ValueError
        A shape differs.

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
    state = model.state_dict()
    missing = [n for n in state if n not in params]
    extra = [n for n in params if n not in state]
    if missing or extra:
        raise ValueError(f"parameter names differ: missing {missing[:5]}, unexpected {extra[:5]}")
    with torch.no_grad():
        for name, t in state.items():
            src = np.asarray(params[name])
            if tuple(src.shape) != tuple(t.shape):
                raise ValueError(f"parameter {name!r} has shape {tuple(t.shape)}, got {src.shape}")
            t.copy_(torch.from_numpy(np.array(src)))


def numpy_parameters(model: nn.Module) -> Dict[str, np.ndarray]:
    """The model's parameters as NumPy arrays under the NumPy model's names.

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
    >>> "head.W" in numpy_parameters(model)
    True
    """
    return {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}


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

__all__ = ["CausalLM", "EncoderClassifier", "MultiHeadAttention", "from_numpy_checkpoint", "load_numpy_parameters", "model_for_config", "numpy_parameters", "save_numpy_checkpoint"]
