"""Timing helpers for the demo, the benchmark harness and the tests."""
import time
from typing import Callable

import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 3) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls
    (the first calls also pay for fresh pages and thread start-up)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def idle_cpu_ms(fn: Callable[[], object], pause: float = 0.2, repeats: int = 5) -> float:
    """Median CPU time (ms, every thread of the process) burnt while the process sleeps
    ``pause`` seconds right after a call of ``fn``, over ``repeats`` calls after one
    untimed: what idle threads still polling for work take from the machine (POSIX)."""
    import resource  # POSIX only: imported here so that the module loads everywhere
    fn()
    burnt = []
    for _ in range(repeats):
        fn()
        use = resource.getrusage(resource.RUSAGE_SELF)
        before = use.ru_utime + use.ru_stime
        time.sleep(pause)
        use = resource.getrusage(resource.RUSAGE_SELF)
        burnt.append((use.ru_utime + use.ru_stime - before) * 1e3)
    return float(np.median(burnt))
