"""Checks of the public functions' scalar arguments, with messages naming them (arrays are
checked in C)."""
import math
import os
from typing import Any

import numpy as np

from ._C import all_finite


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (a Python or NumPy integer; bools refused);
    ValueError naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_sizes(**sizes: Any) -> None:
    """Each ``name=value`` an int >= 1 (:func:`check_int`)."""
    for name, value in sizes.items():
        check_int(name, value)


def check_float_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    """``dtype`` as a native NumPy dtype, float32 or float64 (either byte order: ``'>f4'``
    gives float32, as arrays of it are read); TypeError naming ``name`` otherwise."""
    try:
        dt = np.dtype(dtype).newbyteorder("=")
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be float32 or float64, got {dtype!r}") from None
    if dt not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64, got {dt}")
    return dt


def native(x: np.ndarray) -> np.ndarray:
    """``x`` in this machine's byte order. An array read from a file written on a big-endian
    machine (dtype ``'>f4'``) holds the same numbers as a native one, and the C glue converts
    it as it reads it; NumPy's dtype comparisons tell the two orders apart (``'>f4'`` is not
    float32), so the Python checks look at native arrays. A copy only for the other order."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


def check_path(name: str, value: Any):
    """A file-system path (str or os.PathLike) as a str; TypeError naming ``name`` otherwise
    (an int would be taken for an open file descriptor by os.path)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    return os.fspath(value)


def check_split(split: Any) -> str:
    """A dataset split, "train" or "test"; ValueError otherwise."""
    if not (isinstance(split, str) and split in ("train", "test")):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool; TypeError naming ``name`` unless it is a Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_real(name: str, value: Any, *, optional: bool = False):
    """``value`` as a float (None passes when ``optional``); TypeError naming ``name``."""
    if optional and value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)):
        kind = "a float or None" if optional else "a float"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    return float(value)


def check_positive(name: str, value: Any, *, zero_ok: bool = False, optional: bool = False):
    """``value`` as a finite float > 0 (>= 0 with ``zero_ok``; None passes when
    ``optional``): TypeError naming ``name`` for a non-number, ValueError for one out of range."""
    value = check_real(name, value, optional=optional)
    if value is not None and not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, got {value}")
    return value


def check_overflow(function: str, results, inputs, hint: str) -> None:
    """FloatingPointError when a kernel's ``results`` hold NaN or inf although every array in
    ``inputs`` is finite: the computation overflowed the dtype. (NaN or inf in the inputs
    pass through to the rows they reach, as documented.) One pass in C per result on the
    common path (NumPy for arrays it does not take); the inputs are looked at only when a
    result is not finite."""
    for r in results if isinstance(results, tuple) else (results,):
        if not isinstance(r, np.ndarray) or r.dtype.kind != "f":
            continue
        finite = all_finite(r)
        if finite is None:  # not a C-contiguous float32/float64 array
            finite = bool(np.isfinite(np.add.reduce(r, axis=None, dtype=np.float64))) or bool(np.isfinite(r).all())
        if finite:
            continue
        if all(np.isfinite(np.asarray(a)).all() for a in inputs if a is not None):
            raise FloatingPointError(
                f"{function}: the result overflowed {r.dtype} although every input is finite ({hint}); "
                f"scale the inputs down or use float64")
        return


#: the axis letters of check_layouts' layouts, as the messages name them
_AXES = {"B": "B", "H": "H", "I": "Nq", "J": "Nk", "N": "N", "d": "d", "e": "e", "m": "m", "F": "F"}


def check_layouts(**named):
    """Each ``name=(array, layout)`` as a float64 array, the letters of ``layout`` (one
    per axis, e.g. "BHId") bound to one size across all the arrays; a TypeError or
    ValueError naming the first array that does not fit: the NumPy code that uses it (the
    reference twins, the diagnostics) refuses what the kernels refuse, instead of
    broadcasting it."""
    bound, out = {}, []
    for name, (x, layout) in named.items():
        try:
            a = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}") from None
        axes = ", ".join(_AXES[c] for c in layout)
        if a.ndim != len(layout):
            raise ValueError(f"{name} must be a {len(layout)}-d array ({axes}), got shape {a.shape}")
        for letter, n in zip(layout, a.shape):
            size, first = bound.setdefault(letter, (n, name))
            if n != size:
                raise ValueError(f"{name} must have {_AXES[letter]} = {size} as {first} has ({axes}), "
                                 f"got shape {a.shape}")
        out.append(a)
    return out
