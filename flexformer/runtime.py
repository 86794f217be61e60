"""What the process gives the C kernels: the extension itself (loaded with the kernel
threads' spin setting), the kernel threads, the memory kept between calls (the block cache
and the causal backward's chunk cache, with their environment variables) and the code
paths chosen for this CPU. Every other module reaches the kernels through ``_C`` here;
``flexformer`` re-exports the public functions."""
from __future__ import annotations

import os

import numpy as np

#: Polls a kernel thread makes, once a call is over, before it sleeps (libgomp's
#: ``GOMP_SPINCOUNT``, read once, when the C extension loads libgomp). libgomp's default of
#: 300,000 kept a core busy for about 9 ms after every call on the project's Zen 4, slowing
#: whatever ran next there: a NumPy product (on 2 OpenBLAS threads) right after an attention
#: call took 1.6x its time at N = 4096. 50,000 polls are about 1.5 ms there: long enough to
#: find most calls of a training step still awake (waking a sleeping thread cost a call
#: about 80 us on that machine). ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set before the
#: import wins.
KERNEL_THREAD_SPIN = 50_000

_spin_chosen = "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ
if not _spin_chosen:
    os.environ["GOMP_SPINCOUNT"] = str(KERNEL_THREAD_SPIN)
try:
    from . import _C
except ImportError:
    _here = os.path.dirname(os.path.abspath(__file__))
    if any(name.startswith("_C.") for name in os.listdir(_here)):
        raise  # built but not loadable: the loader's own message says why
    _root = os.path.dirname(_here)
    raise ImportError(f"flexformer's C extension is not built in {_here}: run `pip install {_root}` (or "
                      f"`pip install -e {_root}` to work on it)") from None
finally:
    if not _spin_chosen:  # read by now: the environment goes back as it was, for child processes too
        del os.environ["GOMP_SPINCOUNT"]


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


def _mib(mib) -> float:
    """A budget in MiB as a float; the C side checks the range (0 to 1,048,576)."""
    if isinstance(mib, bool) or not isinstance(mib, (int, float, np.integer, np.floating)):
        raise TypeError(f"mib must be a number, got {type(mib).__name__}")
    return float(mib)


def set_buffer_cache(mib: float) -> None:
    """Bound the memory kept for reuse between kernel calls, in MiB (default 256; 0 keeps
    nothing and frees what is kept).

    Output arrays and kernel workspaces of 1 MiB or more come from a cache of blocks that
    earlier results and calls gave back, matched by exact size, so that a loop calling the
    kernels with the same shapes reuses memory that is already mapped instead of having the
    operating system fault in and clear fresh pages (about 10% of a Flexformer forward +
    backward at N = 4096). Up to this many bytes of freed blocks stay allocated to the
    process; :func:`buffer_cache_info` shows how many.

    Parameters
    ----------
    mib : float
        The bound in MiB, 0 to 1,048,576.

    Raises
    ------
    TypeError
        ``mib`` is not a number.
    ValueError
        ``mib`` is outside that range.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.set_buffer_cache(64)
    >>> ff.buffer_cache_info()["limit"] == 64 * 2**20
    True
    >>> ff.set_buffer_cache(256)
    """
    _C.set_buffer_cache(_mib(mib))


def _budget_from_environment(variable: str, setter) -> None:
    """``variable`` (FLEXFORMER_BUFFER_CACHE_MIB, FLEXFORMER_CAUSAL_CACHE_MIB), when set,
    sets its budget once, at import (0: off, e.g. the block cache under AddressSanitizer,
    which cannot see inside reused blocks)."""
    value = os.environ.get(variable, "").strip()
    if value:
        try:
            setter(float(value))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{variable}={value!r}: {exc}") from None


def set_causal_cache(mib: float) -> None:
    """Bound the memory the causal backward may spend keeping each chunk's features and
    weights between its two sweeps, in MiB (default 256; 0 recomputes them instead).
    Beyond the bound the kernel recomputes; the gradients are the same bit for bit either
    way. ``FLEXFORMER_CAUSAL_CACHE_MIB``, when set, is read once, at import.

    Parameters
    ----------
    mib : float
        The budget in MiB, 0 to 1,048,576.

    Raises
    ------
    TypeError
        ``mib`` is not a number.
    ValueError
        ``mib`` is outside that range.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.set_causal_cache(128)
    >>> ff.causal_cache_limit() == 128 * 2**20
    True
    >>> ff.set_causal_cache(256)
    """
    _C.set_causal_cache(_mib(mib))


def causal_cache_limit() -> int:
    """The causal backward's chunk-cache budget in bytes (:func:`set_causal_cache`).

    Returns
    -------
    int

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.causal_cache_limit() >= 0
    True
    """
    return int(_C.causal_cache_limit())


def isa_level() -> int:
    """The x86-64 micro-architecture level whose kernel code paths run: 4 (AVX-512), 3
    (AVX2 and FMA) or 2 (baseline), chosen once from the CPU and capped by
    ``FLEXFORMER_CPU_LEVEL``; 0 for a build without run-time dispatch (not x86-64 GCC,
    or ``FF_NO_CLONES``). Benchmarks print it beside their timings.

    Returns
    -------
    int
        0, 2, 3 or 4.

    Examples
    --------
    >>> import flexformer as ff
    >>> ff.isa_level() in (0, 2, 3, 4)
    True
    """
    return int(_C.isa_level())


def dense_paths(dtype=np.float32) -> dict:
    """The code copies that run the kernels' dense products and their row dots (a matrix
    times one vector: a recurrent step's projections) for ``dtype``: ``"avx512"``,
    ``"avx512_4x4"``, ``"avx2"``, ``"base"`` or ``"plain"``, and how the products treat rows
    that start off a 64-byte cache line (NumPy puts a large array 16 bytes into one).

    At level 4 the products have two AVX-512 copies (an 8 x 2 and a 4 x 4 tile of vectors)
    and an AVX2 copy; the first product in a process times the three on blocks of the
    kernels' shapes and keeps the fastest, then times whether that AVX-512 tile runs faster
    copying rows off a line to an aligned panel first (``"copy"``) or reading them where
    they are (``"in_place"``). Every choice gives bit-identical results.
    ``FLEXFORMER_TILES=avx2``, ``avx512`` or ``avx512_4x4`` and
    ``FLEXFORMER_OFF_LINE_ROWS=copy`` or ``in_place`` decide instead. Benchmarks print it
    beside their timings.

    Parameters
    ----------
    dtype : numpy dtype, optional
        float32 (default) or float64: each dtype is timed on its own.

    Returns
    -------
    dict
        ``{"products": ..., "row_dots": ..., "off_line_rows": ...}``; ``"off_line_rows"`` is
        ``"in_place"`` wherever no AVX-512 copy runs the products.

    Raises
    ------
    TypeError
        ``dtype`` is not float32 or float64.

    Examples
    --------
    >>> import numpy as np, flexformer as ff
    >>> sorted(ff.dense_paths(np.float64))
    ['off_line_rows', 'products', 'row_dots']
    """
    from ._checks import check_float_dtype  # here: _checks imports _C, which this module loads first

    dt = check_float_dtype(dtype)
    products, off_line_rows = _C.dense_copies(dt == np.float64)
    # the row dots have no AVX-512 copy: AVX2 at most
    row_dots = products if products in ("plain", "base") else "avx2"
    return {"products": products, "row_dots": row_dots, "off_line_rows": off_line_rows}


_budget_from_environment("FLEXFORMER_BUFFER_CACHE_MIB", set_buffer_cache)
_budget_from_environment("FLEXFORMER_CAUSAL_CACHE_MIB", set_causal_cache)


def buffer_cache_info() -> dict:
    """The block cache's state: ``blocks`` and ``bytes`` held now, ``limit`` in bytes, and
    ``hits`` / ``misses`` counted over the large allocations so far.

    Returns
    -------
    dict
        ``blocks``, ``bytes``, ``limit``, ``hits`` and ``misses``.

    Examples
    --------
    >>> import flexformer as ff
    >>> sorted(ff.buffer_cache_info())
    ['blocks', 'bytes', 'hits', 'limit', 'misses']
    """
    return dict(_C.buffer_cache_info())
