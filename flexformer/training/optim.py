"""AdamW, the warmup-then-cosine learning-rate schedule and global gradient clipping."""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

import numpy as np

from ..nn.core import Parameter


def _pairs(named) -> List[Tuple[str, Parameter]]:
    """``named`` as a list of (name, Parameter) pairs; TypeError otherwise."""
    if isinstance(named, (str, np.ndarray)) or not hasattr(named, "__iter__"):
        raise TypeError(f"named must be (name, Parameter) pairs as Module.named_parameters() gives, got "
                        f"{type(named).__name__}")
    pairs = list(named)
    for i, item in enumerate(pairs):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Parameter)):
            raise TypeError(f"named must be (name, Parameter) pairs as Module.named_parameters() gives; "
                            f"item {i} is {type(item).__name__}")
    return pairs


class AdamW:
    """AdamW (Loshchilov and Hutter, 2019) over named Parameters.

    Weight decay is decoupled and skips parameters whose ``kind`` is in ``no_decay``
    (default: norms, biases and attention-kernel parameters such as the learned
    frequencies). Parameters with ``grad`` None (fixed arrays) are left alone.
    ``kernel_lr_scale`` multiplies the learning rate of the attention-kernel parameters
    (kind ``"kernel"``: frequencies, tau, Hedgehog's W, Linformer's projections).

    Parameters
    ----------
    named : sequence of (str, Parameter)
        ``model.named_parameters()``.
    lr : float, optional
        The default learning rate (``step`` takes the rate of each step).
    betas : (float, float), optional
    eps : float, optional
    weight_decay : float, optional
    no_decay : iterable of str, optional
        Parameter kinds without weight decay.
    kernel_lr_scale : float, optional

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import Linear
    >>> from flexformer.training import AdamW
    >>> layer = Linear(2, 1, np.random.default_rng(0), dtype=np.float64)
    >>> opt = AdamW(layer.named_parameters(), lr=0.1)
    >>> x, y = np.array([[1.0, 2.0]]), np.array([[3.0]])
    >>> for _ in range(200):
    ...     layer.zero_grad()
    ...     _ = layer.backward(2 * (layer.forward(x) - y))
    ...     opt.step(0.1)
    >>> bool(abs(layer.forward(x)[0, 0] - 3.0) < 0.05)
    True
    """

    def __init__(self, named: Sequence[Tuple[str, Parameter]], *, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 no_decay: Iterable[str] = ("bias", "norm", "kernel"), kernel_lr_scale: float = 1.0):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not (np.isfinite(kernel_lr_scale) and kernel_lr_scale > 0):
            raise ValueError(f"kernel_lr_scale must be a finite number > 0, got {kernel_lr_scale}")
        self.kernel_lr_scale = float(kernel_lr_scale)
        self.params: List[Tuple[str, Parameter]] = [(n, p) for n, p in _pairs(named) if p.grad is not None]
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.no_decay = tuple(no_decay)
        self.t = 0
        self.m: Dict[str, np.ndarray] = {n: np.zeros_like(p.value, dtype=np.float64) for n, p in self.params}
        self.v: Dict[str, np.ndarray] = {n: np.zeros_like(p.value, dtype=np.float64) for n, p in self.params}

    def step(self, lr: float) -> None:
        """One update with learning rate ``lr`` (the schedule's value for this step)."""
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for name, p in self.params:
            g = p.grad.astype(np.float64)
            m, v = self.m[name], self.v[name]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            update = (m / c1) / (np.sqrt(v / c2) + self.eps)
            if self.weight_decay and p.kind not in self.no_decay:
                update = update + self.weight_decay * p.value
            rate = lr * self.kernel_lr_scale if p.kind == "kernel" else lr
            p.value -= (rate * update).astype(p.value.dtype)

    def state(self) -> Dict[str, np.ndarray]:
        out = {"t": np.array(self.t)}
        for name, _ in self.params:
            out["m/" + name] = self.m[name]
            out["v/" + name] = self.v[name]
        return out

    def load_state(self, state: Dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`; KeyError names a missing entry, ValueError a wrong shape or
        a negative or non-finite value (never broadcast), TypeError a ``state`` that is not a
        mapping."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping of name to array (as state() gives), got {type(state).__name__}")
        if "t" not in state:
            raise KeyError("missing optimiser state 't'")
        t = np.asarray(state["t"])
        if t.shape != () or t.dtype.kind not in "iu" or int(t) < 0:
            raise ValueError(f"optimiser step t must be an integer >= 0, got {t!r}")
        for name, _ in self.params:
            for key, have in (("m/" + name, self.m[name]), ("v/" + name, self.v[name])):
                if key not in state:
                    raise KeyError(f"missing optimiser state {key!r}")
                value = np.asarray(state[key])
                if value.shape != have.shape:
                    raise ValueError(f"optimiser state {key!r} has shape {value.shape}, the parameter {have.shape}")
                if value.dtype.kind != "f" or not np.isfinite(value).all() or (key[0] == "v" and (value < 0).any()):
                    raise ValueError(f"optimiser state {key!r} must be finite (and >= 0 for v)")
        self.t = int(t)
        for name, _ in self.params:
            self.m[name][...] = state["m/" + name]
            self.v[name][...] = state["v/" + name]


def lr_at(step: int, *, base_lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio * base_lr``
    at ``total`` steps (``step`` counts from 0).

    Parameters
    ----------
    step : int
    base_lr : float
    warmup, total : int
    min_ratio : float, optional

    Returns
    -------
    float

    Examples
    --------
    >>> from flexformer.training import lr_at
    >>> [round(lr_at(s, base_lr=1.0, warmup=10, total=100), 3) for s in (0, 9, 100)]
    [0.1, 1.0, 0.1]
    """
    if warmup > 0 and step < warmup:
        return base_lr * (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def clip_global_norm(named: Sequence[Tuple[str, Parameter]], max_norm: float) -> float:
    """Scale all gradients so their global L2 norm is at most ``max_norm``; returns the
    norm before clipping (inf or NaN pass through so the caller can stop).

    Parameters
    ----------
    named : sequence of (str, Parameter)
    max_norm : float

    Returns
    -------
    float
        The norm before clipping.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import Parameter
    >>> from flexformer.training import clip_global_norm
    >>> p = Parameter(np.zeros(2)); p.grad[:] = [3.0, 4.0]
    >>> clip_global_norm([("p", p)], 1.0), p.grad.tolist()
    (5.0, [0.6000000000000001, 0.8])
    """
    total = 0.0
    named = _pairs(named)
    for _, p in named:
        if p.grad is not None:
            total += float(np.sum(p.grad.astype(np.float64) ** 2))
    norm = math.sqrt(total)
    if max_norm > 0 and norm > max_norm and math.isfinite(norm):
        scale = max_norm / norm
        for _, p in named:
            if p.grad is not None:
                p.grad *= scale
    return norm
