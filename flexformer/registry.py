"""One registry of attention kinds with a uniform init / forward / backward triple.

Model layers switch attention by name::

    kind = flexformer.get_attention("flex_n")
    params = kind.init(num_heads=4, head_dim=32, rng=0)
    out = kind.forward(q, k, v, params, causal=True)
    dq, dk, dv, dparams = kind.backward(dout, q, k, v, params, causal=True)

``params`` is a dict of NumPy arrays; ``dparams`` holds the gradients of the learnable
ones only (``kind.learnable``). ``flexformer.attention_kinds()`` lists the names.

This is the one table of kinds: each entry says which C kernel runs it, its feature map's
NumPy and torch twins (:mod:`flexformer.features`), and whether it can be decoded
recurrently and be distilled; its parameter names, their layouts, which of them learn and
whether it runs causally are read from its row of csrc/kinds.h (``_C.kinds``). Every other list of kinds
(recurrent decoding, distillation, the torch bridge, the command line's defaults, the
diagnostics) is derived from it. Adding a kind: docs/architecture.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .runtime import _C
from . import functional as lin
from . import features as fm
from . import init as initialisers
from . import softmax as sm
from .features import elu_plus_one, elu_plus_one_grad, normalised

Params = Dict[str, np.ndarray]


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
        twin (torch, x, params) -> (f, s) (:mod:`flexformer.features`); None for the
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
                                 f"{', '.join(k.name for k in _KINDS.values() if k.projections)} only")
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


def _m(head_dim, num_features):
    return head_dim if num_features is None else num_features


def _flex_s_init(H, d, m, L, rng, dtype, **options):
    return {"omega": initialisers.flex_s_omega(H, _m(d, m), d, rng=rng, dtype=dtype, **options)}


def _flex_n_init(H, d, m, L, rng, dtype, **options):
    o1, o2, tau = initialisers.flex_n_params(H, _m(d, m), d, rng=rng, dtype=dtype, **options)
    return {"omega1": o1, "omega2": o2, "tau": tau}


def _linformer_init(H, d, m, L, rng, dtype):
    if L is None:
        raise ValueError("linformer needs max_len (the longest sequence, Nmax) to size E and F")
    gen = initialisers.as_generator(rng)
    kp = 64 if m is None else m
    return {"E": initialisers.linformer_projections(kp, L, H, rng=gen, dtype=dtype),
            "F": initialisers.linformer_projections(kp, L, H, rng=gen, dtype=dtype)}


def _flex_n_scale(params, head_dim):
    # E[phi(q).phi(k)] at the initialisation is exp(2 q.k / e^tau) (init.flex_n_params)
    return 2.0 * np.exp(-np.asarray(params["tau"], dtype=np.float64))


def _frequency_scale(params, head_dim):
    # omega rows ~ N(0, c I): the estimated kernel is exp(c q.k), c = mean |row|^2 / d
    w = np.asarray(params["omega"], dtype=np.float64)
    return (w * w).sum(-1).mean(-1) / head_dim


def _frequency_rows(params):
    w = np.asarray(params["omega"], np.float64)
    return {"omega_row_norm": np.linalg.norm(w, axis=-1).mean(-1).tolist()}


def _flex_n_summary(params):
    a, b = np.asarray(params["omega1"], np.float64), np.asarray(params["omega2"], np.float64)
    separation = (np.linalg.norm((a - b).reshape(a.shape[0], -1), axis=1)
                  / np.maximum(np.linalg.norm(a.reshape(a.shape[0], -1), axis=1), 1e-300))
    return {"omega1_row_norm": np.linalg.norm(a, axis=-1).mean(-1).tolist(),
            "omega2_row_norm": np.linalg.norm(b, axis=-1).mean(-1).tolist(),
            "tau": np.asarray(params["tau"], np.float64).tolist(), "separation": separation.tolist()}


def _elu_forward(q, k, v, p, causal, mask, **kw):
    q, k = np.asarray(q), np.asarray(k)
    return lin.linear_attention(elu_plus_one(q), elu_plus_one(k), v,
                                causal=causal, key_mask=mask, **kw)


def _elu_backward(dout, q, k, v, p, causal, mask, **kw):
    q, k = np.asarray(q), np.asarray(k)
    dpq, dpk, dv = lin.linear_attention_backward(dout, elu_plus_one(q), elu_plus_one(k),
                                                 v, causal=causal, key_mask=mask, **kw)
    dk = (dpk * elu_plus_one_grad(k)).astype(k.dtype)
    if mask is not None:  # 0, not 0 * elu'(k): whatever a masked key holds is never read
        dk[~np.broadcast_to(np.asarray(mask, bool)[:, None, :, None], dk.shape)] = 0
    return (dpq * elu_plus_one_grad(q)).astype(q.dtype), dk, dv


_KINDS: Dict[str, AttentionKind] = {}

#: what the axis letters of csrc/kinds.h's parameter rows stand for in a layout
_AXIS_NAMES = {"H": "H", "m": "m", "d": "d", "p": "kp", "L": "Nmax"}


def _layout(axes: str) -> str:
    names = [_AXIS_NAMES[a] for a in axes]
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _c_row(table: str) -> dict:
    """A kind's parameter names, layouts, learnable parameters and causal support, read from
    its row of csrc/kinds.h (``_C.kinds``): the C core's table is the one place they are written."""
    row = _C.kinds[table]
    params = tuple(name for name, _, _ in row["params"])
    layouts = tuple(_layout(axes) + (f" or {_layout(alt)}" if alt else "") for _, axes, alt in row["params"])
    return {"params": params, "layouts": layouts, "learnable": params[:row["gradients"]], "causal": row["causal"]}


def _register(name: str, description: str, *, table: str, **fields) -> None:
    """Add a kind; ``table`` names its row in csrc/kinds.h (its own, or the C kernel it
    shares), from which the parameters, layouts, gradients and causal support come unless
    ``fields`` say otherwise (RFA: flex_s's frequencies, frozen)."""
    _KINDS[name] = AttentionKind(name, description, **{**_c_row(table), **fields})


_FLEX_S = dict(feature_map=fm.flex_s_features, feature_size=fm.flex_s_size, torch_feature_map=fm.flex_s_features_torch,
               signed_features=True, nominal_scale=_frequency_scale, parameter_summary=_frequency_rows)
_LINEAR_KIND = dict(masks=True, key_state=True, recurrent=True)

_register(
    "softmax", "exact softmax attention (online softmax, O(N) memory)", table="softmax", masks=True,
    complexity="O(N^2 (d + e))", _init=lambda H, d, m, L, rng, dt: {},
    _forward=lambda q, k, v, p, c, mk: sm.softmax_attention(q, k, v, causal=c, key_mask=mk),
    _backward=lambda do, q, k, v, p, c, mk: sm.softmax_attention_backward(do, q, k, v, causal=c, key_mask=mk),
    recurrent=True)
_register(
    "flex_s", "Flexformer_s: stationary learnable random Fourier features", table="flex_s",
    complexity="O(N m (d + e))", _init=_flex_s_init, kernel="flex_s", init_options=("scale",),
    feature_grad=fm.flex_s_features_grad, distill=True, **_FLEX_S, **_LINEAR_KIND)
_register(
    "flex_n", "Flexformer_n: nonstationary learnable frequency pairs and scale", table="flex_n",
    complexity="O(N m (d + e))", _init=_flex_n_init, kernel="flex_n",
    init_options=("scale", "spread", "match_tau", "symmetric"), feature_map=fm.flex_n_features,
    feature_grad=fm.flex_n_features_grad, feature_size=fm.flex_n_size, torch_feature_map=fm.flex_n_features_torch,
    distill=True, signed_features=True, nominal_scale=_flex_n_scale, parameter_summary=_flex_n_summary,
    **_LINEAR_KIND)
_register(
    "rfa", "RFA: Flexformer_s with frozen random frequencies (no gradient for omega)", table="flex_s",
    learnable=(), complexity="O(N m (d + e))", _init=_flex_s_init, kernel="flex_s", init_options=("scale",),
    distill=True, **_FLEX_S, **_LINEAR_KIND)
_register(
    "performer", "Performer FAVOR+: fixed positive random features", table="performer",
    complexity="O(N m (d + e))",
    _init=lambda H, d, m, L, rng, dt: {"omega": initialisers.performer_omega(H, _m(d, m), d, rng=rng, dtype=dt)},
    kernel="performer", feature_map=fm.performer_features, feature_size=lambda p, d: p["omega"].shape[1],
    torch_feature_map=fm.performer_features_torch, distill=True, parameter_summary=_frequency_rows, **_LINEAR_KIND)
_register(
    "hedgehog", "Hedgehog: learnable softmax feature map", table="hedgehog", complexity="O(N m (d + e))",
    _init=lambda H, d, m, L, rng, dt: {"W": initialisers.hedgehog_weights(H, d, m, rng=rng, dtype=dt)},
    kernel="hedgehog", feature_map=fm.hedgehog_features, feature_grad=fm.hedgehog_features_grad,
    feature_size=fm.hedgehog_size, torch_feature_map=fm.hedgehog_features_torch, distill=True, **_LINEAR_KIND)
_register(
    "taylor", "Based: second-order Taylor features of exp(q.k / sqrt d), 1 + t + t^2/2 (F = 1 + d + d^2)",
    table="taylor", complexity="O(N d^2 e)", _init=lambda H, d, m, L, rng, dt: {}, kernel="taylor",
    feature_map=fm.taylor_features, feature_size=fm.taylor_size, torch_feature_map=fm.taylor_features_torch,
    distill=True, **_LINEAR_KIND)
_register(
    "linformer", "Linformer: keys and values projected along the sequence to kp rows", table="linformer",
    masks=True, complexity="O(N kp (d + e))", _init=_linformer_init,
    _forward=lambda q, k, v, p, c, mk: sm.linformer_attention(q, k, v, p["E"], p["F"], causal=c, key_mask=mk),
    _backward=lambda do, q, k, v, p, c, mk: sm.linformer_attention_backward(do, q, k, v, p["E"], p["F"],
                                                                           causal=c, key_mask=mk))
_register(
    "elu", "linear attention with elu(x) + 1 features (the generic core)", table="linear", complexity="O(N d e)",
    _init=lambda H, d, m, L, rng, dt: {}, _forward=_elu_forward, _backward=_elu_backward,
    feature_map=fm.elu_features, feature_size=fm.input_size, torch_feature_map=fm.elu_features_torch,
    **_LINEAR_KIND)


def attention_kinds() -> List[str]:
    """Names of the registered attention kinds.

    Returns
    -------
    list of str
        The names :func:`get_attention` takes, in registration order.

    Examples
    --------
    >>> import flexformer as ff
    >>> {"flex_s", "flex_n", "softmax", "linformer"} <= set(ff.attention_kinds())
    True
    """
    return sorted(_KINDS)


def get_attention(name: str) -> AttentionKind:
    """The kind called ``name``; ValueError listing the choices for an unknown name.

    Parameters
    ----------
    name : str
        One of :func:`attention_kinds`.

    Returns
    -------
    AttentionKind
        The kind's parameters, capabilities and its ``init`` / ``forward`` / ``backward``.

    Raises
    ------
    ValueError
        ``name`` is not a registered kind (the message lists them).

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> kind = ff.get_attention("flex_n")
    >>> kind.params, kind.learnable
    (('omega1', 'omega2', 'tau'), ('omega1', 'omega2', 'tau'))
    >>> params = kind.init(2, 8, num_features=16, rng=0)
    >>> q = np.random.default_rng(0).standard_normal((1, 2, 10, 8))
    >>> dq, dk, dv, dparams = kind.backward(np.ones_like(q), q, q, q, params, causal=True)
    >>> sorted(dparams)
    ['omega1', 'omega2', 'tau']
    """
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention kind {name!r}; choose one of: {', '.join(attention_kinds())}") from None


def attention(kind: str, q, k, v, params: Optional[Params] = None, *, causal: bool = False, key_mask=None,
              eps: Optional[float] = None) -> np.ndarray:
    """Attention of any registered kind: the one call every kind answers the same way.

    Parameters
    ----------
    kind : str
        One of :func:`attention_kinds`.
    q, k, v : ndarray
        (B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, e), float32 or float64.
    params : dict of str to ndarray, optional
        The kind's parameters, as ``get_attention(kind).init(...)`` makes them; None (or
        ``{}``) for the kinds without parameters (softmax, taylor, elu).
    causal : bool, optional
        Row i sees keys j <= i (not for Linformer).
    key_mask : ndarray (B, Nk) of bool, optional
        True = attend.
    eps : float, optional
        The linear kinds' denominator guard (default :data:`flexformer.DEFAULT_EPS`).

    Returns
    -------
    ndarray (B, H, Nq, e)

    Raises
    ------
    ValueError
        An unknown kind, ``params`` without the kind's names, or an option the kind does
        not have (the message says which).

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> q = k = v = np.random.default_rng(0).standard_normal((1, 2, 6, 4))
    >>> params = ff.get_attention("flex_n").init(2, 4, rng=0)
    >>> out = ff.attention("flex_n", q, k, v, params, causal=True)
    >>> bool(np.array_equal(out, ff.flex_n_attention(q, k, v, *params.values(), causal=True)))
    True
    >>> ff.attention("taylor", q, k, v).shape
    (1, 2, 6, 4)
    """
    return get_attention(kind).forward(q, k, v, {} if params is None else params, causal=causal,
                                       key_mask=key_mask, eps=eps)


def attention_backward(kind: str, dout, q, k, v, params: Optional[Params] = None, *, causal: bool = False,
                       key_mask=None, eps: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Params]:
    """Gradients of :func:`attention`: ``(dq, dk, dv, dparams)``, dparams keyed by the
    kind's learnable parameter names (``get_attention(kind).learnable``).

    Parameters
    ----------
    kind, q, k, v, params, causal, key_mask, eps
        As for :func:`attention`.
    dout : ndarray (B, H, Nq, e)
        The gradient of the loss with respect to the output.

    Returns
    -------
    tuple
        dq, dk, dv like q, k, v, and a dict of the learnable parameters' gradients.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> q = k = v = np.random.default_rng(0).standard_normal((1, 2, 6, 4))
    >>> params = ff.get_attention("hedgehog").init(2, 4, rng=0)
    >>> dq, dk, dv, dparams = ff.attention_backward("hedgehog", np.ones_like(v), q, k, v, params)
    >>> sorted(dparams), dparams["W"].shape
    (['W'], (2, 4, 4))
    """
    return get_attention(kind).backward(dout, q, k, v, {} if params is None else params, causal=causal,
                                        key_mask=key_mask, eps=eps)


# ------------------------------------------------------------- feature maps by kind name

#: the user's own features (recurrent decoding and the generic core): not an attention kind
USER_FEATURES = "linear"


def _with_features(kind: str) -> AttentionKind:
    spec = _KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None or spec.feature_map is None:
        choices = sorted([k for k, s in _KINDS.items() if s.feature_map is not None] + [USER_FEATURES])
        raise ValueError(f"kind must be one of {', '.join(choices)} (the kinds with a feature map), got {kind!r}")
    return spec


def require_params(kind: str, params) -> None:
    """ValueError naming what is missing unless ``params`` has every name ``kind`` needs."""
    names = () if kind == USER_FEATURES else get_attention(kind).params
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params for {kind} need {', '.join(names)}; missing {', '.join(missing)}")


def check_param_shapes(kind: str, params: Params, H: int, d: int) -> None:
    """ValueError naming the parameter whose shape does not fit the kind's layout for H
    heads of size d (the feature-map kinds; m, any size >= 1; ``"linear"`` has none)."""
    if kind == USER_FEATURES:
        return
    spec = get_attention(kind)
    for name, layout in zip(spec.params, spec.layouts):
        x = params[name]
        axes = layout.strip("()").rstrip(",").split(", ")
        fits = x.ndim == len(axes) and all(
            n == {"H": H, "d": d}.get(a, n) and n >= 1 for a, n in zip(axes, x.shape))
        if not fits:
            raise ValueError(f"{name} must have shape {layout} with H = {H}, d = {d}; got {x.shape}")


def features(kind: str, x: np.ndarray, params: Params) -> Tuple[np.ndarray, np.ndarray]:
    """(f, s) of ``kind``'s feature map for x (B, H, T, d): phi(x) = exp(s) f (NumPy twin of
    the C map); ``"linear"``: x itself, normalised."""
    if kind == USER_FEATURES:
        return normalised(x)
    return _with_features(kind).feature_map(x, params)


def num_features(kind: str, params: Params, d: int) -> int:
    """F, the length of f for this kind and parameters."""
    return d if kind == USER_FEATURES else _with_features(kind).feature_size(params, d)


def feature_backward(kind: str, x: np.ndarray, params: Params, df: np.ndarray, ds: np.ndarray) -> Params:
    """Gradients of the kind's learnable parameters given df (B,H,T,F) and ds (B,H,T), the
    gradients with respect to f and s at x (empty for kinds without learnable ones)."""
    if kind == USER_FEATURES:
        return {}
    spec = _with_features(kind)
    return {} if spec.feature_grad is None else spec.feature_grad(x, params, df, ds)
