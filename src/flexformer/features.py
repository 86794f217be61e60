"""NumPy twins of the C feature maps in their split form phi(x) = exp(s(x)) f(x), |f| <= 1,
with gradients with respect to the kernel parameters.

The C kernels never return features (they consume them in tiles); code that needs them
outside a kernel call (recurrent decoding, distillation, plots) uses these. Each map takes
x (B, H, T, d) and returns (f (B, H, T, F), s (B, H, T)) in x's dtype, the same split as
``csrc/featmap_*.inc``, so a guard or a stabiliser built on it matches the kernels.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np

Params = Dict[str, np.ndarray]

#: parameter names of each kind, in the registry's order
PARAM_NAMES = {"flex_s": ("omega",), "rfa": ("omega",), "flex_n": ("omega1", "omega2", "tau"),
               "performer": ("omega",), "hedgehog": ("W",), "linear": (), "elu": (), "softmax": (),
               "linformer": ("E", "F")}
_LAYOUTS = {"tau": "(H,)", "W": "(H, d, m)"}  # the frequency arrays are (H, m, d)


def require_params(kind: str, params) -> None:
    """ValueError naming what is missing unless ``params`` has every name ``kind`` needs."""
    missing = [n for n in PARAM_NAMES[kind] if n not in params]
    if missing:
        raise ValueError(f"params for {kind} need {', '.join(PARAM_NAMES[kind])}; missing {', '.join(missing)}")


def check_param_shapes(params: Params, H: int, d: int) -> None:
    """ValueError naming the parameter whose shape does not fit H heads of size d."""
    for n, x in params.items():
        if n == "tau":
            fits = x.shape == (H,)
        else:
            fits = x.ndim == 3 and x.shape[0] == H and x.shape[1 if n == "W" else 2] == d
        if not fits:
            raise ValueError(f"{n} must have shape {_LAYOUTS.get(n, '(H, m, d)')} with H = {H}, d = {d}; "
                             f"got {x.shape}")


#: the parameters :func:`feature_backward` differentiates (rfa and performer keep theirs fixed)
LEARNABLE = {"flex_s": ("omega",), "flex_n": ("omega1", "omega2", "tau"), "hedgehog": ("W",)}


def _proj(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.einsum("bhtd,hmd->bhtm", x, W.astype(x.dtype, copy=False))


def _flex_s(x, p):
    omega = p["omega"]
    u = _proj(x, omega)
    f = np.concatenate([np.cos(u), np.sin(u)], axis=-1) * x.dtype.type(1.0 / np.sqrt(omega.shape[1]))
    return f, (x * x).sum(-1) * x.dtype.type(1.0 / (2.0 * np.sqrt(x.shape[-1])))


def _flex_n(x, p):
    a, b = _proj(x, p["omega1"]), _proj(x, p["omega2"])
    c = x.dtype.type(1.0 / np.sqrt(4.0 * p["omega1"].shape[1]))
    f = np.concatenate([np.cos(a) + np.cos(b), np.sin(a) + np.sin(b)], axis=-1) * c
    coef = np.exp(-np.asarray(p["tau"], dtype=x.dtype))[None, :, None]
    return f, (x * x).sum(-1) * coef


def _performer(x, p):
    xs = x * x.dtype.type(x.shape[-1] ** -0.25)
    u = _proj(xs, p["omega"])
    c = u.max(-1)
    f = np.exp(u - c[..., None]) * x.dtype.type(1.0 / np.sqrt(p["omega"].shape[1]))
    return f, c - x.dtype.type(0.5) * (xs * xs).sum(-1)


def _hedgehog(x, p):
    u = np.einsum("bhtd,hdm->bhtm", x, p["W"].astype(x.dtype, copy=False))
    z = np.concatenate([u, -u], axis=-1)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True), np.zeros(x.shape[:-1], x.dtype)


def _normalised(phi):
    norm = np.sqrt((phi * phi).sum(-1))
    safe = np.where(norm > 0, norm, 1)
    f = np.where(norm[..., None] > 0, phi / safe[..., None], 0).astype(phi.dtype)
    s = np.where(norm > 0, np.log(safe), -np.inf).astype(phi.dtype)
    return f, s


def _linear(x, p):
    return _normalised(x)


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1 (Katharopoulos et al., 2020), in x's dtype: the elu kind's feature map."""
    x = np.asarray(x)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def elu_plus_one_grad(x: np.ndarray) -> np.ndarray:
    """d(elu(x) + 1)/dx, in x's dtype."""
    x = np.asarray(x)
    return np.where(x > 0, 1, np.exp(np.minimum(x, 0))).astype(x.dtype)


def _elu(x, p):
    return _normalised(elu_plus_one(x))


_FORWARD: Dict[str, Callable] = {"flex_s": _flex_s, "rfa": _flex_s, "flex_n": _flex_n, "performer": _performer,
                                 "hedgehog": _hedgehog, "linear": _linear, "elu": _elu}


def features(kind: str, x: np.ndarray, params: Params) -> Tuple[np.ndarray, np.ndarray]:
    """(f, s) of ``kind`` for x (B, H, T, d): phi(x) = exp(s) f."""
    if kind not in _FORWARD:
        raise ValueError(f"kind must be one of {', '.join(sorted(_FORWARD))}, got {kind!r}")
    return _FORWARD[kind](x, params)


def num_features(kind: str, params: Params, d: int) -> int:
    """F, the length of f for this kind and parameters."""
    if kind in ("flex_s", "rfa"):
        return 2 * params["omega"].shape[1]
    if kind == "hedgehog":
        return 2 * params["W"].shape[2]
    if kind == "flex_n":
        return 2 * params["omega1"].shape[1]
    if kind == "performer":
        return params["omega"].shape[1]
    return d  # linear (the features are the inputs) and elu


def feature_backward(kind: str, x: np.ndarray, params: Params, df: np.ndarray, ds: np.ndarray) -> Params:
    """Gradients of the learnable parameters (``LEARNABLE[kind]``) given df (B,H,T,F) and
    ds (B,H,T), the gradients with respect to f and s at x."""
    if kind == "flex_s":
        omega = params["omega"]
        m = omega.shape[1]
        u = _proj(x, omega)
        c = x.dtype.type(1.0 / np.sqrt(m))
        du = c * (np.cos(u) * df[..., m:] - np.sin(u) * df[..., :m])
        return {"omega": np.einsum("bhtm,bhtd->hmd", du, x)}
    if kind == "flex_n":
        m = params["omega1"].shape[1]
        a, b = _proj(x, params["omega1"]), _proj(x, params["omega2"])
        c = x.dtype.type(1.0 / np.sqrt(4.0 * m))
        dfc, dfs = df[..., :m], df[..., m:]
        da = c * (np.cos(a) * dfs - np.sin(a) * dfc)
        db = c * (np.cos(b) * dfs - np.sin(b) * dfc)
        s = (x * x).sum(-1) * np.exp(-np.asarray(params["tau"], dtype=x.dtype))[None, :, None]
        return {"omega1": np.einsum("bhtm,bhtd->hmd", da, x), "omega2": np.einsum("bhtm,bhtd->hmd", db, x),
                "tau": -(ds * s).sum(axis=(0, 2))}
    if kind == "hedgehog":
        f, _ = _hedgehog(x, params)
        m = params["W"].shape[2]
        dz = f * (df - (f * df).sum(-1, keepdims=True))
        return {"W": np.einsum("bhtd,bhtm->hdm", x, dz[..., :m] - dz[..., m:])}
    if kind in _FORWARD:
        return {}
    raise ValueError(f"kind must be one of {', '.join(sorted(_FORWARD))}, got {kind!r}")
