"""The named functions: ``<kind>_attention(q, k, v, *params, ...)`` and
``<kind>_attention_backward(dout, q, k, v, *params, ...)`` for every kind on the normalised
linear core, generated from the kind's record (:data:`flexformer.kinds.base.TABLE`): its
parameters in the order of its csrc/kinds.h row, its options, its docstring. They are
:func:`flexformer.attention` with the parameters by position; a kind added to the registry
gets its pair without a line here.

Each function is compiled from a short source text (as :mod:`dataclasses` builds its
methods) so that it has a real signature: a missing or misspelt argument is Python's own
``TypeError`` naming it, and ``help``, IDEs and Sphinx show the parameters.
"""
from __future__ import annotations

import functools
import textwrap
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from .functional import DEFAULT_EPS, ArrayOrPair, _backward, _forward
from .kinds import TABLE
from .kinds.base import AttentionKind
from .runtime import _C

#: the kinds with named functions: those on the normalised linear core, in the registry's order
KINDS = tuple(name for name, spec in TABLE.items() if spec.key_state)

_RAISES = """\
Raises
------
TypeError
    An array has a dtype other than the call's (float32 or float64, set by the first
    array argument), or cannot be converted; the message names the argument.
ValueError
    A shape does not fit the others, a parameter is not finite, ``causal=True`` with
    Nq != Nk, or ``eps`` is not a finite number > 0.
FloatingPointError
    Finite inputs whose result overflows the dtype."""

_COMMON = """\
Output row i is sum_j k(q_i, k_j) v_j / sum_j k(q_i, k_j) with k(x, y) = phi(x).phi(y), over
the unmasked keys (keys j <= i when ``causal``), in time and memory linear in the sequence
length; the stabilisation and the denominator guard are described in
:mod:`flexformer.functional`. The same call as ``flexformer.attention("{kind}", q, k, v,
params)``, with the parameters by position."""


def _title(spec: AttentionKind) -> str:
    return spec.description[0].upper() + spec.description[1:] + "."


def _projection_width(spec: AttentionKind) -> str:
    """R, the width of a row's kept projections: m per set of frequencies in its row."""
    sets = sum(axes == "Hmd" for _, axes, _ in _C.kinds[spec.kernel]["params"])
    return "m" if sets == 1 else f"{sets}m"


def _param_lines(spec: AttentionKind) -> str:
    meaning = dict(spec.param_docs)
    return "".join(f"{name} : ndarray\n    {layout}: {meaning.get(name, 'finite')}.\n"
                   for name, layout in zip(spec.params, spec.layouts))


def _example(spec: AttentionKind, backward: bool) -> str:
    args = "".join(f', p["{n}"]' for n in spec.params)
    lines = [">>> import numpy as np, flexformer as ff",
             ">>> rng = np.random.default_rng(0)",
             ">>> q, k, v = (0.5 * rng.standard_normal((1, 2, 16, 8)) for _ in range(3))",
             f'>>> p = ff.get_attention("{spec.name}").init(2, 8, rng=0)']
    if not backward:
        lines += [f">>> out = ff.{spec.name}_attention(q, k, v{args}, causal=True)",
                  ">>> out.shape", "(1, 2, 16, 8)",
                  f'>>> bool(np.allclose(out, ff.attention("{spec.name}", q, k, v, p, causal=True)))', "True"]
    else:
        grads = "".join(f", d{n}" for n in spec.learnable)
        lines += [f">>> dq, dk, dv{grads} = ff.{spec.name}_attention_backward(np.ones((1, 2, 16, 8)), q, k, v{args})",
                  ">>> dq.shape", "(1, 2, 16, 8)"]
    return "\n".join(lines)


def _forward_doc(spec: AttentionKind) -> str:
    projections = spec.projections
    doc = [_title(spec), "", textwrap.fill(spec.about, 88), "", _COMMON.format(kind=spec.name), "",
           "Parameters", "----------",
           "q, k, v : ndarray\n    Queries (B, H, Nq, d), keys (B, H, Nk, d), values (B, H, Nk, e); float32 or\n"
           "    float64, all the same dtype.",
           _param_lines(spec).rstrip("\n") if spec.params else None,
           "causal : bool, optional\n    Row i sees only keys j <= i. Needs Nq == Nk.",
           "key_mask : ndarray of bool, optional\n    (B, Nk); False keys count in neither numerator nor denominator.",
           "eps : float, optional\n    The denominator guard; finite and > 0. Default "
           ":data:`flexformer.DEFAULT_EPS` (1e-4).",
           "return_guard_count : bool, optional\n    Also return an int64 array (B, H) counting the rows that hit "
           "the guard.",
           "return_key_state : bool, optional\n    Bidirectional only: also return the keys' state "
           "(B, H, P), the packed\n    sums [S, z, R, M] the outputs were read from (F = "
           f'``get_attention("{spec.name}").feature_size(params, d)``),\n    zero-padded to P, a multiple of 16. '
           "Hand it to the backward as ``key_state=`` and it\n    skips recomputing them.",
           ("return_projections : bool, optional\n    Bidirectional only: also return the queries' and keys' "
            f"projections onto the\n    frequencies, (B, H, Nq + Nk, {_projection_width(spec)}), masked keys as "
            "zeros. Hand them to the\n    backward as ``projections=`` and it skips computing them again."
            if projections else None),
           "", "Returns", "-------",
           "out : ndarray\n    (B, H, Nq, e) in the input dtype; then, each when asked for and in this order, "
           "the\n    guard count, the key state" + (" and the projections." if projections else "."),
           "", _RAISES, "", "Examples", "--------", _example(spec, False)]
    return "\n".join(line for line in doc if line is not None)


def _backward_doc(spec: AttentionKind) -> str:
    grads = ", ".join(f"d{n}" for n in spec.learnable)
    frozen = [n for n in spec.params if n not in spec.learnable]
    doc = [f"Gradients of :func:`{spec.name}_attention` (it recomputes the forward pass, but for the keys' "
           "state and\nthe projections when ``key_state`` and ``projections`` from the forward are given).",
           "", "Parameters", "----------",
           "dout : ndarray\n    The gradient of the loss with respect to the output, (B, H, Nq, e).",
           f"q, k, v{''.join(', ' + n for n in spec.params)}, causal, key_mask, eps\n    As in "
           f":func:`{spec.name}_attention`.",
           "key_state : ndarray, optional\n    What the forward returned with ``return_key_state=True`` for these "
           "same k, v,\n    parameters and mask (bidirectional). Its shape is checked, its content is not: a\n"
           "    state from other inputs gives wrong gradients.",
           ("projections : ndarray, optional\n    What the forward returned with ``return_projections=True`` for "
            "these same q, k,\n    parameters and mask (bidirectional); checked and trusted like ``key_state``."
            if spec.projections else None),
           "", "Returns", "-------",
           f"dq, dk, dv{', ' + grads if grads else ''} : ndarray\n    The shapes and dtype of q, k, v"
           + (f" and {', '.join(spec.learnable)}" if grads else "") + ". Masked keys get zero gradient."
           + (f" No gradient for {', '.join(frozen)}\n    (not learned)." if frozen else ""),
           "", _RAISES, "", "Examples", "--------", _example(spec, True)]
    return "\n".join(line for line in doc if line is not None)


def _target(spec: AttentionKind, backward: bool) -> Callable:
    """What a generated function calls, with its arrays and parameters by position: the
    kind's C kernel through :mod:`flexformer.functional` (as the registry does, with no
    Python layer between), or, for a kind with its own functions (elu), its record's
    forward or backward."""
    if spec._forward is None:
        kernel = getattr(_C, f"{spec.kernel}_{'backward' if backward else 'forward'}")
        return functools.partial(_backward if backward else _forward, kernel)

    def run(*arrays, **options):
        split = len(arrays) - len(spec.params)
        tensors, params = arrays[:split], dict(zip(spec.params, arrays[split:]))
        if not backward:
            return spec.forward(*tensors, params, **options)
        dq, dk, dv, grads = spec.backward(*tensors, params, **options)
        return (dq, dk, dv) + tuple(grads[name] for name in spec.learnable)
    return run


_SOURCE = '''\
def _factory(_target):
    def {name}({arrays}*, causal: bool = False, key_mask: Optional[np.ndarray] = None,
            eps: float = DEFAULT_EPS, {options}) -> {returns}:
        return _target({passed}){kept}
    return {name}
'''


def _compile(spec: AttentionKind, backward: bool, options: Dict[str, Tuple[str, str]], returns: str) -> Callable:
    name = f"{spec.name}_attention" + ("_backward" if backward else "")
    arrays = (("dout", "q", "k", "v") if backward else ("q", "k", "v")) + spec.params
    source = _SOURCE.format(
        name=name, arrays="".join(f"{a}: np.ndarray, " for a in arrays),
        options=", ".join(f"{o}: {t} = {d}" for o, (t, d) in options.items()), returns=returns,
        passed=", ".join([*arrays, *(f"{o}={o}" for o in ("causal", "key_mask", "eps", *options))]),
        # the backward returns the gradients of the learnable parameters only (rfa: none of omega)
        kept=f"[:{3 + len(spec.learnable)}]" if backward else "")
    namespace: dict = {}
    exec(compile(source, f"<flexformer.named: {name}>", "exec"), globals(), namespace)
    fn = namespace["_factory"](_target(spec, backward))
    fn.__module__, fn.__qualname__ = __name__, name
    if hasattr(fn.__code__, "co_qualname"):  # Python 3.11+: the name its TypeErrors give
        fn.__code__ = fn.__code__.replace(co_qualname=name)
    return fn


def _make(spec: AttentionKind) -> Tuple[Callable, Callable]:
    forward_options = {"return_guard_count": ("bool", "False"), "return_key_state": ("bool", "False")}
    backward_options = {"key_state": ("Optional[np.ndarray]", "None")}
    if spec.projections:
        forward_options["return_projections"] = ("bool", "False")
        backward_options["projections"] = ("Optional[np.ndarray]", "None")
    forward = _compile(spec, False, forward_options, "ArrayOrPair")
    backward = _compile(spec, True, backward_options, "Tuple[np.ndarray, ...]")
    forward.__doc__, backward.__doc__ = _forward_doc(spec), _backward_doc(spec)
    return forward, backward


__all__ = []
for _kind in KINDS:
    for _fn in _make(TABLE[_kind]):
        globals()[_fn.__name__] = _fn
        __all__.append(_fn.__name__)
del _kind, _fn
