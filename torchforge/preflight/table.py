"""The data of the build's preflight (torchforge/data/preflight.toml: the per-job memory budgets, the free disk
figures, the tools and CUDA libraries a build needs), loaded once and validated, and the figures read from it:
MAX_JOBS from memory and cores, the free space a build needs.
"""

from __future__ import annotations

import math
import os
from functools import cache
from typing import Literal

from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import DataError, UsageError


class PackageJob(FrozenModel):
    """One package's peak memory per compile job, and where the figure comes from (measured or reported)."""

    gib: float
    source: str


class Jobs(FrozenModel):
    gib_per_job_cuda: float
    gib_per_job_cpu: float
    reserve_gib: float
    reserve_cores: int
    max_jobs: int
    max_jobs_aarch64_cuda: int
    max_jobs_per_core: int
    packages: dict[str, PackageJob] = {}  # by conda/PyPI name: that package's budget instead of gib_per_job_*


class Disk(FrozenModel):
    min_free_gib_cuda: float
    min_free_gib_cpu: float
    reason: str
    min_free_gib_extensions: float  # a plan that compiles no pytorch source: extensions (and repacks) alone
    extensions_reason: str


class Tool(FrozenModel):
    why: str
    fix: str
    clone_only: bool = False  # needed only when a source is cloned (not for a local --source or MAGMA's tarball)


class CudaLibrary(FrozenModel):
    headers: tuple[str, ...]
    libraries: tuple[str, ...]  # file name prefixes: libcublas.so matches libcublas.so.13 too
    needed_by: tuple[Literal["magma", "pytorch"], ...]
    include_env: tuple[str, ...] = ()
    library_env: tuple[str, ...] = ()
    system_include: tuple[str, ...] = ()
    system_library: tuple[str, ...] = ()
    fix: str


class PreflightTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    jobs: Jobs
    disk: Disk
    tools: dict[str, Tool]
    cuda_libraries: dict[str, CudaLibrary] = {}


def parse_table(text: str, where: str = "torchforge/data/preflight.toml") -> PreflightTable:
    table = parse_table_as(PreflightTable, text, where)
    for key in ("gib_per_job_cuda", "gib_per_job_cpu"):
        if getattr(table.jobs, key) <= 0:
            raise DataError(f"{where} jobs.{key} must be positive")
    for name, package in table.jobs.packages.items():
        if package.gib <= 0 or not package.source.strip():
            raise DataError(f"{where} jobs.packages.{name}: gib must be positive and source must say where it comes from")
    if min(table.jobs.max_jobs, table.jobs.max_jobs_aarch64_cuda, table.jobs.max_jobs_per_core) < 1:
        raise DataError(f"{where} jobs.max_jobs, jobs.max_jobs_aarch64_cuda and jobs.max_jobs_per_core must be at least 1")
    return table


@cache
def load_table() -> PreflightTable:
    text = data_text("preflight")
    return parse_table(text)


def per_job_gib(package: str | None, *, cuda: bool, table: PreflightTable | None = None) -> tuple[float, str]:
    """The memory one compile job of `package` is budgeted (its own figure, else the default) and its source."""
    jobs = (table or load_table()).jobs
    if package in jobs.packages:
        return jobs.packages[package].gib, jobs.packages[package].source
    return (jobs.gib_per_job_cuda, "the default per nvcc job") if cuda else (jobs.gib_per_job_cpu, "the default per compile job")


def memory_jobs(mem_available_gib: float, *, cuda: bool, table: PreflightTable | None = None,
                per_job: float | None = None) -> int:
    """How many compile jobs fit in memory (may be 0: not even one job's budget is free)."""
    jobs = (table or load_table()).jobs
    per_job = per_job or (jobs.gib_per_job_cuda if cuda else jobs.gib_per_job_cpu)
    return max(0, math.floor((mem_available_gib - jobs.reserve_gib) / per_job))


def choose_max_jobs(cores: int, mem_available_gib: float | None, *, cuda: bool, aarch64: bool = False,
                    table: PreflightTable | None = None, per_job: float | None = None) -> int:
    """MAX_JOBS = min(cores - reserve, CI cap, jobs that fit in memory), at least 1."""
    jobs = (table or load_table()).jobs
    cap = jobs.max_jobs_aarch64_cuda if (aarch64 and cuda) else jobs.max_jobs
    candidates = [cores - jobs.reserve_cores, cap]
    if mem_available_gib is not None:
        candidates.append(memory_jobs(mem_available_gib, cuda=cuda, table=table, per_job=per_job))
    return max(1, min(candidates))


def checked_jobs(jobs: int | None, extra_env: tuple[tuple[str, str], ...], cores: int | None = None,
                 table: PreflightTable | None = None) -> int | None:
    """The MAX_JOBS asked for (--jobs or --env MAX_JOBS; None: torchforge chooses), refused before anything runs
    when this machine cannot run that many compile jobs (a huge value hangs GNU make's jobserver)."""
    cores = cores or os.cpu_count() or 1
    limit = cores * (table or load_table()).jobs.max_jobs_per_core
    from_env = dict(extra_env).get("MAX_JOBS")
    asked = [(f"--jobs {jobs}", jobs)] if jobs is not None else []
    if from_env is not None:  # parse_env checked that it is a whole number from 1
        asked.append((f"--env MAX_JOBS={from_env}", int(from_env)))
    for flag, value in asked:
        if value > limit:
            raise UsageError(f"{flag} is more than this machine can run: {cores} cores x "
                             f"{(table or load_table()).jobs.max_jobs_per_core} jobs per core = {limit} at most",
                             f"use {limit} or less, or leave --jobs out (torchforge chooses from memory and cores)")
    if len(asked) == 2 and asked[0][1] != asked[1][1]:
        raise UsageError(f"{asked[0][0]} and {asked[1][0]} disagree", "give one of them")
    return asked[0][1] if asked else None


# The table's free-space figure is an estimate for a whole PyTorch build; a team that measured its own (one arch,
# an extension only) or a test suite building kilobyte stand-ins sets the figure it needs here.
MIN_FREE_VARIABLE = "TORCHFORGE_MIN_FREE_GIB"


def disk_need_gib(cuda: bool, table: PreflightTable, *, extensions_only: bool = False) -> tuple[float, str]:
    """The free space a build needs under its output folder, and where that figure comes from (`extensions_only`:
    the plan compiles no pytorch source, so the measured extension figure applies)."""
    given = os.environ.get(MIN_FREE_VARIABLE, "").strip()
    if not given and extensions_only:
        return table.disk.min_free_gib_extensions, table.disk.extensions_reason
    if not given:
        return (table.disk.min_free_gib_cuda if cuda else table.disk.min_free_gib_cpu), table.disk.reason
    try:
        need = float(given)
    except ValueError:
        need = math.nan
    if not math.isfinite(need) or need < 0:
        raise UsageError(f"{MIN_FREE_VARIABLE}={given!r} is not a number of GiB",
                         f"set it to the free space your builds need, e.g. {MIN_FREE_VARIABLE}=12, or unset it for "
                         "the data's estimate")
    return need, f"{MIN_FREE_VARIABLE} in the environment"
