"""MAX_JOBS of one build step, chosen when it starts: its package's per-job peak (preflight.toml [jobs.packages]),
the memory available then (torchforge/buildmemory.py), and the jobs its last build ran if that one was killed for
memory (the rerun plans half). What the user gave (--jobs, --env MAX_JOBS) is kept: the kill is then only said."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchforge.buildmemory import Kill, after_kill, available_memory, package_name, record_kill, recorded_kills
from torchforge.preflight.table import choose_max_jobs, per_job_gib


@dataclass(frozen=True)
class StepJobs:
    """The MAX_JOBS of one build and the sentences the log and the build's events carry about it."""

    jobs: int
    basis: str  # why this many (the package's budget and the memory)
    rerun: str = ""  # what a kill of the last build changed ("" when none)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def step_jobs(out: Path, stem: str, given: int, *, sized: bool, cuda: bool, aarch64: bool) -> StepJobs:
    """`given`: the plan's MAX_JOBS (preflight's choice, or the user's where `sized` is False)."""
    package = package_name(stem)
    kill = recorded_kills(out).get(package)
    if not sized:
        note = (f"its last build was killed for memory with MAX_JOBS {kill.jobs} ({kill.why}); MAX_JOBS {given} "
                "as given (leave --jobs out and torchforge plans fewer)") if kill is not None else ""
        return StepJobs(given, f"MAX_JOBS {given} as given", note)
    per_job, source = per_job_gib(package, cuda=cuda)
    memory = available_memory()
    jobs = choose_max_jobs(_cores(), memory.gib, cuda=cuda, aarch64=aarch64, per_job=per_job)
    basis = f"MAX_JOBS {jobs} for {package}: {_cores()} cores, {memory.basis}, {per_job:g} GiB per job ({source})"
    jobs, note = after_kill(jobs, kill)
    return StepJobs(jobs, basis, note)


def record_outcome(out: Path, stem: str, jobs: int, why: str | None, peak_rss_kib: int) -> str:
    """After a build: a kill for memory recorded for the rerun (and the sentence saying so), else nothing."""
    if why is None:
        return ""
    peak = round(peak_rss_kib / 1024**2, 2) if peak_rss_kib else None
    record_kill(out, package_name(stem), Kill(jobs, why, peak))
    fewer = max(1, jobs // 2)
    rerun = (f"the rerun plans MAX_JOBS {fewer}" if jobs > 1 else "MAX_JOBS was 1 already: add memory or swap")
    return f"out of memory with MAX_JOBS {jobs}: {why}; {rerun}"


def log_peak(log: Path, peak_rss_kib: int) -> None:
    """The build's peak memory, as its log's own line."""
    if peak_rss_kib:
        with log.open("a") as handle:
            handle.write(f"torchforge: peak memory {peak_rss_kib / 1024**2:.2f} GiB (the largest process of the build)\n")
