"""Numerical gradient checks for use in your own tests (pytest or plain asserts).

Example::

    from flexformer.testing import gradcheck
    gradcheck(flexformer.flex_s_attention, flexformer.flex_s_attention_backward,
              (q, k, v, omega), names=("q", "k", "v", "omega"),
              kwargs={"causal": True})
"""
from __future__ import annotations

import collections.abc
from typing import Callable, Dict, Mapping, Optional, Sequence

import numpy as np

from ._checks import check_positive
from .init import RngLike, as_generator


def _check_settings(step, rtol=0.0, atol=0.0):
    """The finite-difference step (finite, > 0) and tolerances (finite, >= 0) as floats;
    TypeError or ValueError naming the one that is off."""
    return (check_positive("step", step), check_positive("rtol", rtol, zero_ok=True),
            check_positive("atol", atol, zero_ok=True))


def _loss_value(value, what: str) -> float:
    """A loss call's result as a float; TypeError unless it is one real number."""
    try:
        v = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must return a real number, got {type(value).__name__}") from None
    if v.shape != ():
        raise TypeError(f"{what} must return one number, got an array of shape {v.shape}")
    return float(v)


def numerical_gradient(loss: Callable[[], float], x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central finite differences of ``loss()`` with respect to the array ``x``.

    ``x`` is perturbed in place one element at a time and restored exactly.

    Parameters
    ----------
    loss : callable
        Returns the scalar loss; reads ``x``.
    x : ndarray
        float64, writeable and contiguous: perturbed in place and restored, also when
        ``loss`` raises.
    step : float, optional
        Finite, > 0.

    Returns
    -------
    ndarray
        Same shape as ``x``.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.testing import numerical_gradient
    >>> x = np.array([1.0, 2.0])
    >>> np.round(numerical_gradient(lambda: float((x ** 2).sum()), x), 6)
    array([2., 4.])
    """
    if not callable(loss):
        raise TypeError(f"loss must be a callable taking no arguments, got {type(loss).__name__}")
    if not (isinstance(x, np.ndarray) and x.dtype.newbyteorder("=") == np.float64):
        raise TypeError(f"x must be a float64 NumPy array (the one loss reads, perturbed in place), got "
                        f"{type(x).__name__}{'' if not isinstance(x, np.ndarray) else ' of ' + str(x.dtype)}")
    step = check_positive("step", step)
    if not x.flags.writeable:
        raise ValueError("x must be writeable: it is perturbed in place (and restored)")
    grad = np.zeros_like(x, dtype=np.float64)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    if x.size and not np.shares_memory(flat, x):
        raise ValueError("x must be contiguous so it can be perturbed in place")
    for i in range(flat.size):
        orig = flat[i]
        try:  # x comes back as it was even when loss raises
            flat[i] = orig + step
            up = _loss_value(loss(), "loss")
            flat[i] = orig - step
            down = _loss_value(loss(), "loss")
        finally:
            flat[i] = orig
        gflat[i] = (up - down) / (2.0 * step)
    return grad


def gradcheck(
    forward: Callable[..., np.ndarray],
    backward: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence[np.ndarray],
    *,
    names: Optional[Sequence[str]] = None,
    kwargs: Optional[Mapping] = None,
    wrt: Optional[Sequence[int]] = None,
    dout: Optional[np.ndarray] = None,
    rng: RngLike = 0,
    step: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-12,
    raise_on_failure: bool = True,
) -> Dict[str, float]:
    """Compare an analytic backward with central finite differences, in float64.

    The scalar checked is ``L = sum(dout * forward(*inputs, **kwargs))`` with a random
    ``dout`` (or the one given); ``backward(dout, *inputs, **kwargs)`` must return the
    gradients of L with respect to ``inputs`` in the same order.

    Parameters
    ----------
    forward, backward : callable
        The function and its gradient, e.g. ``flex_s_attention`` and
        ``flex_s_attention_backward``.
    inputs : sequence of ndarray
        float64 arrays; they are copied, never modified.
    names : sequence of str, optional
        Labels for the report (default ``x0, x1, ...``).
    kwargs : mapping, optional
        Extra keyword arguments for both callables.
    wrt : sequence of int, optional
        Indices of the inputs to check (default: all).
    dout : ndarray, optional
        The output cotangent; default standard normal from ``rng``.
    step, rtol, atol : float
        Finite-difference step; a gradient passes when
        max|numeric - analytic| <= rtol * max|numeric| + atol.
    raise_on_failure : bool
        Raise ``AssertionError`` listing the failures (default) or just report.

    Returns
    -------
    dict
        name -> relative error max|numeric - analytic| / max|numeric| for each input.

    Raises
    ------
    AssertionError
        A gradient is off (with ``raise_on_failure``).
    TypeError
        An input is not float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (0.5 * rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    >>> omega = ff.init.flex_s_omega(2, 8, 4, rng=0)
    >>> errors = ff.testing.gradcheck(ff.flex_s_attention, ff.flex_s_attention_backward, [q, k, v, omega],
    ...                               names=["q", "k", "v", "omega"], kwargs={"causal": True})
    >>> max(errors.values()) < 1e-6
    True
    """
    kwargs = dict(kwargs or {})
    step, rtol, atol = _check_settings(step, rtol, atol)
    if isinstance(inputs, (np.ndarray, str)) or not isinstance(inputs, collections.abc.Sequence):
        raise TypeError(f"inputs must be a list or tuple of the arrays forward takes (e.g. [q, k, v, omega]), "
                        f"got {type(inputs).__name__}")
    for i, x in enumerate(inputs):
        if np.asarray(x).dtype.newbyteorder("=") != np.float64:  # either byte order: copied below
            raise TypeError(f"gradcheck needs float64 inputs; input {i} is {np.asarray(x).dtype}")
    xs = [np.array(x, dtype=np.float64, copy=True, order="C") for x in inputs]
    names = list(names) if names is not None else [f"x{i}" for i in range(len(xs))]
    if len(names) != len(xs):
        raise ValueError(f"names has {len(names)} entries for {len(xs)} inputs")
    wrt = list(range(len(xs))) if wrt is None else list(wrt)
    bad = [i for i in wrt if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(xs)]
    if bad:
        raise ValueError(f"wrt must hold indices of inputs, 0 to {len(xs) - 1}; got {bad}")
    out = np.asarray(forward(*xs, **kwargs))
    if dout is None:
        dout = as_generator(rng).standard_normal(out.shape)
    dout = np.asarray(dout, dtype=np.float64)
    if dout.shape != out.shape:
        raise ValueError(f"dout must have the output's shape {out.shape}, got {dout.shape}")
    analytic = backward(dout, *xs, **kwargs)
    if len(analytic) != len(xs):
        raise ValueError(f"backward returned {len(analytic)} gradients for {len(xs)} inputs")

    def loss() -> float:
        return float(np.sum(dout * forward(*xs, **kwargs)))

    report, failures = {}, []
    for i in wrt:
        numeric = numerical_gradient(loss, xs[i], step)
        got = np.asarray(analytic[i], dtype=np.float64)
        if got.shape != numeric.shape:
            failures.append(f"{names[i]}: gradient shape {got.shape}, expected {numeric.shape}")
            continue
        err = float(np.max(np.abs(numeric - got))) if numeric.size else 0.0
        scale = float(np.max(np.abs(numeric))) if numeric.size else 0.0
        report[names[i]] = err / scale if scale > 0 else err
        if err > rtol * scale + atol:
            failures.append(f"{names[i]}: max abs error {err:.3e} vs max |grad| {scale:.3e} (rtol {rtol:g})")
    if failures and raise_on_failure:
        raise AssertionError("gradcheck failed:\n  " + "\n  ".join(failures))
    return report


def check_model_gradients(
    loss_and_backward: Callable[[], float],
    named_parameters: Sequence,
    *,
    rng: RngLike = 0,
    step: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    raise_on_failure: bool = True,
) -> Dict[str, float]:
    """Directional finite-difference check of every parameter of a model, in float64.

    ``loss_and_backward()`` must zero the gradients, run forward and backward and return
    the loss; ``named_parameters`` is ``model.named_parameters()``. For each trainable
    parameter a random unit direction u is drawn and (L(p + h u) - L(p - h u)) / 2h is
    compared with grad . u (two forward passes per parameter, so whole models stay cheap).
    A parameter passes when |numeric - analytic| <= rtol * max(|grad|, |numeric|) + atol:
    the error is measured against the gradient's norm (the largest value grad . u can
    take), since a random direction can make grad . u itself arbitrarily small.
    Returns name -> |numeric - analytic| / max(|grad|, |numeric|).

    Parameters
    ----------
    loss_and_backward : callable
        Zeroes the gradients, runs forward and backward, returns the loss.
    named_parameters : sequence of (str, Parameter)
        ``model.named_parameters()``.
    rng : None, int or numpy.random.Generator, optional
        The directions' seed.
    step, rtol, atol : float, optional
        Finite-difference step and tolerances.
    raise_on_failure : bool, optional
        Raise ``AssertionError`` on a failure (default) or only report.

    Returns
    -------
    dict
        Parameter name -> relative error.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import Linear
    >>> from flexformer.testing import check_model_gradients
    >>> layer = Linear(4, 3, np.random.default_rng(0), dtype=np.float64)
    >>> x = np.random.default_rng(1).standard_normal((5, 4))
    >>> def loss_and_backward():
    ...     layer.zero_grad()
    ...     y = layer.forward(x)
    ...     layer.backward(2 * y)
    ...     return float((y ** 2).sum())
    >>> errors = check_model_gradients(loss_and_backward, layer.named_parameters())
    >>> sorted(errors)
    ['W', 'b']
    """
    step, rtol, atol = _check_settings(step, rtol, atol)
    gen = as_generator(rng)
    loss_and_backward()
    # the gradients of the unperturbed model, before the perturbed passes overwrite them
    grads = {name: p.grad.copy() for name, p in named_parameters if p.grad is not None}
    report, failures = {}, []
    for name, p in named_parameters:
        if p.grad is None:
            continue
        if p.value.dtype != np.float64:
            raise TypeError(f"check_model_gradients needs float64 parameters; {name} is {p.value.dtype}")
        u = gen.standard_normal(p.value.shape)
        u /= max(np.linalg.norm(u), 1e-300)
        analytic = float(np.sum(grads[name] * u))
        orig = p.value.copy()
        try:  # the parameter comes back as it was even when the loss raises
            p.value[...] = orig + step * u
            up = _loss_value(loss_and_backward(), "loss_and_backward")
            p.value[...] = orig - step * u
            down = _loss_value(loss_and_backward(), "loss_and_backward")
        finally:
            p.value[...] = orig
        numeric = (up - down) / (2 * step)
        scale = max(float(np.linalg.norm(grads[name])), abs(numeric))
        diff = abs(numeric - analytic)
        report[name] = diff / scale if scale > 0 else diff
        if diff > rtol * scale + atol:
            failures.append(f"{name}: numeric {numeric:.10e} vs analytic {analytic:.10e}")
    loss_and_backward()  # leave the gradients of the unperturbed model
    if failures and raise_on_failure:
        raise AssertionError("model gradient check failed:\n  " + "\n  ".join(failures))
    return report


def check_cross_entropy_gradients(model, inputs: Sequence, targets: np.ndarray, **kwargs) -> Dict[str, float]:
    """:func:`check_model_gradients` of the cross-entropy loss of ``model.forward(*inputs)``
    against ``targets`` (class labels, or next tokens for a language model); ``kwargs`` go
    to :func:`check_model_gradients`.

    Parameters
    ----------
    model : flexformer.nn model
        ``EncoderClassifier``, ``TwoTowerClassifier`` or ``CausalLM`` in float64.
    inputs : sequence
        The arguments of ``model.forward``.
    targets : ndarray of int
        Class labels (B,) or next tokens (B, N).
    **kwargs
        ``rng``, ``step``, ``rtol``, ``atol``, ``raise_on_failure``.

    Returns
    -------
    dict
        Parameter name -> relative error.

    Raises
    ------
    AssertionError
        A parameter's gradient is off (with ``raise_on_failure``).

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.nn import EncoderClassifier
    >>> from flexformer.testing import check_cross_entropy_gradients
    >>> model = EncoderClassifier(vocab=5, num_classes=3, dim=8, depth=1, heads=2, max_len=6,
    ...                           attention="flex_n", rng=0, dtype=np.float64)
    >>> ids = np.random.default_rng(0).integers(0, 5, (2, 6))
    >>> errors = check_cross_entropy_gradients(model, (ids, np.ones((2, 6), bool)), np.array([0, 2]))
    >>> max(errors.values()) < 1e-5
    True
    """
    from .nn import Module, cross_entropy

    if not isinstance(model, Module):
        raise TypeError(f"model must be a flexformer.nn model (a Module), got {type(model).__name__}")
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a tuple of model.forward's arguments, got {type(inputs).__name__}")

    def loss_and_backward():
        model.zero_grad()
        loss, dlogits = cross_entropy(model.forward(*inputs), targets)
        model.backward(dlogits)
        return loss

    return check_model_gradients(loss_and_backward, model.named_parameters(), **kwargs)

__all__ = ["check_cross_entropy_gradients", "check_model_gradients", "gradcheck", "numerical_gradient"]
