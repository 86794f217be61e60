"""Kernel threads: the OpenMP settings every C kernel call reads (re-exported as
``flexformer.set_num_threads`` and friends)."""
from __future__ import annotations

import numpy as np

from . import _C


def openmp_enabled() -> bool:
    """True when the C kernels were built with OpenMP (False: serial build)."""
    return bool(_C.openmp_enabled())


def set_num_threads(n: int) -> None:
    """Threads for later kernel calls from any Python thread; 0 restores the OpenMP default
    (``OMP_NUM_THREADS`` or the core count). Has no effect in a serial build."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    """Threads the kernels will use (1 in a serial build)."""
    return int(_C.get_num_threads())
