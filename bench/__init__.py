"""Benchmarks (`make bench`). Each `bench_*.py` module has `run(quick: bool) -> list[Row]`; ratios are taken in one run.

`quick` (`python -m bench --quick`, `make bench-quick`, run by CI): every benchmark once at small sizes, so a
broken benchmark fails CI; its figures are not measurements and nothing asserts a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    benchmark: str
    measure: str
    value: str
    note: str = ""
    ok: bool = True  # False: the benchmark could not measure (a build failed); `python -m bench` exits 1
    skipped: str = ""  # why it did not run (podman missing ...): reported as a skip in the last lines, never as a pass


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Best wall time of `repeat` calls, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
