"""Parameters, modules and the dense layers, with hand-written backward passes in NumPy.

A layer's ``forward`` keeps what its ``backward`` needs; ``backward(dy)`` returns the
gradient for the layer's input and adds the parameter gradients into ``Parameter.grad``.
A module used twice in one forward pass would overwrite that cache: build one module per
use and share a :class:`Parameter` object instead (that is how Linformer's layerwise
sharing works).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from .._checks import check_float_dtype, check_int, native
from ..init import RngLike, as_generator
from ..runtime import _C


# ------------------------------------------------------------------ argument checks
def check_input(name: str, x, width: int, dtype, *, ndim: Optional[int] = None,
                layout: str = "(..., width)") -> np.ndarray:
    """``x`` as an array of the layer's ``dtype`` whose last axis has ``width`` entries (and
    ``ndim`` axes when given): a list or tuple is converted to ``dtype``; an array of
    another dtype is a TypeError and another shape a ValueError, both naming ``name``."""
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x, dtype=dtype)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an array of {np.dtype(dtype)}; NumPy could not convert "
                            f"this {type(x).__name__}") from None
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array {layout}, got {type(x).__name__}")
    x = native(x)
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the layer's dtype {np.dtype(dtype)}, got {x.dtype}")
    if (ndim is not None and x.ndim != ndim) or x.ndim == 0 or x.shape[-1] != width:
        symbol = layout.strip("()").split(",")[-1].strip()
        raise ValueError(f"{name} must have shape {layout} with {symbol} = {width}, got {x.shape}")
    return x


def check_grad(dy, shape: Optional[tuple], dtype) -> np.ndarray:
    """``dy`` for a backward: RuntimeError before any forward (``shape`` None), ValueError
    unless it has the last forward output's ``shape``; converted to the layer's dtype."""
    if shape is None:
        raise RuntimeError("backward needs a forward call first: it differentiates the last forward")
    dy = np.asarray(dy, dtype=dtype)
    if dy.shape != tuple(shape):
        raise ValueError(f"dy must have the shape of the last forward's output, {tuple(shape)}, got {dy.shape}")
    return dy


class Parameter:
    """An array with its gradient. ``kind`` ("weight", "bias", "norm", "embedding" or
    "kernel" for attention-kind parameters) lets the optimiser choose weight decay;
    a fixed array (Performer's or RFA's frequencies) has ``grad`` None and is not trained.

    Parameters
    ----------
    value : ndarray
        The array (kept, not copied).
    kind : {"weight", "bias", "norm", "embedding", "kernel"}, optional
    trainable : bool, optional
        False for fixed arrays (``grad`` stays None).

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import Parameter
    >>> p = Parameter(np.zeros(3), kind="bias")
    >>> p.grad.shape, p.kind
    ((3,), 'bias')
    """

    __slots__ = ("value", "grad", "kind")

    def __init__(self, value: np.ndarray, *, kind: str = "weight", trainable: bool = True):
        self.value = np.ascontiguousarray(value)
        self.grad = np.zeros_like(self.value) if trainable else None
        self.kind = kind


class Module:
    """A container of parameters and child modules with dotted names.

    Subclasses register :class:`Parameter` attributes and child modules; the methods
    collect them under dotted names.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import MLP
    >>> mlp = MLP(8, 32, np.random.default_rng(0))
    >>> sorted(mlp.parameters())
    ['fc1.W', 'fc1.b', 'fc2.W', 'fc2.b']
    >>> mlp.num_parameters()
    552
    """

    def __init__(self) -> None:
        self._params: Dict[str, Parameter] = {}
        self._children: Dict[str, "Module"] = {}

    def add_param(self, name: str, value, *, kind: str = "weight", trainable: bool = True) -> Parameter:
        """Register ``value`` (an array, or a Parameter to share) under ``name``."""
        p = value if isinstance(value, Parameter) else Parameter(value, kind=kind, trainable=trainable)
        self._params[name] = p
        return p

    def add_child(self, name: str, module: "Module") -> "Module":
        self._children[name] = module
        return module

    def named_parameters(self, prefix: str = "") -> List[Tuple[str, Parameter]]:
        """(name, Parameter) pairs, each shared Parameter once (under its first name)."""
        seen, out = set(), []
        for name, p in self._iter_params(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
        return out

    def _iter_params(self, prefix: str) -> Iterator[Tuple[str, Parameter]]:
        for name, p in self._params.items():
            yield prefix + name, p
        for name, child in self._children.items():
            yield from child._iter_params(prefix + name + ".")

    def parameters(self) -> Dict[str, np.ndarray]:
        """Parameter values by dotted name."""
        return {name: p.value for name, p in self.named_parameters()}

    def gradients(self) -> Dict[str, np.ndarray]:
        """Gradients of the trainable parameters by dotted name."""
        return {name: p.grad for name, p in self.named_parameters() if p.grad is not None}

    def zero_grad(self) -> None:
        for _, p in self.named_parameters():
            if p.grad is not None:
                p.grad[...] = 0

    def num_parameters(self) -> int:
        return int(sum(p.value.size for _, p in self.named_parameters()))

    def load_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        """Copy values in by name, as :meth:`parameters` gives them: every parameter present
        with its shape, and no other name. Checks them all before copying any, so a refused
        load leaves the model as it was.

        Raises
        ------
        TypeError
            ``values`` is not a mapping, or a value is not an array of real numbers.
        KeyError
            A parameter is missing.
        ValueError
            A value has another shape, or ``values`` holds a name this model does not have.
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping of parameter name to array (as parameters() gives), "
                            f"got {type(values).__name__}")
        named = self.named_parameters()
        arrays = []
        for name, p in named:
            if name not in values:
                raise KeyError(f"missing parameter {name!r}")
            v = np.asarray(values[name])
            if v.dtype.kind not in "biuf":
                raise TypeError(f"parameter {name!r} must be an array of real numbers, got dtype {v.dtype}")
            if v.shape != p.value.shape:
                raise ValueError(f"parameter {name!r} has shape {p.value.shape}, got {v.shape}")
            arrays.append(v)
        unknown = sorted(set(values) - {name for name, _ in named})
        if unknown:
            raise ValueError(f"values holds names this model does not have: {', '.join(map(repr, unknown[:5]))}"
                             f"{' ...' if len(unknown) > 5 else ''}")
        for (_, p), v in zip(named, arrays):
            p.value[...] = v


class Linear(Module):
    """y = x W + b with W (in, out).

    Parameters
    ----------
    d_in, d_out : int
    rng : None, int or numpy.random.Generator
        Draws W from N(0, scale^2), scale = 1/sqrt(d_in) by default.
    bias : bool, optional
    dtype : float32 or float64, optional
    scale : float, optional

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import Linear
    >>> layer = Linear(4, 3, rng)
    >>> x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    >>> y = layer.forward(x)
    >>> bool(np.allclose(y, x @ layer.W.value + layer.b.value))
    True
    >>> layer.backward(np.ones_like(y)).shape
    (2, 5, 4)
    """

    def __init__(self, d_in: int, d_out: int, rng: RngLike, *, bias: bool = True,
                 dtype=np.float32, scale: Optional[float] = None):
        super().__init__()
        d_in, d_out, dtype = check_int("d_in", d_in), check_int("d_out", d_out), check_float_dtype(dtype)
        scale = 1.0 / np.sqrt(d_in) if scale is None else scale
        self.W = self.add_param("W", (as_generator(rng).standard_normal((d_in, d_out)) * scale).astype(dtype))
        self.b = self.add_param("b", np.zeros(d_out, dtype), kind="bias") if bias else None
        self._x = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        W = self.W.value
        if not (type(x) is np.ndarray and x.dtype == W.dtype and x.ndim and x.shape[-1] == W.shape[0]):
            x = check_input("x", x, W.shape[0], W.dtype, layout="(..., d_in)")
        self._x = x
        y = x @ W
        if self.b is not None:
            y += self.b.value  # in place: a second activation-sized array costs as much as the add
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        W = self.W.value
        dy = check_grad(dy, None if self._x is None else self._x.shape[:-1] + W.shape[1:], W.dtype)
        x2 = self._x.reshape(-1, self._x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        self.W.grad += x2.T @ dy2
        if self.b is not None:
            # the column sums as a product with ones: BLAS, several times faster than .sum(0)
            self.b.grad += np.ones(len(dy2), dy2.dtype) @ dy2
        return dy @ self.W.value.T


class LayerNorm(Module):
    """Normalise the last axis, then scale and shift.

    Parameters
    ----------
    dim : int
    eps : float, optional
    dtype : float32 or float64, optional

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import LayerNorm
    >>> y = LayerNorm(4, dtype=np.float64).forward(np.array([[1.0, 2.0, 3.0, 4.0]]))
    >>> bool(abs(y.mean()) < 1e-12), bool(abs(y.std() - 1) < 1e-4)
    (True, True)
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, dtype=np.float32):
        super().__init__()
        dim, dtype = check_int("dim", dim), check_float_dtype(dtype)
        self.eps = eps
        self.gamma = self.add_param("gamma", np.ones(dim, dtype), kind="norm")
        self.beta = self.add_param("beta", np.zeros(dim, dtype), kind="norm")
        self._shape = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        # one C pass over the rows (``layer_norm_forward``); :func:`layer_norm_reference` is
        # the NumPy twin
        gamma = self.gamma.value
        x = check_input("x", x, gamma.shape[0], gamma.dtype, layout="(..., dim)")
        dim = x.shape[-1]
        y, self._xhat, self._inv = _C.layer_norm_forward(np.ascontiguousarray(x).reshape(-1, dim),
                                                         gamma, self.beta.value, self.eps)
        self._shape = x.shape
        return y.reshape(x.shape)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dy = check_grad(dy, self._shape, self.gamma.value.dtype)
        dim = self._xhat.shape[-1]
        dx, dgamma, dbeta = _C.layer_norm_backward(
            np.ascontiguousarray(dy).reshape(-1, dim), self._xhat, self._inv, self.gamma.value)
        self.gamma.grad += dgamma
        self.beta.grad += dbeta
        return dx.reshape(dy.shape)


def layer_norm_reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5,
                         dy: Optional[np.ndarray] = None):
    """LayerNorm over the last axis in NumPy: y, or (y, dx, dgamma, dbeta) given ``dy``; the
    twin of the C kernels."""
    mu = x.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) * inv
    y = xhat * gamma + beta
    if dy is None:
        return y
    g = dy * gamma
    dx = inv * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    rows = dy.reshape(-1, dy.shape[-1])
    return y, dx, (rows * xhat.reshape(rows.shape)).sum(0), rows.sum(0)


_GELU_C = float(np.sqrt(2.0 / np.pi))  # a Python float keeps float32 arrays float32


class GELU(Module):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    One C pass per direction (``gelu_forward`` / ``gelu_backward`` in the extension): this
    layer runs on the model's widest activations (batch x sequence x 4 dim), where NumPy
    took eight to eleven passes over memory. :func:`gelu_reference` is the NumPy twin.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import GELU
    >>> y = GELU().forward(np.array([-1.0, 0.0, 1.0]))
    >>> np.round(y, 4)
    array([-0.1588,  0.    ,  0.8412])
    """

    _x = None  # the last forward's input

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._x = np.ascontiguousarray(x)
        y, self._w = _C.gelu_forward(self._x.reshape(-1))
        return y.reshape(self._x.shape)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dy = check_grad(dy, None if self._x is None else self._x.shape, None if self._x is None else self._x.dtype)
        dx = _C.gelu_backward(np.ascontiguousarray(dy).reshape(-1), self._x.reshape(-1), self._w)
        return dx.reshape(self._x.shape)


def gelu_reference(x: np.ndarray, dy: Optional[np.ndarray] = None):
    """GELU (tanh form) in NumPy: y, or (y, dx) given ``dy``; the twin of the C kernels."""
    t = np.tanh(_GELU_C * (x + 0.044715 * (x * x * x)))
    y = 0.5 * x * (1.0 + t)
    if dy is None:
        return y
    return y, dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x))


class MLP(Module):
    """Linear -> GELU -> Linear.

    Parameters
    ----------
    dim, hidden : int
        Input and output width, and the hidden width.
    rng : None, int or numpy.random.Generator
    dtype : float32 or float64, optional

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import MLP
    >>> mlp = MLP(8, 32, rng)
    >>> mlp.forward(np.ones((2, 3, 8), np.float32)).shape
    (2, 3, 8)
    """

    def __init__(self, dim: int, hidden: int, rng: RngLike, *, dtype=np.float32):
        super().__init__()
        rng = as_generator(rng)
        self.fc1 = self.add_child("fc1", Linear(dim, hidden, rng, dtype=dtype))
        self.act = GELU()
        self.fc2 = self.add_child("fc2", Linear(hidden, dim, rng, dtype=dtype))

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.fc2.forward(self.act.forward(self.fc1.forward(x)))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return self.fc1.backward(self.act.backward(self.fc2.backward(dy)))


class ShortConv(Module):
    """Causal depthwise convolution along the sequence (a "short convolution"):
    y[:, t] = sum_{j < width} w[j] * x[:, t - j], with x before the start taken as zero.

    w (width, dim) starts as the identity (w[0] = 1, the rest 0), so a model with the
    convolution starts as the model without it. Each position mixes in the width - 1
    positions before it, channel by channel: a cheap local window that a linear attention
    kernel, which cannot attend sharply to the last few tokens, gains from (as in Based,
    Arora et al. 2024, and the short convolutions of H3 and Mamba).

    One C pass per direction (``short_conv_forward`` / ``short_conv_backward`` in the
    extension); :func:`short_conv_reference` is the NumPy twin. ``forward(x, tail)``
    continues a sequence: ``tail`` (B, width - 1, dim) holds the inputs of the width - 1
    positions before x (recurrent decoding); :meth:`next_tail` gives the tail after x.

    Parameters
    ----------
    dim, width : int
        Channels and taps; width >= 2.
    dtype : float32 or float64, optional

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import ShortConv
    >>> conv = ShortConv(3, 4, dtype=np.float64)
    >>> x = np.random.default_rng(0).standard_normal((1, 6, 3))
    >>> bool(np.array_equal(conv.forward(x), x))      # the identity at the start
    True
    """

    def __init__(self, dim: int, width: int, *, dtype=np.float32):
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 2:
            raise ValueError(f"width must be an int >= 2, got {width!r}")
        self.width = int(width)
        w = np.zeros((self.width, check_int("dim", dim)), check_float_dtype(dtype))
        w[0] = 1
        self.w = self.add_param("w", w)

    _x = None  # the last forward's input

    def _check_tail(self, tail, batch: int) -> np.ndarray:
        w = self.w.value
        tail = check_input("tail", tail, w.shape[1], w.dtype, ndim=3, layout="(B, width - 1, dim)")
        if tail.shape[:2] != (batch, self.width - 1):
            raise ValueError(f"tail must have shape (B, width - 1, dim) = ({batch}, {self.width - 1}, {w.shape[1]}), "
                             f"got {tail.shape}")
        return tail

    def forward(self, x: np.ndarray, tail: Optional[np.ndarray] = None) -> np.ndarray:
        w = self.w.value
        x = check_input("x", x, w.shape[1], w.dtype, ndim=3, layout="(B, N, dim)")
        if tail is not None:
            tail = self._check_tail(tail, x.shape[0])
            full = np.concatenate([tail, x], axis=1)
            return _C.short_conv_forward(full, self.w.value)[:, tail.shape[1]:]
        self._x = np.ascontiguousarray(x)
        return _C.short_conv_forward(self._x, self.w.value)

    def next_tail(self, x: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """The last width - 1 inputs after appending x (B, T, dim) to ``tail``."""
        w = self.w.value
        x = check_input("x", x, w.shape[1], w.dtype, ndim=3, layout="(B, T, dim)")
        tail = self._check_tail(tail, x.shape[0])
        return np.concatenate([tail, x], axis=1)[:, -(self.width - 1):].copy()

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dy = check_grad(dy, None if self._x is None else self._x.shape, self.w.value.dtype)
        dx, dw = _C.short_conv_backward(np.ascontiguousarray(dy), self._x, self.w.value)
        self.w.grad += dw
        return dx


def check_short_conv(value, integer_types=(int, np.integer)) -> int:
    """The ``short_conv`` option: 0 (none) or a convolution width >= 2 of one of
    ``integer_types`` (bool excluded), returned as an int; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, integer_types) or value < 0 or value == 1:
        raise ValueError(f"short_conv must be 0 (off) or a width >= 2, got {value!r}")
    return int(value)


def short_conv_reference(x: np.ndarray, w: np.ndarray, dy: Optional[np.ndarray] = None):
    """The short convolution in NumPy: y for x (B, N, C) and taps w (W, C), or (y, dx, dw)
    given ``dy``; the twin of the C kernels."""
    N = x.shape[1]
    y = x * w[0]
    for j in range(1, min(len(w), N)):
        y[:, j:] += x[:, :-j] * w[j]
    if dy is None:
        return y
    dx = dy * w[0]
    dw = np.zeros_like(w)
    dw[0] = np.einsum("bnc,bnc->c", dy, x)
    for j in range(1, min(len(w), N)):
        dw[j] = np.einsum("bnc,bnc->c", dy[:, j:], x[:, :-j])
        dx[:, :-j] += dy[:, j:] * w[j]
    return y, dx, dw


class Embedding(Module):
    """Token ids (B, N) -> vectors (B, N, dim).

    Parameters
    ----------
    vocab, dim : int
    rng : None, int or numpy.random.Generator
    dtype : float32 or float64, optional

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import Embedding
    >>> emb = Embedding(10, 4, rng)
    >>> emb.forward(np.array([[1, 2, 3]])).shape
    (1, 3, 4)
    """

    def __init__(self, vocab: int, dim: int, rng: RngLike, *, dtype=np.float32):
        super().__init__()
        self.vocab = vocab = check_int("vocab", vocab)
        shape, dtype = (vocab, check_int("dim", dim)), check_float_dtype(dtype)
        self.W = self.add_param("W", (as_generator(rng).standard_normal(shape) * 0.02).astype(dtype),
                                kind="embedding")
        self._ids = None

    def forward(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"token ids must be an integer array, got dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise ValueError(f"token ids must be in [0, {self.vocab}), got values in "
                             f"[{ids.min()}, {ids.max()}]")
        self._ids = ids
        return self.W.value[ids]

    def backward(self, dy: np.ndarray) -> None:
        # rows of dy summed per token id: sort the ids (stably, so each id's rows keep their
        # order) and add runs with reduceat; np.add.at does the same one row at a time
        W = self.W.value
        dy = check_grad(dy, None if self._ids is None else self._ids.shape + W.shape[1:], W.dtype)
        ids = self._ids.reshape(-1)
        rows = dy.reshape(-1, dy.shape[-1])
        if ids.size == 0:
            return None
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        self.W.grad[sorted_ids[starts]] += np.add.reduceat(rows[order], starts, axis=0)
        return None


def sinusoidal_positions(positions: np.ndarray, dim: int) -> np.ndarray:
    """The fixed sin/cos encodings (Vaswani et al.) of the given positions: (len, dim)."""
    pos = positions[:, None].astype(np.float64)
    freq = np.exp(-np.log(10000.0) * (np.arange(0, dim, 2) / dim))
    table = np.zeros((len(positions), dim))
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: dim // 2])
    return table


class PositionalEncoding(Module):
    """Adds a learned (max_len, dim) table or the fixed sinusoidal one (Vaswani et al.).

    Parameters
    ----------
    max_len, dim : int
    rng : None, int or numpy.random.Generator
    learned : bool, optional
        A learned table (default) or the fixed sinusoidal one, which extends past max_len.
    dtype : float32 or float64, optional

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from flexformer.nn import PositionalEncoding
    >>> pos = PositionalEncoding(16, 4, rng, learned=False)
    >>> x = np.zeros((1, 3, 4), np.float32)
    >>> bool(np.array_equal(pos.forward(x, offset=2)[0, 0], pos.forward(np.zeros((1, 5, 4), np.float32))[0, 2]))
    True
    """

    def __init__(self, max_len: int, dim: int, rng: RngLike, *, learned: bool = True,
                 dtype=np.float32):
        super().__init__()
        max_len, dim, dtype = check_int("max_len", max_len), check_int("dim", dim), check_float_dtype(dtype)
        self.max_len, self.learned, self.dim, self.dtype = max_len, learned, dim, dtype
        if learned:
            self.P = self.add_param("P", (as_generator(rng).standard_normal((max_len, dim)) * 0.02).astype(dtype),
                                    kind="embedding")
        else:
            self.table = sinusoidal_positions(np.arange(max_len), dim).astype(dtype)
        self._shape = None

    def forward(self, x: np.ndarray, offset: int = 0) -> np.ndarray:
        """x (B, N, dim) plus the encodings of positions offset .. offset + N - 1.

        Learned positions stop at max_len; sinusoidal ones extend past it (recurrent
        decoding of long contexts)."""
        x = check_input("x", x, self.dim, self.dtype, ndim=3, layout="(B, N, dim)")
        offset = check_int("offset", offset, 0)
        N = x.shape[1]
        end = offset + N
        if end > self.max_len:
            if self.learned:
                raise ValueError(f"position {end - 1} is past the model's max_len {self.max_len} (learned "
                                 f"positions exist for 0..{self.max_len - 1}); use a shorter context or a model "
                                 f"with sinusoidal positions")
            self._N, self._shape, self._offset = N, x.shape, offset
            return x + sinusoidal_positions(np.arange(offset, end), x.shape[-1]).astype(x.dtype)
        self._N, self._shape, self._offset = N, x.shape, offset
        return x + (self.P.value[offset:end] if self.learned else self.table[offset:end])

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dy = check_grad(dy, self._shape, self.dtype)
        if self.learned:
            self.P.grad[self._offset: self._offset + self._N] += dy.sum(0)
        return dy


def cross_entropy(logits: np.ndarray, targets: np.ndarray,
                  weights: Optional[np.ndarray] = None) -> Tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over rows (optionally weighted, e.g. by a mask) and its
    gradient with respect to the logits.

    Parameters
    ----------
    logits : ndarray (..., C)
    targets : ndarray of int (...)
    weights : ndarray (...), optional
        Per-row weights (0 drops a row).

    Returns
    -------
    loss : float
    dlogits : ndarray
        Same shape as ``logits``.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import cross_entropy
    >>> loss, dlogits = cross_entropy(np.zeros((2, 4)), np.array([0, 3]))
    >>> round(loss, 4), dlogits.shape
    (1.3863, (2, 4))
    """
    logits, targets = np.asarray(logits), np.asarray(targets)
    if logits.dtype.kind != "f" or logits.ndim == 0:
        raise TypeError(f"logits must be a float array (..., C), got {logits.dtype} {logits.shape}")
    if targets.dtype.kind not in "iu" or targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must be an integer array of shape {logits.shape[:-1]} (the logits' but the last), "
                         f"got {targets.dtype} {targets.shape}")
    C = logits.shape[-1]
    if targets.size and (targets.min() < 0 or targets.max() >= C):
        raise ValueError(f"targets must be class indices in [0, {C}), got values in [{targets.min()}, {targets.max()}]")
    if weights is not None:
        weights = np.asarray(weights)
        if weights.dtype.kind not in "biuf" or weights.shape != targets.shape:
            raise ValueError(f"weights must be a real array of shape {targets.shape}, got {weights.dtype} {weights.shape}")
    z = logits.reshape(-1, C).astype(np.float64)
    t = targets.reshape(-1)
    w = np.ones(len(t)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    total = w.sum()
    if total <= 0:
        return 0.0, np.zeros_like(logits)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = float(-(w * logp[np.arange(len(t)), t]).sum() / total)
    grad = np.exp(logp)
    grad[np.arange(len(t)), t] -= 1.0
    grad *= (w / total)[:, None]
    return loss, grad.reshape(logits.shape).astype(logits.dtype)
