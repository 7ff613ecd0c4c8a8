"""Benchmarks (`make bench`). Each `bench_*.py` module has `run() -> list[Row]`; ratios are taken in one run."""
