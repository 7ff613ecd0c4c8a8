"""Preflight: check the machine before a multi-hour build and report every problem at once, each with its fix.

`run_machine_checks(needs, engine=..., jobs=..., runner=..., out=...)` returns a `PreflightReport` of the checks
every flavour's plan gets, read from its neutral `MachineNeeds`; it never raises for a failed check (the caller prints
the whole table first, then `report.raise_if_failed()`); `build` and `doctor` run them for every flavour
(torchforge.sequence.machine_report), the official flavour's needs read from its variants
(torchforge/flavours/official/preflight.py).
Checks: platform, build engine and version, nvcc == requested CUDA,
host compiler within that CUDA's limit, cuBLAS/cuSPARSE (and cuDNN for pytorch) in that CUDA's toolkit, cmake/git/patchelf, free disk, MAX_JOBS from memory and cores, a local
source tree's submodules, and, where nvidia-smi exists, the driver against each CUDA runtime (errors 35/803/804).

Thresholds live in torchforge/data/preflight.toml (read by preflight/table.py) and version facts in cuda.toml; this
module holds no numbers. What a check reports is preflight/report.py's; the container checks are preflight/images.py's.
Every subprocess goes through `torchforge.proc.Runner`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path


from torchforge import channelcheck
from torchforge import data as tables
from torchforge.config import SiteConfig
from torchforge.containers import (ContainerSettings)
from torchforge.engines.conda_build import probe as conda_build_probe
from torchforge.engines.pip_wheel import NAME as PIP_ENGINE
from torchforge.engines.pip_wheel import PipWheelEngine
from torchforge.errors import ForgeError
from torchforge.proc import Runner
from torchforge.flavours.base import MachineNeeds
from torchforge.preflight.table import PreflightTable, choose_max_jobs, disk_need_gib, load_table, memory_jobs
from torchforge.preflight.report import Check, Context, Level, Machine, PreflightReport, probe_machine
from torchforge.preflight.images import check_images, suggest_images

ENGINES = ("auto", "conda-build", "rattler-build")
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_GITMODULES_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)
_SUBMODULE_DEPTH = 3  # PyTorch nests submodules two levels deep (third_party/*/third_party/*)


# ---- report ----------------------------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


# ---- machine facts (pure functions take them as arguments) -----------------------------------------------


# ---- the checks ------------------------------------------------------------------------------------------


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
                from torchforge.rpath.fix import find_patchelf

                found = find_patchelf(ctx.runner)
            else:
                found = ctx.runner.which(tool)
        except ForgeError as exc:
            ctx.add(tool, Level.FAIL, f"{exc.message} (needed: {info.why})", exc.hint or info.fix)
            continue
        ctx.add(tool, Level.OK, found)


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
