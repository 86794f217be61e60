"""Attention-weight distillation: fit a kernel so its attention rows match softmax's.

For queries q_i and keys k_j of one head, the teacher row is
a_ij = exp(q_i.k_j / sqrt d) / sum_j' exp(q_i.k_j' / sqrt d) and the student row is
b_ij = k(q_i, k_j) / sum_j' k(q_i, k_j') for the kernel k(x, y) = phi(x).phi(y) being
trained. The loss is the cross-entropy -(1/N) sum_i sum_j a_ij log b_ij, averaged over the
rows of every sequence and over heads (Zhang et al. 2024, Hedgehog, train kernels this
way; the Flexformer paper distils its kernels with the same loss).

Quadratic form: sequences up to a few hundred tokens. With phi(x) = exp(s(x)) f(x)
(:mod:`flexformer.kinds`), k(q_i, k_j) = exp(s(q_i) + s(k_j)) f(q_i).f(k_j); the query
factor cancels in b, so log b_ij = l_ij - logsumexp_j l_ij with
l_ij = s(k_j) + log max(f(q_i).f(k_j), floor). Trig features can make f(q_i).f(k_j) zero
or negative, where log b would not exist; the floor (default 1e-6, relative to the bound
|f(q_i).f(k_j)| <= 1) keeps every b_ij > 0, so the loss is finite for any parameters, and
the gradient of a floored entry flows through s only. Positive feature maps (Performer,
Hedgehog) never reach the floor in practice.

Public: :func:`distill_loss` (loss, per-head losses and analytic gradients),
:func:`attention_rows` (student rows b), :func:`teacher_rows` (softmax rows a),
:func:`fit_kernels` (AdamW of :mod:`flexformer.training.optim`, progress, early stop on a held-out split) and :class:`FitResult`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .._checks import check_int, check_positive, check_real, native
from .._progress import ProgressLine
from ..nn.core import Parameter
from ..registry import attention_kinds, check_param_shapes, feature_backward, features, get_attention, require_params
from ..training.optim import AdamW, lr_at

Params = Dict[str, np.ndarray]
#: the registry's kinds marked ``distill``
DISTILL_KINDS = tuple(k for k in attention_kinds() if get_attention(k).distill)
DEFAULT_FLOOR = 1e-6


def _check(kind: str, q, k, key_mask, params):
    if kind not in DISTILL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DISTILL_KINDS)}, got {kind!r}")
    q, k, key_mask = _check_queries_keys(q, k, key_mask)
    require_params(kind, params)
    params = {n: np.asarray(params[n], dtype=q.dtype) for n in get_attention(kind).params}
    check_param_shapes(kind, params, q.shape[1], q.shape[3])
    for n, x in params.items():
        if not np.isfinite(x).all():
            raise ValueError(f"{n} must be finite")
    return q, k, key_mask, params


def _check_queries_keys(q, k, key_mask):
    """q, k (S, H, N, d) of one float dtype and key_mask (S, N) bool (all True for None)."""
    q, k = native(np.asarray(q)), native(np.asarray(k))
    for name, x in (("q", q), ("k", k)):
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
        if x.ndim != 4:
            raise ValueError(f"{name} must be 4-d (S, H, N, d): sequences, heads, tokens, head size; got {x.shape}")
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must have one shape and dtype, got {q.shape} {q.dtype} and {k.shape} {k.dtype}")
    S, H, N, d = q.shape
    if key_mask is None:
        key_mask = np.ones((S, N), bool)
    key_mask = np.asarray(key_mask)
    if key_mask.dtype != np.bool_ or key_mask.shape != (S, N):
        raise ValueError(f"key_mask must be a bool array (S, N) = {(S, N)}, got {key_mask.dtype} {key_mask.shape}")
    return q, k, key_mask


def teacher_rows(q: np.ndarray, k: np.ndarray, key_mask: Optional[np.ndarray] = None,
                 scale: Optional[float] = None) -> np.ndarray:
    """Softmax attention rows a (S, H, N, N) = softmax_j(q_i.k_j * scale) over unmasked keys
    (scale 1/sqrt(d) by default); rows of masked queries are kept (they are not used).

    Parameters
    ----------
    q, k : ndarray (S, H, N, d)
    key_mask : ndarray of bool (S, N), optional
    scale : float, optional

    Returns
    -------
    ndarray (S, H, N, N)

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> a = fd.teacher_rows(q, k)
    >>> bool(np.allclose(a.sum(-1), 1.0))
    True
    """
    q, k, key_mask = _check_queries_keys(q, k, key_mask)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else check_real("scale", scale)
    logits = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    if not key_mask.all():
        logits = np.where(key_mask[:, None, None, :], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    a = np.exp(logits - np.where(np.isfinite(top), top, 0))
    den = a.sum(-1, keepdims=True)
    return a / np.where(den > 0, den, 1)  # a sequence with no real token: zero rows


def _check_soft_floor(soft_floor):
    if soft_floor is not None and not (np.isfinite(soft_floor) and soft_floor > 0):
        raise ValueError(f"soft_floor must be None or a finite number > 0, got {soft_floor!r}")


def _soft_floor(dot, eps):
    """g(x) = (x + sqrt(x^2 + 4 eps^2)) / 2 and g'(x) / g(x): a smooth positive stand-in
    for max(x, 0) (g -> x for x >> eps, g -> eps^2 / |x| for x << -eps, so d log g / dx
    is about 1 / |x| below zero instead of 0 under the hard floor)."""
    four_eps2 = dot.dtype.type(4.0 * eps * eps)
    r = np.sqrt(dot * dot + four_eps2)
    # below zero (x + r) / 2 cancels; the same value as 2 eps^2 / (r - x) keeps its digits
    with np.errstate(divide="ignore"):  # the unused branch may divide by zero
        g = np.where(dot >= 0, (dot + r) * dot.dtype.type(0.5), four_eps2 * dot.dtype.type(0.5) / (r - dot))
    return g, 1.0 / r  # g'(x) / g(x) = ((1 + x / r) / 2) / ((x + r) / 2) = 1 / r


def _student_logits(kind, q, k, key_mask, params, floor, soft_floor=None):
    fq, _ = features(kind, q, params)
    fk, sk = features(kind, k, params)
    dot = np.matmul(fq, np.swapaxes(fk, -1, -2))                       # (S,H,N,N)
    dlog_soft = None  # d log g / d dot under the soft floor, for the gradient
    if soft_floor is not None:
        clipped, dlog_soft = _soft_floor(dot, soft_floor)
    else:
        clipped = np.maximum(dot, q.dtype.type(floor))
    ell = sk[..., None, :] + np.log(clipped)
    ell = np.where(key_mask[:, None, None, :], ell, -np.inf)
    top = ell.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    total = np.exp(ell - top).sum(-1, keepdims=True)
    lse = top + np.log(np.where(total > 0, total, 1))
    return fq, fk, dot, clipped, dlog_soft, ell - lse


def attention_rows(kind: str, q: np.ndarray, k: np.ndarray, params: Params,
                   key_mask: Optional[np.ndarray] = None, floor: float = DEFAULT_FLOOR) -> np.ndarray:
    """The student's attention rows b (S, H, N, N) for the kernel of ``kind``.

    Parameters
    ----------
    kind : str
        A distillable kind.
    q, k : ndarray (S, H, N, d)
    params : dict of ndarray
    key_mask : ndarray of bool (S, N), optional
    floor : float, optional
        Entries below it are raised to it (trig kernels can give non-positive ones).

    Returns
    -------
    ndarray (S, H, N, N)

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> b = fd.attention_rows("hedgehog", q, k, fd.get_attention("hedgehog").init(2, 4, rng=0))
    >>> bool(np.allclose(b.sum(-1), 1.0))
    True
    """
    q, k, key_mask, params = _check(kind, q, k, key_mask, params)
    return np.exp(_student_logits(kind, q, k, key_mask, params, floor)[-1])


def distill_loss(kind: str, q: np.ndarray, k: np.ndarray, params: Params, key_mask: Optional[np.ndarray] = None,
                 *, teacher: Optional[np.ndarray] = None, floor: float = DEFAULT_FLOOR,
                 soft_floor: Optional[float] = None, grad: bool = True) -> Tuple[float, np.ndarray, Params]:
    """Distillation cross-entropy of a kernel against softmax attention, with gradients.

    Parameters
    ----------
    kind : str
        One of ``DISTILL_KINDS`` (the registry's kinds marked ``distill``).
    q, k : ndarray
        Teacher queries and keys (S, H, N, d), float32 or float64 (S sequences).
    params : dict
        The kind's parameters (H leading), as from ``get_attention(kind).init``.
    key_mask : ndarray of bool, optional
        (S, N), True for real tokens; padded positions are neither keys nor counted rows.
    teacher : ndarray, optional
        Precomputed :func:`teacher_rows` (S, H, N, N); computed when omitted.
    floor : float
        Lower bound on f(q).f(k) inside the log (module docstring).
    soft_floor : float, optional
        eps > 0: the training surrogate. log max(f(q).f(k), floor) becomes log g(f(q).f(k))
        with g(x) = (x + sqrt(x^2 + 4 eps^2)) / 2, smooth and positive, so an entry at or
        below zero still gets a gradient that lifts it (under the hard floor it gets none,
        and a key the teacher attends to can stay there). None (default): the hard floor,
        the loss every reported figure is measured with.
    grad : bool
        Also return the gradients.

    Returns
    -------
    loss : float
        Mean over heads of each head's mean row cross-entropy.
    per_head : ndarray (H,)
        Each head's mean row cross-entropy.
    grads : dict
        d loss / d parameter for the kind's learnable parameters (empty for performer,
        rfa, taylor, or when ``grad`` is False), in the input dtype.

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> params = fd.get_attention("flex_n").init(2, 4, num_features=8, rng=0)
    >>> loss, per_head, grads = fd.distill_loss("flex_n", q, k, params)
    >>> per_head.shape, sorted(grads)
    ((2,), ['omega1', 'omega2', 'tau'])
    """
    q, k, key_mask, params = _check(kind, q, k, key_mask, params)
    S, H, N, _ = q.shape
    a = teacher_rows(q, k, key_mask) if teacher is None else np.asarray(teacher, dtype=q.dtype)
    if a.shape != (S, H, N, N):
        raise ValueError(f"teacher must have shape (S, H, N, N) = {(S, H, N, N)}, got {a.shape}")
    _check_soft_floor(soft_floor)
    fq, fk, dot, clipped, dlog_soft, logb = _student_logits(kind, q, k, key_mask, params, floor, soft_floor)
    rows = key_mask[:, None, :]                                           # (S,1,N) rows that count
    nrows = max(int(key_mask.sum()), 1)
    ce = -(a * np.where(key_mask[:, None, None, :], logb, 0)).sum(-1)     # (S,H,N)
    per_head = np.where(rows, ce, 0).sum(axis=(0, 2)) / nrows
    loss = float(per_head.mean())
    grads: Params = {}
    learnable = get_attention(kind).learnable
    if grad and learnable:
        b = np.exp(logb)
        G = np.where(rows[..., None] & key_mask[:, None, None, :], b - a, 0) / q.dtype.type(nrows * H)
        if soft_floor is not None:
            Gdot = (G * dlog_soft).astype(q.dtype)                         # through log g(dot)
        else:
            Gdot = np.where(dot > floor, G / clipped, 0).astype(q.dtype)  # through log max(dot, floor)
        dfq = np.matmul(Gdot, fk)
        dfk = np.matmul(np.swapaxes(Gdot, -1, -2), fq)
        dsk = G.sum(-2).astype(q.dtype)
        gq = feature_backward(kind, q, params, dfq, np.zeros(q.shape[:-1], q.dtype))
        gk = feature_backward(kind, k, params, dfk, dsk)
        grads = {n: (gq[n] + gk[n]).astype(q.dtype) for n in learnable}
    return loss, per_head, grads


def teacher_entropy(q: np.ndarray, k: np.ndarray, key_mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Mean row entropy of the softmax rows per head (H,): cross-entropy minus this is the
    KL divergence KL(a || b).

    Parameters
    ----------
    q, k : ndarray (S, H, N, d)
    key_mask : ndarray of bool (S, N), optional

    Returns
    -------
    ndarray (H,)

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> bool((fd.teacher_entropy(q, k) <= np.log(6)).all())
    True
    """
    q = np.asarray(q)
    S, H, N, _ = q.shape
    key_mask = np.ones((S, N), bool) if key_mask is None else np.asarray(key_mask)
    a = teacher_rows(q, k, key_mask)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(a > 0, a * np.log(a), 0).sum(-1)
    return np.where(key_mask[:, None, :], ent, 0).sum(axis=(0, 2)) / max(int(key_mask.sum()), 1)


# --------------------------------------------------------------------- fitting


@dataclass
class FitResult:
    """What :func:`fit_kernels` returns.

    Parameters
    ----------
    params : dict of ndarray
        The best parameters per head (by held-out loss).
    best_val : ndarray (H,)
        Held-out cross-entropy of the returned parameters.
    steps : int
        Steps taken.
    stopped_early : bool
        Whether patience ran out.
    val_loss, train_loss : list of ndarray (H,)
        The history, one entry per evaluation.

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> params = fd.get_attention("flex_s").init(2, 4, num_features=8, rng=0)
    >>> result = fd.fit_kernels("flex_s", (q, k, None), (q, k, None), params, steps=5, progress=False)
    >>> result.best_val.shape, result.steps
    ((2,), 5)
    """

    params: Params
    best_val: np.ndarray
    steps: int
    stopped_early: bool
    val_loss: List[np.ndarray] = field(default_factory=list)
    train_loss: List[np.ndarray] = field(default_factory=list)


def _batch_loss(kind, data, idx, params, floor, soft_floor=None, grad=True):
    q, k, mask = data
    return distill_loss(kind, q[idx], k[idx], params, mask[idx], floor=floor, soft_floor=soft_floor, grad=grad)


def evaluate(kind: str, q, k, key_mask, params: Params, *, batch_size: int = 64,
             floor: float = DEFAULT_FLOOR) -> np.ndarray:
    """Held-out cross-entropy per head (H,), row-weighted over all sequences.

    Parameters
    ----------
    kind : str
    q, k : ndarray (S, H, N, d)
    key_mask : ndarray of bool (S, N) or None
    params : dict of ndarray
    batch_size : int, optional
    floor : float, optional

    Returns
    -------
    ndarray (H,)

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> ce = fd.evaluate("hedgehog", q, k, None, fd.get_attention("hedgehog").init(2, 4, rng=0))
    >>> bool((ce >= fd.teacher_entropy(q, k) - 1e-9).all())     # cross-entropy >= entropy
    True
    """
    q, k, key_mask, params = _check(kind, q, k, key_mask, params)
    batch_size = check_int("batch_size", batch_size)
    total = np.zeros(q.shape[1])
    rows = 0
    for lo in range(0, len(q), batch_size):
        sl = slice(lo, lo + batch_size)
        n = int(key_mask[sl].sum())
        _, per_head, _ = distill_loss(kind, q[sl], k[sl], params, key_mask[sl], floor=floor, grad=False)
        total += per_head * n
        rows += n
    return total / max(rows, 1)


def fit_kernels(kind: str, train: Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]],
                val: Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]], params: Params, *,
                steps: int = 500, lr: float = 1e-2, batch_size: int = 32, eval_every: int = 25,
                patience: int = 4, min_delta: float = 1e-4, floor: float = DEFAULT_FLOOR,
                soft_floor: Optional[float] = None, decay: bool = False, seed: int = 0,
                progress: bool = False, log: Optional[Callable[[str], None]] = None) -> FitResult:
    """Fit one kernel per head by distillation with Adam (the training loop's AdamW, no weight
    decay); keep each head's best parameters.

    Parameters
    ----------
    kind : str
        One of DISTILL_KINDS; performer and rfa have nothing to learn (their held-out
        loss is returned after zero steps, the floor of the comparison).
    train, val : (q, k, key_mask)
        Teacher queries and keys (S, H, N, d) and masks (S, N) (None: all tokens real).
    params : dict
        Initial parameters (H leading), e.g. ``get_attention(kind).init(H, d)``; not modified.
    steps, lr, batch_size : int, float, int
        Adam steps (betas 0.9 / 0.999), learning rate, sequences per step.
    eval_every, patience : int
        Evaluate on ``val`` every ``eval_every`` steps; stop when no head has improved
        by more than ``min_delta`` (relative) for ``patience`` evaluations in a row.
    soft_floor : float, optional
        The training steps' loss (:func:`distill_loss`'s ``soft_floor``); the held-out
        evaluations that pick the best parameters always use the hard ``floor``.
    decay : bool
        False: the rate stays ``lr``; True: it falls from ``lr`` to ``lr / 10`` over
        ``steps`` along a cosine (the training loop's schedule without warmup).
    progress : bool
        A one-line progress display on stderr.

    Examples
    --------
    >>> import numpy as np
    >>> import flexformer.distill as fd
    >>> rng = np.random.default_rng(0)
    >>> q, k = (0.5 * rng.standard_normal((2, 2, 6, 4)) for _ in range(2))
    >>> params = fd.get_attention("hedgehog").init(2, 4, rng=0)
    >>> before = fd.evaluate("hedgehog", q, k, None, params)
    >>> result = fd.fit_kernels("hedgehog", (q, k, None), (q, k, None), params, steps=30, progress=False)
    >>> bool((result.best_val <= before).all())
    True
    """
    if kind not in DISTILL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DISTILL_KINDS)}, got {kind!r}")
    for name, val_ in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every),
                       ("patience", patience)):
        check_int(name, val_, 0 if name == "steps" else 1)
    lr = check_positive("lr", lr)
    seed = check_int("seed", seed, 0)
    for name, data in (("train", train), ("val", val)):
        if not (isinstance(data, (tuple, list)) and len(data) == 3):
            raise ValueError(f"{name} must be a tuple (q, k, key_mask), key_mask None for none, got "
                             f"{type(data).__name__} of {len(data) if isinstance(data, (tuple, list)) else '?'}")
    _check_soft_floor(soft_floor)
    if not isinstance(decay, (bool, np.bool_)):
        raise ValueError(f"decay must be a bool, got {decay!r}")
    tq, tk, tm = train
    tq = np.asarray(tq)
    tm = np.ones(tq.shape[:1] + tq.shape[2:3], bool) if tm is None else np.asarray(tm)
    vq, vk, vm = val
    params = {n: np.array(v, dtype=tq.dtype) for n, v in params.items()}
    best = {n: v.copy() for n, v in params.items()}
    best_val = evaluate(kind, vq, vk, vm, params, floor=floor)
    result = FitResult(best, best_val.copy(), 0, False, [best_val.copy()], [])
    learn = get_attention(kind).learnable
    if not learn or steps == 0:
        return result
    rng = np.random.default_rng(seed)
    # the training loop's optimiser, without weight decay (the loss alone shapes the kernel)
    trained = {n: Parameter(params[n], kind="kernel") for n in learn}
    params.update({n: p.value for n, p in trained.items()})  # updated in place by the optimiser
    opt = AdamW(list(trained.items()), lr=lr, weight_decay=0.0)
    stale, recent = 0, []
    t0 = time.perf_counter()
    bar = ProgressLine(steps, sys.stderr) if progress else None
    for step in range(1, steps + 1):
        idx = rng.choice(len(tq), size=min(batch_size, len(tq)), replace=False)
        loss, per_head, grads = _batch_loss(kind, (tq, tk, tm), idx, params, floor, soft_floor)
        recent.append(per_head)
        for n in learn:
            trained[n].grad[...] = grads[n]
        opt.step(lr_at(step - 1, base_lr=lr, warmup=0, total=steps) if decay else lr)
        if step % eval_every == 0 or step == steps:
            cur = evaluate(kind, vq, vk, vm, params, floor=floor)
            best_before = best_val.copy()
            result.val_loss.append(cur)
            result.train_loss.append(np.mean(recent, axis=0))
            recent = []
            better = cur < best_val
            for n in params:  # per head: keep the best
                sel = better.reshape((-1,) + (1,) * (params[n].ndim - 1))
                best[n] = np.where(sel, params[n], best[n])
            best_val = np.where(better, cur, best_val)
            stale = 0 if (cur < best_before * (1 - min_delta)).any() else stale + 1
            msg = (f"{kind}: step {step}/{steps}  train {result.train_loss[-1].mean():.4f}  "
                   f"held-out {cur.mean():.4f} (best {best_val.mean():.4f})  {time.perf_counter() - t0:.0f}s")
            if bar is not None:
                bar.show(step, msg)
            if log is not None:
                log(msg)
            if stale >= patience:
                result.stopped_early = True
                break
    if bar is not None:
        bar.close()
    result.params, result.best_val, result.steps = best, best_val, step
    return result

__all__ = ["DISTILL_KINDS", "FitResult", "attention_rows", "distill_loss", "evaluate", "fit_kernels", "teacher_entropy", "teacher_rows"]
