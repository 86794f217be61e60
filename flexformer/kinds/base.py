"""What every attention kind is: :class:`AttentionKind`, the record of one kind (its
parameters, capabilities, functions and hooks), and :data:`TABLE`, the kinds by name in
the order flexformer/kinds/__init__.py lists them. The parameter names, layouts, learnable subset and causal
support of a kind come from its row of csrc/kinds.h (``_C.kinds``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from .._checks import check_float_dtype, check_int
from ..init import as_generator
from ..runtime import _C
from .. import functional as lin

Params = Dict[str, np.ndarray]

#: every kind by name, in the order flexformer/kinds/__init__.py lists them
TABLE: Dict[str, "AttentionKind"] = {}

#: the keyword defaults of the kinds on the normalised linear-attention core
LINEAR_KIND = dict(masks=True, key_state=True, recurrent=True)


@dataclass(frozen=True)
class AttentionKind:
    """An attention kind: its parameters, what it supports and its three functions.

    Attributes
    ----------
    name, description : str
    params : tuple of str
        Names of the arrays in ``params`` (learnable or fixed).
    layouts : tuple of str
        The shape of each, e.g. ``"(H, m, d)"``: H heads, d head size, m features.
    learnable : tuple of str
        The subset that ``backward`` returns gradients for.
    causal, masks : bool
        Whether ``causal=True`` and ``key_mask`` are supported.
    complexity : str
        Time per (batch, head) in terms of N, d, e and the kind's own sizes.
    kernel : str or None
        The C kernel pair (``_C.<kernel>_forward`` / ``_backward``) a linear kind runs on,
        parameters passed in ``params`` order; None for kinds with their own functions.
    feature_map, feature_grad, feature_size, torch_feature_map : callable or None
        The feature map's NumPy twin (x, params) -> (f, s), the gradient of its learnable
        parameters (x, params, df, ds) -> dict, its size (params, d) -> F, and its torch
        twin (torch, x, params) -> (f, s) (the kind's module in :mod:`flexformer.kinds`); None for the
        kinds without a feature map (softmax, linformer).
    recurrent : bool
        Decodable token by token (:class:`flexformer.RecurrentAttention`).
    distill : bool
        Can be fitted to softmax attention rows (:mod:`flexformer.distill`).

    Examples
    --------
    >>> import flexformer as ff
    >>> spec = ff.get_attention("linformer")
    >>> spec.causal, spec.params, spec.layouts
    (False, ('E', 'F'), ('(H, kp, Nmax) or (kp, Nmax)', '(H, kp, Nmax) or (kp, Nmax)'))
    """

    name: str
    description: str
    params: Tuple[str, ...]
    learnable: Tuple[str, ...]
    causal: bool
    masks: bool
    complexity: str
    _init: Callable = field(repr=False)
    _forward: Optional[Callable] = field(default=None, repr=False)
    _backward: Optional[Callable] = field(default=None, repr=False)
    #: the bidirectional forward can hand its key state to the backward (linear kinds)
    key_state: bool = False
    #: keyword options of :meth:`init` beyond the sizes (e.g. the trig kinds' ``scale``)
    init_options: Tuple[str, ...] = ()
    kernel: Optional[str] = None
    feature_map: Optional[Callable] = field(default=None, repr=False)
    feature_grad: Optional[Callable] = field(default=None, repr=False)
    feature_size: Optional[Callable] = field(default=None, repr=False)
    torch_feature_map: Optional[Callable] = field(default=None, repr=False)
    recurrent: bool = False
    distill: bool = False
    layouts: Tuple[str, ...] = ()
    #: f(q).f(k) can be zero or negative (the trig kinds); distillation then trains through a
    #: smooth floor (:data:`flexformer.distill.experiment.DISTILL_SOFT_FLOOR`)
    signed_features: bool = False
    #: diagnostics hooks (:mod:`flexformer.diagnostics`): (params, head_dim) -> (H,) the
    #: softmax temperature the kind estimates (None: 1 / sqrt d), and params -> dict of
    #: per-head summaries of its parameters (None: nothing to summarise)
    nominal_scale: Optional[Callable] = field(default=None, repr=False)
    parameter_summary: Optional[Callable] = field(default=None, repr=False)
    #: what its named function's docstring says of it (:mod:`flexformer.named`): the map in
    #: a paragraph, and what each parameter is (by name; its layout comes from ``layouts``)
    about: str = field(default="", repr=False)
    param_docs: Tuple[Tuple[str, str], ...] = field(default=(), repr=False)

    def init(self, num_heads: int, head_dim: int, *, num_features: Optional[int] = None,
             max_len: Optional[int] = None, rng=None, dtype=np.float64, **options) -> Params:
        """Initial parameters. ``num_features`` is m (default head_dim) for the feature-map
        kinds and kp (default 64) for Linformer; ``max_len`` is Linformer's Nmax (needed).
        ``options`` are the kind's own (``init_options``): ``scale`` for flex_s and rfa
        (:func:`flexformer.init.flex_s_omega`), ``scale``, ``spread``, ``match_tau`` and
        ``symmetric`` for flex_n (:func:`flexformer.init.flex_n_params`)."""
        unknown = sorted(set(options) - set(self.init_options))
        if unknown:
            takes = ", ".join(self.init_options) or "no options"
            raise ValueError(f"{self.name}.init: unknown option(s) {', '.join(unknown)}; it takes {takes}")
        # the common arguments, checked here for every kind (those a kind does not use too)
        num_heads, head_dim = check_int("num_heads", num_heads), check_int("head_dim", head_dim)
        for name, value in (("num_features", num_features), ("max_len", max_len)):
            if value is not None:
                check_int(name, value)
        as_generator(rng)  # its TypeError or ValueError; the kind draws from rng itself
        dtype = check_float_dtype(dtype)
        return self._init(num_heads, head_dim, num_features, max_len, rng, dtype, **options)

    @property
    def projections(self) -> bool:
        """Whether the bidirectional forward can keep its projections for the backward
        (``return_projections`` / ``projections``: the kinds on a C kernel in
        ``_C.projection_kinds``, from csrc/kinds.h)."""
        return self._forward is None and self.kernel in _C.projection_kinds

    def forward(self, q, k, v, params: Params, *, causal: bool = False, key_mask=None,
                return_key_state: bool = False, return_guard_count: bool = False, eps: Optional[float] = None,
                return_projections: bool = False):
        """The attention output (B, H, Nq, e). With ``return_guard_count`` (the linear kinds,
        ``key_state``) also the rows per (batch, head) on the denominator guard; with
        ``return_key_state`` (the same kinds, bidirectional) the key state for
        :meth:`backward`; with ``return_projections`` (kinds with ``projections``,
        bidirectional) the queries' and keys' projections for :meth:`backward`, last:
        ``out``, then the count, the state and the projections. ``eps`` is the linear
        kinds' denominator guard (default :data:`flexformer.DEFAULT_EPS`)."""
        self.check_params(params)
        kw = self._eps_option(eps)
        if return_key_state:
            if not self.key_state or causal:
                raise ValueError(f"{self.name}: a key state exists for the bidirectional linear kinds only")
            kw["return_key_state"] = True
        if return_projections:
            if not self.projections or causal:
                raise ValueError(f"{self.name}: kept projections exist for the bidirectional calls of "
                                 f"{', '.join(k.name for k in TABLE.values() if k.projections)} only")
            kw["return_projections"] = True
        if return_guard_count:
            if not self.key_state:
                raise ValueError(f"{self.name}: only the linear kinds have a denominator guard to count")
            kw["return_guard_count"] = True
        if self._forward is None:
            return lin.kernel_attention(self.kernel, q, k, v, *(params[n] for n in self.params), causal=causal,
                                        key_mask=key_mask, **kw)
        return self._forward(q, k, v, params, causal, key_mask, **kw)

    def backward(self, dout, q, k, v, params: Params, *, causal: bool = False, key_mask=None,
                 key_state=None, eps: Optional[float] = None,
                 projections=None) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Params]:
        """``(dq, dk, dv, dparams)`` with dparams keyed by the learnable names; ``key_state``
        and ``projections`` from :meth:`forward` on the same inputs skip the key pass and the
        projections; ``eps`` as in :meth:`forward`."""
        self.check_params(params)
        extra = self._eps_option(eps)
        if key_state is not None:
            extra["key_state"] = key_state
        if projections is not None:
            if not self.projections:  # causal=True is refused by the kernel, by name
                raise ValueError(f"{self.name}: keeps no projections (projections= comes from forward's "
                                 f"return_projections on the kinds that have it)")
            extra["projections"] = projections
        if self._backward is None:
            dq, dk, dv, *grads = lin.kernel_attention_backward(self.kernel, dout, q, k, v,
                                                               *(params[n] for n in self.params), causal=causal,
                                                               key_mask=key_mask, **extra)
        else:
            dq, dk, dv, *grads = self._backward(dout, q, k, v, params, causal, key_mask, **extra)
        return dq, dk, dv, dict(zip(self.learnable, grads))

    def check_params(self, params) -> None:
        """Raise unless ``params`` is a mapping with exactly this kind's parameter names.

        Parameters
        ----------
        params : mapping of str to array_like
            The kind's parameters, as :meth:`init` returns them.

        Raises
        ------
        TypeError
            ``params`` is not a mapping.
        ValueError
            A name is missing or not one of the kind's (the message lists the expected names).

        Examples
        --------
        >>> import flexformer as ff
        >>> ff.get_attention("flex_n").check_params({"omega1": None})
        Traceback (most recent call last):
            ...
        ValueError: params for flex_n must hold omega1, omega2, tau; missing omega2, tau
        """
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of the kind's arrays ({', '.join(self.params) or 'none'}), "
                            f"got {type(params).__name__}")
        missing = [n for n in self.params if n not in params]
        unknown = [str(n) for n in params if n not in self.params]
        if missing or unknown:
            expected = ", ".join(self.params) if self.params else "no parameters"
            said = [f"missing {', '.join(missing)}"] if missing else []
            said += [f"unknown {', '.join(unknown)}"] if unknown else []
            raise ValueError(f"params for {self.name} must hold {expected}; {'; '.join(said)}")

    def _eps_option(self, eps: Optional[float]) -> dict:
        if eps is None:
            return {}
        if not self.key_state:
            raise ValueError(f"{self.name}: eps is the linear kinds' denominator guard; this kind has none")
        return {"eps": eps}


def features_or_head_dim(head_dim, num_features):
    """m: ``num_features``, or the head size when it is None."""
    return head_dim if num_features is None else num_features


#: what the axis letters of csrc/kinds.h's parameter rows stand for in a layout
_AXIS_NAMES = {"H": "H", "m": "m", "d": "d", "p": "kp", "L": "Nmax"}


def layout(axes: str) -> str:
    names = [_AXIS_NAMES[a] for a in axes]
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def c_row(table: str) -> dict:
    """A kind's parameter names, layouts, learnable parameters and causal support, read from
    its row of csrc/kinds.h (``_C.kinds``): the C core's table is the one place they are written."""
    row = _C.kinds[table]
    params = tuple(name for name, _, _ in row["params"])
    layouts = tuple(layout(axes) + (f" or {layout(alt)}" if alt else "") for _, axes, alt in row["params"])
    return {"params": params, "layouts": layouts, "learnable": params[:row["gradients"]], "causal": row["causal"]}


def register(name: str, description: str, *, table: str, **fields) -> AttentionKind:
    """A kind's record; ``table`` names its row in csrc/kinds.h (its own, or the C kernel it
    shares), from which the parameters, layouts, gradients and causal support come unless
    ``fields`` say otherwise (RFA: flex_s's frequencies, frozen). The kinds package puts the
    records into :data:`TABLE`."""
    return AttentionKind(name, description, **{**c_row(table), **fields})
