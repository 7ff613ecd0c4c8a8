"""Running a stack's package builds at once: the largest first, as many together as the memory allows.

One package of a CUDA stack (pytorch, cudnn, cublas) is most of the work; built one after another, the small
ones wait behind it and a machine's cores idle while one package unpacks or runs patchelf. Each job says how
much memory it may need at its peak (`Job.memory`); jobs start in order of size while the sum of the running
jobs' memory stays within the budget (a job larger than the whole budget runs alone) and at most `workers`
run. Builds are threads: their work is zlib, zstd, hashlib and patchelf, which do not hold the GIL, and a
SIGKILL ends them with the process; a stack's lead package runs its build in a child process of its thread
(torchforge.binaries.ownprocess), which dies with it (nothing outlives a killed repack).

The first failure (or Ctrl-C) stops the rest: `cancelled()` turns true, each running build raises
`Cancelled` at its next check, and `run_jobs` waits for them before it raises, so the caller's scratch folder
is removed only once nothing writes into it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Cancelled(Exception):
    """A build stopped because another failed or the run was interrupted (never shown: that cause is)."""


@dataclass(frozen=True)
class Job(Generic[T]):
    item: T
    size: int  # order: the largest starts first
    memory: int  # bytes the job may hold at its peak


def available_memory() -> int:
    """MemAvailable of /proc/meminfo (what can be had without swapping); the physical memory elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Stop:
    """The flag the builds check."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()


def _next_fitting(pending: list[Job[T]], used: int, budget: int, running: int) -> Job[T] | None:
    for job in pending:
        if running == 0 or used + job.memory <= budget:
            return job
    return None


def run_jobs(jobs: Sequence[Job[T]], build: Callable[[T, Callable[[], None]], R], *, budget: int,
             workers: int) -> list[R]:
    """`build(item, check)` for every job, results in the jobs' order. `check()` raises Cancelled once the run
    is stopping. The first exception (a build's failure, or KeyboardInterrupt here) is raised after every
    running build has ended."""
    pending = sorted(jobs, key=lambda j: -j.size)
    results: dict[int, R] = {}
    index = {id(job): n for n, job in enumerate(jobs)}
    stop = Stop()
    running: dict[Future[R], Job[T]] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="repack") as pool:
        try:
            while pending or running:
                used = sum(j.memory for j in running.values())
                job = _next_fitting(pending, used, budget, len(running)) if len(running) < workers else None
                if job is not None:
                    pending.remove(job)
                    running[pool.submit(build, job.item, stop.check)] = job
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    results[index[id(running.pop(future))]] = future.result()  # raises the build's failure
        except BaseException:
            stop.set()
            _drain(running)
            raise
    return [results[n] for n in range(len(jobs))]


def _drain(running: dict[Future[R], Job[T]]) -> None:
    """Wait until every running build has stopped; a second Ctrl-C meanwhile does not abandon them."""
    while running:
        try:
            done, _ = wait(running)
        except KeyboardInterrupt:
            continue
        for future in done:
            running.pop(future)
