"""Kernel threads: the OpenMP settings every C kernel call reads (re-exported as
``flexformer.set_num_threads`` and friends)."""
from __future__ import annotations

import numpy as np

from . import _C


def openmp_enabled() -> bool:
    """True when the C kernels were built with OpenMP (False: serial build).

    Returns
    -------
    bool

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.openmp_enabled() in (True, False)
    True
    """
    return bool(_C.openmp_enabled())


def set_num_threads(n: int) -> None:
    """Threads for later kernel calls from any Python thread; 0 restores the OpenMP default
    (``OMP_NUM_THREADS`` or the core count). Has no effect in a serial build.

    Parameters
    ----------
    n : int
        Threads, >= 0 (0: the default).

    Raises
    ------
    TypeError
        ``n`` is not an int.
    ValueError
        ``n`` is negative.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.set_num_threads(1)
    >>> ff.get_num_threads()
    1
    >>> ff.set_num_threads(0)      # back to OpenMP's default
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    """Threads the kernels will use (1 in a serial build).

    Returns
    -------
    int

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.get_num_threads() >= 1
    True
    """
    return int(_C.get_num_threads())
