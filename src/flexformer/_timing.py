"""One timing helper for the demo and the benchmark harness."""
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
