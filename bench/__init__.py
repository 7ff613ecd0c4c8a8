"""Benchmarks (`make bench`). Each `bench_*.py` module has `run() -> list[Row]`; ratios are taken in one run."""

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


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Best wall time of `repeat` calls, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


