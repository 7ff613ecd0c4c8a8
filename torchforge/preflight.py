"""Preflight: check the machine before a multi-hour build and report every problem at once, each with its fix.

`run_machine_checks(needs, engine=..., jobs=..., runner=..., out=...)` returns a `PreflightReport` of the checks
every flavour's plan gets, read from its neutral `MachineNeeds`; it never raises for a failed check (the caller prints
the whole table first, then `report.raise_if_failed()`). The official flavour runs the same checks from its
variants (torchforge/officialpreflight.py).
Checks: the selection itself (refused variants), platform, build engine and version, nvcc == requested CUDA,
host compiler within that CUDA's limit, cuBLAS/cuSPARSE (and cuDNN for pytorch) in that CUDA's toolkit, cmake/git/patchelf, free disk, MAX_JOBS from memory and cores, a local
source tree's submodules, and, where nvidia-smi exists, the driver against each CUDA runtime (errors 35/803/804).

Thresholds live in torchforge/data/preflight.toml and version facts in cuda.toml; this module holds no numbers.
Every subprocess goes through `torchforge.proc.Runner`.
"""

from __future__ import annotations

import math
import os
import platform as host_platform
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Literal

from rich.table import Table

from torchforge import channelcheck
from torchforge.buildmemory import available_memory, read_mem_available_gib  # noqa: F401 (re-exported)
from torchforge import data as tables
from torchforge.config import SiteConfig
from torchforge.containers import (TOOL_VARIABLE, ContainerSettings, accel_name, check_cudnn, describe, image_for,
                                   no_tool, reference, require_image)
from torchforge.data import FrozenModel, Meta, data_text, parse_table_as
from torchforge.engines.conda_build import probe as conda_build_probe
from torchforge.engines.pip_wheel import NAME as PIP_ENGINE
from torchforge.engines.pip_wheel import PipWheelEngine
from torchforge.errors import DataError, ForgeError, PreflightError, UsageError
from torchforge.proc import Command, Runner
from torchforge.flavours.base import MachineNeeds

ENGINES = ("auto", "conda-build", "rattler-build")
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_GITMODULES_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)
_SUBMODULE_DEPTH = 3  # PyTorch nests submodules two levels deep (third_party/*/third_party/*)


# ---- data ------------------------------------------------------------------------------------------------


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


# ---- report ----------------------------------------------------------------------------------------------


class Level(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Level
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class PreflightReport:
    checks: tuple[Check, ...]
    max_jobs: int
    engine: str  # the engine the checks were made for ("auto" resolved)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status is Level.FAIL)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def raise_if_failed(self) -> None:
        if self.failures:
            names = ", ".join(c.name for c in self.failures)
            raise PreflightError(
                f"preflight: {len(self.failures)} of {len(self.checks)} checks failed ({names})",
                "fix each failed check as its row says (`torchforge doctor` re-checks); `torchforge build --skip-preflight` builds anyway",
            )

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "engine": self.engine, "max_jobs": self.max_jobs,
                "checks": [c.as_dict() for c in self.checks]}


_STYLE = {Level.OK: "green", Level.WARN: "yellow", Level.FAIL: "bold red"}


def report_table(report: PreflightReport) -> Table:
    """The report as a rich table (the caller prints it)."""
    table = Table(title=f"torchforge preflight (engine {report.engine}, MAX_JOBS {report.max_jobs})")
    for column in ("check", "status", "detail", "what would work"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status.value}[/]", c.detail, c.fix or "")
    return table


# ---- machine facts (pure functions take them as arguments) -----------------------------------------------


@dataclass(frozen=True)
class Machine:
    cores: int
    mem_available_gib: float | None  # None where /proc/meminfo is unavailable
    platform: str | None  # conda subdir of this machine, None if not one torchforge builds for
    memory_basis: str = ""  # what mem_available_gib was read from (MemAvailable, or a cgroup's limit)


def _host_subdir() -> str | None:
    machine = host_platform.machine().lower()
    if sys.platform.startswith("linux"):
        return {"x86_64": "linux-64", "amd64": "linux-64", "aarch64": "linux-aarch64", "arm64": "linux-aarch64"}.get(machine)
    if sys.platform == "win32" and machine in ("amd64", "x86_64"):
        return "win-64"
    if sys.platform == "darwin":
        return {"x86_64": "osx-64", "arm64": "osx-arm64"}.get(machine)
    return None


def probe_machine() -> Machine:
    try:
        cores = len(os.sched_getaffinity(0))  # respects taskset/cgroup CPU pinning, unlike os.cpu_count
    except AttributeError:
        cores = os.cpu_count() or 1
    memory = available_memory()
    return Machine(cores, memory.gib, _host_subdir(), memory.basis)


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


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


# ---- the checks ------------------------------------------------------------------------------------------


@dataclass
class Context:
    """One preflight's checks so far, and what they read: the plan's neutral needs of this machine."""

    runner: Runner
    machine: Machine
    needs: MachineNeeds
    checks: list[Check] = field(default_factory=list)

    @property
    def cuda_versions(self) -> list[str]:
        return list(self.needs.cuda_versions)

    @property
    def platforms(self) -> list[str]:
        return list(self.needs.platforms)

    def add(self, name: str, status: Level, detail: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, detail, fix))

    def run(self, *argv: str) -> tuple[int, str] | None:
        """(returncode, output), or None when the program cannot be started."""
        try:
            result = self.runner.run(Command(argv=argv), check=False, timeout=120)
        except ForgeError:
            return None
        return result.returncode, result.output


def check_platform(ctx: Context) -> None:
    here = ctx.machine.platform
    foreign = [p for p in ctx.platforms if p != here]
    if foreign:
        ctx.add("platform", Level.FAIL, f"this machine is {here or 'not a supported build platform'}; asked for {', '.join(foreign)}",
                "build each platform on a machine of that platform (conda-build and rattler-build build for the host)")
    else:
        ctx.add("platform", Level.OK, here or "")


def _rattler_build_version() -> str | None:
    try:
        import rattler_build
    except ImportError:
        return None
    version = getattr(rattler_build, "rattler_build_version", None)
    return str(version()) if callable(version) else "unknown"


def engine_check(engine: str) -> tuple[Check, str]:
    """The engine a build of `engine` (auto, conda-build, rattler-build) uses here, as a check, and its name."""
    if engine == PIP_ENGINE:  # --format wheel: pip in this interpreter
        if PipWheelEngine().available():
            return Check("engine", Level.OK, f"pip wheel with {sys.executable}"), engine
        return Check("engine", Level.FAIL, f"{sys.executable} has no pip", f"{sys.executable} -m ensurepip"), engine
    if engine not in ENGINES:
        return Check("engine", Level.FAIL, f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}"), engine
    found = conda_build_probe() if engine in ("auto", "conda-build") else None
    if found is not None:
        if found.usable:
            auto = " (auto: `conda build --version` runs)" if engine == "auto" else ""
            return Check("engine", Level.OK, f"conda-build {found.version}{auto}"), "conda-build"
        if engine == "conda-build":
            return Check("engine", Level.FAIL, f"`conda build --version` did not run: {found.reason}",
                         "conda install -n base conda-build, or use --engine rattler-build (embedded)"), engine
    version = _rattler_build_version()
    if version is None:
        return Check("engine", Level.FAIL, "the embedded rattler-build engine (py-rattler-build) is not importable",
                     "pip install py-rattler-build (a torchforge dependency): reinstall torchforge"), "rattler-build"
    if found is not None and found.conda is not None:
        # A `conda` that is there but does not run: say so, the build would silently use the other engine.
        return Check("engine", Level.WARN, f"embedded rattler-build {version} (auto: {found.reason})",
                     "repair that conda (or install conda-build into it), or pass --engine rattler-build"), "rattler-build"
    why = f" (auto: {found.reason})" if found is not None else ""
    return Check("engine", Level.OK, f"embedded rattler-build {version}{why}"), "rattler-build"


def check_engine(ctx: Context, engine: str) -> str:
    check, resolved = engine_check(engine)
    ctx.checks.append(check)
    return resolved


def check_nvcc(ctx: Context) -> None:
    if not ctx.cuda_versions:
        return
    try:
        nvcc = ctx.runner.which("nvcc")
    except ForgeError:
        nvcc = None
    result = ctx.run(nvcc, "--version") if nvcc else None
    found = _RELEASE.search(result[1]) if result else None
    have = f"{found.group(1)}.{found.group(2)}" if found else None
    for cuda in ctx.cuda_versions:
        name = f"nvcc (CUDA {cuda})"
        fix = (f"install the CUDA {cuda} toolkit and put its bin/ first on PATH (e.g. /usr/local/cuda-{cuda}/bin) "
               f"and CUDA_HOME at it; the official magma build refused an nvcc other than the requested CUDA")
        if nvcc is None:
            ctx.add(name, Level.FAIL, "nvcc is not on PATH", fix)
        elif have is None:
            ctx.add(name, Level.FAIL, f"`{nvcc} --version` printed no 'release X.Y'", fix)
        elif have != cuda:
            ctx.add(name, Level.FAIL, f"{nvcc} is CUDA {have}, the variant needs CUDA {cuda}", fix)
        else:
            ctx.add(name, Level.OK, f"{nvcc}: release {have}")


def check_host_compiler(ctx: Context) -> None:
    linux_cuda = ctx.cuda_versions if any(p.startswith("linux") for p in ctx.platforms) else []
    if not linux_cuda:
        return
    # PyTorch hands CUDAHOSTCXX to CMake as the CUDA host compiler; otherwise nvcc uses gcc from PATH.
    compiler = os.environ.get("CUDAHOSTCXX") or "gcc"
    result = ctx.run(compiler, "-dumpfullversion")
    version = result[1].strip() if result and result[0] == 0 else None
    toolkits = tables.load().cuda.toolkits
    for cuda in linux_cuda:
        name = f"host compiler (CUDA {cuda})"
        if version is None:
            ctx.add(name, Level.FAIL, f"`{compiler} -dumpfullversion` did not run", "install gcc (apt install build-essential) or set CUDAHOSTCXX")
            continue
        toolkit = toolkits.get(cuda)
        limit = toolkit.max_gcc if toolkit else None
        if limit is None:
            ctx.add(name, Level.WARN, f"{compiler} {version}; cuda.toml knows no GCC limit for CUDA {cuda}, not checked")
        elif _version_tuple(version)[0] > limit:
            ctx.add(name, Level.FAIL, f"{compiler} {version} is newer than CUDA {cuda} allows (GCC <= {limit}): nvcc stops with "
                    f"'unsupported GNU version! gcc versions later than {limit} are not supported'",
                    f"install gcc-{limit} (or older) and export CUDAHOSTCXX=g++-{limit} CC=gcc-{limit} CXX=g++-{limit}; "
                    "-allow-unsupported-compiler exists but is unsupported")
        else:
            ctx.add(name, Level.OK, f"{compiler} {version} (CUDA {cuda} accepts GCC <= {limit})")


def cuda_root(cuda: str, environ: dict[str, str] | None = None) -> Path:
    """The toolkit a build of `cuda` uses: $CUDA_HOME, else /usr/local/cuda-X.Y, else /usr/local/cuda."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get("CUDA_HOME"):
        return Path(environ["CUDA_HOME"])
    versioned = Path(f"/usr/local/cuda-{cuda}")
    return versioned if versioned.is_dir() else Path("/usr/local/cuda")


def _found(folders: Sequence[Path], names: Sequence[str], *, prefix: bool) -> list[str]:
    """The names (of `names`) missing from every folder; prefix: a file name that starts with it counts."""
    missing = []
    for name in names:
        hit = any((folder / name).exists() if not prefix else
                  folder.is_dir() and any(p.name.startswith(name) for p in folder.iterdir())
                  for folder in folders)
        if not hit:
            missing.append(name)
    return missing


def check_cuda_libraries(ctx: Context, table: PreflightTable) -> None:
    """cuBLAS, cuSPARSE (MAGMA and PyTorch) and cuDNN (PyTorch) of each requested CUDA: nvcc alone builds nothing."""
    if not any(p.startswith("linux") for p in ctx.platforms):
        return
    for use in ctx.needs.cuda_uses:
        cuda, packages, cudnn = use.cuda, set(use.kinds), use.cudnn or None
        root = cuda_root(cuda)
        arch_dirs = [root / "targets" / t for t in ("x86_64-linux", "sbsa-linux", "aarch64-linux")]
        for name, library in table.cuda_libraries.items():
            if not packages & set(library.needed_by):
                continue
            includes = [root / "include", *(d / "include" for d in arch_dirs),
                        *(Path(os.environ[e]) for e in library.include_env if os.environ.get(e)),
                        *(Path(p) for p in library.system_include)]
            libs = [root / "lib64", root / "lib", *(d / "lib" for d in arch_dirs),
                    *(Path(os.environ[e]) for e in library.library_env if os.environ.get(e)),
                    *(Path(p) for p in library.system_library)]
            missing = _found(includes, library.headers, prefix=False) + _found(libs, library.libraries, prefix=True)
            check = f"{name} (CUDA {cuda})"
            if missing:
                major = cuda.split(".")[0]
                fix = library.fix.format(cuda=cuda, cuda_dash=cuda.replace(".", "-"), cuda_major=major,
                                         cudnn=cudnn or f"for CUDA {major}")
                ctx.add(check, Level.FAIL, f"{', '.join(missing)} not found in the toolkit at {root}"
                        + (" or the system folders" if library.system_include else "")
                        + f" (needed by {' and '.join(sorted(packages & set(library.needed_by)))})", fix)
            else:
                ctx.add(check, Level.OK, f"{', '.join((*library.headers, *library.libraries))} in {root}"
                        + (" (or the system folders)" if library.system_include else ""))


def host_tools(table: PreflightTable, *, clones: bool) -> tuple[str, ...]:
    """The tools a build with this machine's tools uses: all of them, those that only clone where it clones."""
    return tuple(tool for tool, info in table.tools.items() if clones or not info.clone_only)


def check_tools(ctx: Context, table: PreflightTable, used: Sequence[str]) -> None:
    for tool, info in table.tools.items():
        if tool not in used:
            ctx.add(tool, Level.OK, "not needed: no source is cloned (a local --source, or MAGMA's tarball)")
            continue
        try:
            if tool == "patchelf":
                from torchforge.rpath import find_patchelf  # also checks the version (0.18.x is broken)

                found = find_patchelf(ctx.runner)
            else:
                found = ctx.runner.which(tool)
        except ForgeError as exc:
            ctx.add(tool, Level.FAIL, f"{exc.message} (needed: {info.why})", exc.hint or info.fix)
            continue
        ctx.add(tool, Level.OK, found)


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


def check_disk(ctx: Context, out: Path, table: PreflightTable, *, extensions_only: bool = False) -> None:
    where = out.resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free / 1024**3
    need, basis = disk_need_gib(bool(ctx.cuda_versions), table, extensions_only=extensions_only)
    detail = f"{free:.0f} GiB free at {where} (need {need:g} GiB)"
    if free < need:
        ctx.add("disk", Level.FAIL, detail, f"free space there or pass --out on a larger disk (the {need:g} GiB: {basis})")
    else:
        ctx.add("disk", Level.OK, detail)


def check_out(ctx: Context, out: Path) -> None:
    """The output channel folder can be written: the folder, or the nearest existing folder above it."""
    where = out.resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    read_only = where.is_dir() and bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    if read_only or not os.access(where, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        ctx.add("output folder", Level.FAIL, f"{out} cannot be written: {where} {why}",
                "pass --out a folder you can write to")
    else:
        ctx.add("output folder", Level.OK, f"{where} is writable")


def check_jobs(ctx: Context, jobs: int | None, table: PreflightTable) -> int:
    cuda = bool(ctx.cuda_versions)
    aarch64 = "linux-aarch64" in ctx.platforms
    cores, mem = ctx.machine.cores, ctx.machine.mem_available_gib
    chosen = choose_max_jobs(cores, mem, cuda=cuda, aarch64=aarch64, table=table)
    per_job = table.jobs.gib_per_job_cuda if cuda else table.jobs.gib_per_job_cpu
    mem_text = ctx.machine.memory_basis or ("memory unknown" if mem is None else f"{mem:.1f} GiB available")
    basis = f"{cores} cores, {mem_text}, {per_job:g} GiB per {'nvcc' if cuda else 'compile'} job"
    if jobs is not None:
        if jobs > chosen:
            ctx.add("MAX_JOBS", Level.WARN, f"--jobs {jobs} is more than the {chosen} that fit ({basis}); "
                    "compilers may be killed for memory or the machine may hang", f"--jobs {chosen}, or add memory/swap")
        else:
            ctx.add("MAX_JOBS", Level.OK, f"--jobs {jobs} ({basis}; {chosen} would fit)")
        return jobs
    if mem is not None and memory_jobs(mem, cuda=cuda, table=table) < 1:
        ctx.add("MAX_JOBS", Level.WARN, f"1 ({basis}: not even one job's budget is free)",
                "close other programs or add swap; expect 'Killed signal terminated program cc1plus'")
    else:
        limit = "memory" if mem is not None and memory_jobs(mem, cuda=cuda, table=table) == chosen else "cores/CI cap"
        ctx.add("MAX_JOBS", Level.OK, f"{chosen} ({basis}; limited by {limit})")
    return chosen


def _missing_submodules(root: Path, depth: int = 0) -> tuple[list[str], int]:
    """(missing or empty submodule paths relative to `root`, how many were declared), nested ones included."""
    gitmodules = root / ".gitmodules"
    if depth > _SUBMODULE_DEPTH or not gitmodules.is_file():
        return [], 0
    missing: list[str] = []
    declared = 0
    for rel in _GITMODULES_PATH.findall(gitmodules.read_text(encoding="utf-8", errors="replace")):
        declared += 1
        path = root / rel
        if not path.is_dir() or not any(path.iterdir()):
            missing.append(rel)
            continue
        nested, count = _missing_submodules(path, depth + 1)
        missing.extend(f"{rel}/{n}" for n in nested)
        declared += count
    return missing, declared


def check_source(ctx: Context, source: str | None) -> None:
    if source is None:
        ctx.add("source", Level.OK, "no --source: the recipe fetches the release source")
        return
    if "://" in source or source.startswith("git@"):
        ctx.add("source", Level.OK, f"{source} is fetched by the build; not checked here")
        return
    path = Path(source).expanduser()
    what_works = "pass a PyTorch checkout, a tarball or a URL to --source"
    if not path.exists():
        ctx.add("source", Level.FAIL, f"{path} does not exist", what_works)
        return
    if path.is_file():
        if path.stat().st_size == 0:
            ctx.add("source", Level.FAIL, f"{path} is an empty file", what_works)
        else:
            ctx.add("source", Level.OK, f"{path} is an archive; its contents are checked when it is unpacked")
        return
    if not path.is_dir():
        ctx.add("source", Level.FAIL, f"{path} is neither a folder nor an archive", what_works)
        return
    if not any(path.iterdir()):
        ctx.add("source", Level.FAIL, f"{path} is an empty folder", what_works)
        return
    if not any((path / name).is_file() for name in ("setup.py", "pyproject.toml")):
        ctx.add("source", Level.FAIL, f"{path} has no setup.py or pyproject.toml: not a PyTorch source tree",
                what_works)
        return
    fix = f"cd {path} && git submodule sync && git submodule update --init --recursive"
    missing, declared = _missing_submodules(path)
    if declared:
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            ctx.add("source", Level.FAIL, f"{len(missing)} of {declared} submodules not checked out: {shown}", fix)
        else:
            ctx.add("source", Level.OK, f"{path}: all {declared} submodules checked out")
        return
    third_party = path / "third_party"
    empty = sorted(p.name for p in third_party.iterdir() if p.is_dir() and not any(p.iterdir())) if third_party.is_dir() else []
    if empty:
        ctx.add("source", Level.FAIL, f"empty folders in {third_party}: {', '.join(empty[:6])}", fix)
    else:
        ctx.add("source", Level.OK, f"{path}: no .gitmodules, no empty third_party folder")


def _cuda_home() -> str:
    """CUDA_HOME as build.sh sets it: the environment's, else the default of eras.toml's entry."""
    entry = next((e for e in tables.load().eras.build_env if e.name == "CUDA_HOME"), None)
    default = re.search(r"\$\{CUDA_HOME:-([^}]*)\}", entry.value) if entry else None
    return os.environ.get("CUDA_HOME") or (default.group(1) if default else "")


def check_bundled(ctx: Context) -> None:
    """The libraries the recipes bundle (bundle.toml) must be where build.sh looks, or the build fails after
    the whole compile, at the copy step."""
    seen: set[tuple[str, str]] = set()
    for file in ctx.needs.host_libraries:
        folder = os.environ.get(file.dir_var) or file.dir_default.replace("$CUDA_HOME", _cuda_home())
        if (folder, file.name) in seen:
            continue
        seen.add((folder, file.name))
        name = f"bundled {file.name}"
        found = sorted(Path(folder).glob(file.name)) if Path(folder).is_dir() else []
        if found:
            ctx.add(name, Level.OK, f"{', '.join(p.name for p in found)} in {folder}")
        else:
            ctx.add(name, Level.FAIL,
                    f"no {file.name} in {folder}: {file.recipe} copies it into torch/lib as the official package did",
                    f"set {file.dir_var} to the folder that holds it (e.g. the lib/ folder of NVIDIA's pip wheel)")


def _compat_dirs() -> list[str]:
    """LD_LIBRARY_PATH entries that hold a forward-compatibility libcuda (cuda-compat, /usr/local/cuda*/compat)."""
    return [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p.rstrip("/").endswith("/compat")]


def check_driver(ctx: Context) -> None:
    if not ctx.cuda_versions:
        return
    try:
        smi = ctx.runner.which("nvidia-smi")
    except ForgeError:
        ctx.add("driver", Level.OK, "no nvidia-smi: no GPU driver here, which building does not need (the packages' GPU use is not tried here)")
        return
    result = ctx.run(smi, "--query-gpu=driver_version,name", "--format=csv,noheader")
    if result is None or result[0] != 0:
        output = (result[1] if result else "").strip()
        if "Driver/library version mismatch" in output:
            ctx.add("driver", Level.FAIL, f"nvidia-smi: {output.splitlines()[0]}: the kernel module and the user-space driver differ",
                    "reboot (or reload the nvidia modules) after a driver upgrade; CUDA programs fail the same way until then")
        else:
            ctx.add("driver", Level.WARN, f"`nvidia-smi` failed: {output.splitlines()[0] if output else 'no output'}",
                    "check the NVIDIA driver install")
        return
    first = result[1].strip().splitlines()[0] if result[1].strip() else ""
    driver, _, gpu = (part.strip() for part in first.partition(","))
    if not re.fullmatch(r"\d+(\.\d+)+", driver):
        ctx.add("driver", Level.WARN, f"cannot read a driver version from nvidia-smi: {first!r}")
        return
    compat = _compat_dirs()
    toolkits = tables.load().cuda.toolkits
    for cuda in ctx.cuda_versions:
        name = f"driver (CUDA {cuda})"
        toolkit = toolkits.get(cuda)
        if toolkit is None or toolkit.driver_linux is None:
            ctx.add(name, Level.WARN, f"driver {driver}; cuda.toml has no driver requirement for CUDA {cuda}, not checked")
            continue
        have, needs = _version_tuple(driver), _version_tuple(toolkit.driver_linux)
        floor = _version_tuple(toolkit.compat_floor_linux) if toolkit.compat_floor_linux else None
        compat_note = (f"; LD_LIBRARY_PATH has {', '.join(compat)}: a forward-compat libcuda there gives error 804 "
                       "(forward compatibility was attempted on non supported HW) on GPUs other than data-center ones, "
                       "and error 803 when it does not match the kernel driver branch") if compat else ""
        if have >= needs:
            status = Level.WARN if compat else Level.OK
            ctx.add(name, status, f"driver {driver} on {gpu or 'the GPU'} >= {toolkit.driver_linux}{compat_note}",
                    "remove the compat folder from LD_LIBRARY_PATH" if compat else None)
        elif floor is not None and have >= floor:
            ctx.add(name, Level.WARN,
                    f"driver {driver} < {toolkit.driver_linux} (CUDA {cuda}'s own), >= {toolkit.compat_floor_linux} (minor-version "
                    f"compatibility): CUDA {cuda} packages run, but PTX JIT (error 222) and newer APIs (error 36) fail{compat_note}",
                    f"install driver >= {toolkit.driver_linux} for full CUDA {cuda} support")
        else:
            ctx.add(name, Level.WARN,
                    f"driver {driver} < {toolkit.compat_floor_linux or toolkit.driver_linux}: packages built for CUDA {cuda} will not run "
                    f"on this GPU (error 35, CUDA driver version is insufficient for CUDA runtime version){compat_note}",
                    f"install driver >= {toolkit.driver_linux}; do not use cuda-compat on GeForce/workstation GPUs (error 804) "
                    "or with a kernel driver branch it does not support (error 803). Building itself does not need the driver")


def check_images(ctx: Context, container: ContainerSettings, targets: Sequence[tuple[str, str]]) -> None:
    """The container tool answers, and each build's image, given as (accel, bundled cuDNN or ""), can build it."""
    if not container.tool:
        missing = no_tool()  # none on PATH, or TORCHFORGE_CONTAINER_TOOL names no docker or podman
        ctx.add("container tool", Level.FAIL, missing.message, missing.hint)
        answers = False
    else:
        answers = _container_engine_answers(ctx, container.tool)
    for accel in dict.fromkeys(accel for accel, _ in targets):
        name = f"image ({accel_name(accel)})"
        try:
            image = require_image(accel, container.images)
        except ForgeError as exc:
            ctx.add(name, Level.FAIL, exc.message, exc.hint)
            continue
        cudnns = [c for c in dict.fromkeys(c for a, c in targets if a == accel) if c] or [""]
        try:
            warnings = [w for w in (check_cudnn(accel, image, c) for c in cudnns) if w]
        except ForgeError as exc:
            ctx.add(name, Level.FAIL, exc.message, exc.hint)
            continue
        detail = f"{'; '.join(describe(accel, image, c) for c in cudnns)} via {container.tool}: {image.contents}"
        fixes = [f"give the image's cuDNN in torchforge.toml [images.\"{accel}\"] cudnn = \"X.Y.Z.B\" (checked before "
                 "any build), or name a base there so torchforge adds the variant's cuDNN"] if warnings else []
        # Only where the engine answers: is each image (or derived tag) already here, or fetched at the first build?
        missing = [r for r in dict.fromkeys(reference(accel, image, c) for c in cudnns)
                   if answers and not _has_image(ctx, container.tool, r)]
        if missing:
            pulled = image.base or image.image
            what = f"the first build derives it from {pulled}" if image.derived else "the first build pulls it"
            warnings.append(f"{', '.join(missing)} is not on this machine: {what}")
            fixes.append(f"make sure its registry is reachable, or `{Path(container.tool).name} pull {pulled}` first")
        if warnings:
            ctx.add(name, Level.WARN, f"{detail}; {'; '.join(warnings)}", "; ".join(fixes))
        else:
            ctx.add(name, Level.OK, detail)


def container_report(container: ContainerSettings, targets: Sequence[tuple[str, str]], runner: Runner) -> PreflightReport:
    """The container checks alone, for builds planned without the official flavour's variants (the conda-forge
    flavour's recipes): `targets` are their (accel, bundled cuDNN or "") pairs."""
    ctx = Context(runner, probe_machine(), MachineNeeds())
    check_images(ctx, container, targets)
    return PreflightReport(tuple(ctx.checks), 0, "conda-build")


def _container_engine_answers(ctx: Context, tool: str) -> bool:
    """`docker info` / `podman info`: the client alone is not enough (a docker client without a daemon)."""
    name = Path(tool).name
    answered = ctx.run(tool, "info")
    if answered is not None and answered[0] == 0:
        ctx.add("container tool", Level.OK, f"{tool} (`{name} info` answers)")
        return True
    why = (answered[1].strip().splitlines() or ["no output"])[-1] if answered else "it does not start"
    other = "podman" if name == "docker" else "docker"
    ctx.add("container tool", Level.FAIL, f"{tool} is on PATH but `{name} info` fails: {why}",
            f"start {name}'s service, or set {TOOL_VARIABLE}={other} to use {other} instead")
    return False


def _has_image(ctx: Context, tool: str, reference: str) -> bool:
    found = ctx.run(tool, "image", "inspect", "--format", "{{.Id}}", reference)
    return found is not None and found[0] == 0


def suggest_images(ctx: Context, site: SiteConfig | None) -> None:
    """Where this machine lacks a variant's nvcc or host compiler, name the image that has them."""
    images = site.images if site else {}
    for cuda in ctx.cuda_versions:
        failed = [c.name for c in ctx.checks if c.status is Level.FAIL
                  and c.name in (f"nvcc (CUDA {cuda})", f"host compiler (CUDA {cuda})")]
        if not failed:
            continue
        image = image_for(cuda, images)
        if image is None:
            ctx.add(f"image (CUDA {cuda})", Level.WARN, f"no build image with a source is known for CUDA {cuda}",
                    f"install the toolkit here, or name an image in torchforge.toml [images.\"{cuda}\"]")
        else:
            ctx.add(f"image (CUDA {cuda})", Level.OK,
                    f"{describe(cuda, image)} provides what {' and '.join(failed)} lack: {image.contents}",
                    "torchforge build --container (docker or podman)" + (
                        "" if image.derived or image.conda_build else
                        f"; this image has no conda-build: name it as base in torchforge.toml [images.\"{cuda}\"]"))


def run_needs_checks(needs: MachineNeeds, *, out: Path, machine: Machine | None = None) -> PreflightReport:
    """`run_plan_checks` for any flavour's plan: the platform, --out and each --source, no tool looked at."""
    ctx = Context(Runner(dry_run=True), machine or probe_machine(), needs)
    check_platform(ctx)
    check_out(ctx, out)
    for source in needs.sources or (None,):
        check_source(ctx, source)
    return PreflightReport(tuple(ctx.checks), 0, "")


def check_arch_check(ctx: Context) -> None:
    """Says the arch check will run after each CUDA build; it reads device code in-process, so no tool is needed."""
    ctx.add("arch check", Level.OK, "each CUDA package's device code is read after its build (torchforge.fatbin, "
            "every section's fatbins; no cuobjdump needed)")


def run_machine_checks(
    needs: MachineNeeds,
    *,
    engine: str | None,
    jobs: int | None,
    runner: Runner,
    out: Path,
    machine: Machine | None = None,
    site: SiteConfig | None = None,
    extra_channels: tuple[str, ...] = (),
    check_channels: bool = False,
    container: ContainerSettings | None = None,
    image_targets: Sequence[tuple[str, str]] = (),
) -> PreflightReport:
    """The checks every flavour's plan gets, read from its neutral needs: platform, engine, nvcc for each CUDA
    (where the toolkit is this machine's), output folder, disk, MAX_JOBS, each source, the driver, and that
    every channel of the plan answers (`check_channels`: network). `container` (doctor --container): the build
    images of `image_targets` ((accel, cuDNN) of each recipe) instead of this machine's engine and toolkit."""
    table = load_table()
    ctx = Context(runner, machine or probe_machine(), needs)
    check_platform(ctx)
    # with --container (engine None) the engine is the image's: container_report checks it, not this machine
    resolved = check_engine(ctx, engine) if engine is not None and container is None else "conda-build"
    if container is not None:
        check_images(ctx, container, image_targets)
    on_host = needs.toolkit_on_host and engine is not None and container is None  # else the image's toolkit
    if needs.toolkit_on_host and container is None:
        check_nvcc(ctx)
    if on_host:
        check_host_compiler(ctx)
        check_cuda_libraries(ctx, table)
        suggest_images(ctx, site)
    if needs.host_tools:
        check_tools(ctx, table, needs.host_tools)
    check_out(ctx, out)
    check_disk(ctx, out, table, extensions_only=needs.extensions_only)
    max_jobs = check_jobs(ctx, jobs, table)
    for source in (needs.sources or (None,)) if needs.builds_a_source else ():
        check_source(ctx, source)
    if on_host:
        check_bundled(ctx)
    check_driver(ctx)
    if needs.arch_checked:
        check_arch_check(ctx)
    if check_channels:
        site = site or SiteConfig()
        findings = channelcheck.check(needs.solves, out=out, extra=extra_channels, site=site.channels) if needs.solves \
            else channelcheck.check_answering(needs.channels, out=out, extra=extra_channels, site=site.channels)
        for finding in findings:
            ctx.add(finding.name, Level(finding.status), finding.detail, finding.fix)
    return PreflightReport(tuple(ctx.checks), max_jobs, resolved)
