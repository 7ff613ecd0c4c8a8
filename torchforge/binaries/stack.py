"""`torchforge repack`: wheels → one consistent conda stack in a local channel.

The sequence: read every wheel (a project torchforge does not repack is refused), plan the stack (the
consistency checks of torchforge.binaries.plan), check every archive's CRCs and whether the channel already
has each package (reused when repacked from the same wheel with the same plan, refused when something else
has its name), build every package in a scratch folder of the channel, and only then publish them. A refusal
or a failure before publishing leaves the channel as it was; a killed run leaves a scratch folder the next
run removes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock, Timeout

from torchforge import __version__, fileops, localchannel, repodata
from torchforge.binaries import wheels as wheel_files
from torchforge.binaries.ownprocess import build_archive_in_process
from torchforge.binaries.plan import CudaLibs, PackagePlan, StackPlan, plan
from torchforge.errors import AuditFailedError, UsageError
from torchforge.proc import Runner
from torchforge.binaries.schedule import Job, available_memory, run_jobs
from torchforge.repack import (DEFAULT_ZSTD_LEVEL, DEFAULT_ZSTD_THREADS, PACKING_STEPS, SUBDIR, RepackResult,
                               build_archive, build_footprint, check_crcs, check_zstd_level, sha256_of, zstd_workers)
from torchforge.rpath import AuditReport

Step = Callable[[str, str], None]  # (package file name, what is happening)


@dataclass(frozen=True)
class StackResult:
    plan: StackPlan
    packages: tuple[RepackResult, ...]


def plan_digest(package: PackagePlan) -> str:
    """What a package was made from besides its wheel: reused only when this is unchanged."""
    settings = {"name": package.name, "version": package.version, "build": package.build,
                "build_number": package.build_number, "depends": package.depends,
                "constrains": package.constrains, "keep_wheel_rpaths": package.keep_wheel_rpaths,
                "drop": sorted(package.drop), "torchforge": __version__}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def plan_wheels(paths: Sequence[Path], mode: CudaLibs, build_number: int = 0) -> StackPlan:
    """Read and check the wheels; the plan with shared namespace files given to one package only."""
    stack = plan([wheel_files.read(p) for p in paths], mode, build_number)
    return replace(stack, packages=_drop_shared_files(stack.packages))


def _drop_shared_files(packages: Sequence[PackagePlan]) -> tuple[PackagePlan, ...]:
    """NVIDIA's component wheels each ship `nvidia/__init__.py` (and CUDA 13's `nvidia/cu13/__init__.py`):
    two conda packages must not own one path, so the first package (by name) keeps it."""
    owner: dict[str, str] = {}
    drops: dict[str, set[str]] = {}
    for package in sorted(packages, key=lambda p: p.name):
        with zipfile.ZipFile(package.wheel.path) as zf:
            for name in zf.namelist():
                if name.endswith("/") or ".dist-info/" in name:
                    continue
                if name in owner:
                    drops.setdefault(package.name, set()).add(name)
                else:
                    owner[name] = package.name
    return tuple(replace(p, drop=frozenset(drops.get(p.name, ()))) for p in packages)


def _existing(channel: Path, package: PackagePlan, wheel_sha: str, replace_: bool) -> Path | None:
    """The package already in the channel when it can be reused; refusal when another one has its name."""
    existing = channel / SUBDIR / package.filename
    if not existing.is_file() or replace_:
        return None
    try:
        extra = localchannel.about_extra(existing)
    except Exception:  # damaged or foreign: not ours to reuse
        extra = {}
    if extra.get("source_wheel_sha256") == wheel_sha and extra.get("repack_plan") == plan_digest(package):
        return existing
    raise UsageError(f"{existing} is already in the channel, repacked from another wheel or with other settings",
                     "pass --replace to overwrite it, or repack into another channel")


# The share of the memory available at the start that the builds running together may use: the rest is for
# the page cache that holds the unpacked files between writing and compressing them, and for other programs.
MEMORY_SHARE = 0.5
# The GIL's switch interval while the builds run (Python's default: 5 ms). The builds are threads of one process;
# a thread that gave the GIL up for a read or a compress call waits up to an interval to have it back while
# another runs Python, and the largest package's stream makes thousands of such calls: beside one thread running
# Python, its writer took 5.5 s at 5 ms and 4.1 s at 0.1 ms (torch CPU, level 1, 2 cores). `make bench` measures
# the repack with this and with the default.
SWITCH_INTERVAL = 0.0005
Built = tuple[PackagePlan, Path, AuditReport, tuple[str, ...], float, repodata.Record]


@contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """The GIL's switch interval set to `seconds` (None: left as it is) until the block ends."""
    before = sys.getswitchinterval()
    if seconds is not None:
        sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def build_packages(packages: Sequence[PackagePlan], work: Path, runner: Runner, specs: dict[str, str],
                   shas: dict[str, str], level: int, step: Step) -> list[Built]:
    """Build every package into `work/out`, several at once (torchforge.binaries.schedule): each uses every
    core for its zstd stream, and as many run together as the memory allows."""
    threads = zstd_workers(DEFAULT_ZSTD_THREADS)
    jobs = [Job(p, *build_footprint(p.wheel.path, threads, level)) for p in packages]
    lead = max(jobs, key=lambda j: j.size).item if jobs else None  # run_jobs starts it first
    lead_patched = threading.Event()

    def on_step(package: PackagePlan, text: str) -> None:
        if package is lead and text.startswith(PACKING_STEPS):
            lead_patched.set()
        step(package.filename, text)

    def build(package: PackagePlan, check: Callable[[], None]) -> Built:
        # The others wait until the lead is unpacked and patched: on 16 cores a score of builds beside its
        # unpack slowed it threefold, and beside its RPATH step fourfold (8 s against 2 s alone); they run
        # beside its compression, which leaves cores free (one stream keeps about 8 of 16 busy).
        while package is not lead and not lead_patched.wait(0.1):
            check()
        start = time.perf_counter()
        # The lead in a process of its own while others build beside it (torchforge.binaries.ownprocess says why)
        builder = build_archive_in_process if package is lead and len(jobs) > 1 else build_archive
        try:
            archive, report, depends = builder(
                package, work / "out", runner, specs=specs, work=work, zstd_level=level, zstd_threads=threads,
                extra={"repack_plan": plan_digest(package)}, wheel_sha256=shas[package.filename], check=check,
                on_step=lambda s: on_step(package, s))
        finally:
            lead_patched.set()  # a failed or finished lead lets the others go (they stop at their check)
        if not report.ok:  # fix_and_audit raises first; kept as a guard for the publish step
            raise AuditFailedError(f"{archive.name} failed the RPATH audit", "run `torchforge rpath audit` on it")
        # Its index entry now, beside the other builds, so that publishing need not read the channel again.
        record = repodata.record_of(archive, localchannel.info_json(archive, "index.json"))
        step(package.filename, "built")
        return package, archive, report, depends, time.perf_counter() - start, record

    return run_jobs(jobs, build, budget=int(available_memory() * MEMORY_SHARE), workers=os.cpu_count() or 1)


def repack_stack(
    paths: Sequence[Path],
    channel: Path,
    runner: Runner,
    *,
    mode: CudaLibs = CudaLibs.CONDA_FORGE,
    build_number: int = 0,
    zstd_level: int | None = None,
    replace_: bool = False,
    on_step: Step | None = None,
) -> StackResult:
    level = DEFAULT_ZSTD_LEVEL if zstd_level is None else check_zstd_level(zstd_level)
    return repack_planned(plan_wheels(paths, mode, build_number), channel, runner, zstd_level=level,
                          replace_=replace_, on_step=on_step)


def repack_planned(stack: StackPlan, channel: Path, runner: Runner, *, zstd_level: int = DEFAULT_ZSTD_LEVEL,
                   replace_: bool = False, on_step: Step | None = None,
                   gil_switch: float | None = SWITCH_INTERVAL) -> StackResult:
    """Repack a checked plan (plan_wheels) into `channel`: CRCs, reuse, the builds, then one publication.
    `gil_switch`: the GIL's switch interval meanwhile (SWITCH_INTERVAL; None leaves Python's)."""
    step = on_step or (lambda _p, _s: None)
    level = check_zstd_level(zstd_level)
    step(f"{len(stack.packages)} wheel(s)", "checking the archives")
    stop = threading.Event()  # set on Ctrl-C: the readers and hashers end within a MiB, not after every wheel
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # hashlib releases the GIL
        try:
            digests = [pool.submit(sha256_of, p.wheel.path, stop) for p in stack.packages]  # while the CRCs are read
            check_crcs([p.wheel.path for p in stack.packages], stop=stop)
            shas = {p.filename: d.result() for p, d in zip(stack.packages, digests)}
        except BaseException:
            stop.set()
            raise
    with localchannel.locked(channel):
        pass  # taking the lock recovers the channel: a killed repack's scratch folders go, orphans get indexed
    with _one_repack_per_package(channel, stack.packages, step), switch_interval(gil_switch):
        return _publish_repacked(stack, channel, runner, shas, level, replace_, step)


@contextmanager
def _one_repack_per_package(channel: Path, packages: Sequence[PackagePlan], step: Step) -> Iterator[None]:
    """Hold a lock per package of the channel from the reuse decision to the publication, so that a second
    repack of the same wheel into the channel waits and then reuses what the first published (as a later run
    does) instead of building it again and finding it taken. Taken in name order: two stacks sharing packages
    never wait for each other in a circle."""
    folder = fileops.ensure_dir(channel / ".torchforge-repack-locks", "channel folder")
    with ExitStack() as held:
        for name in sorted(p.filename for p in packages):
            lock = FileLock(str(folder / f"{name}.lock"))
            try:
                lock.acquire(blocking=False)
            except Timeout:
                step(name, "waiting for another repack of it into this channel")
                lock.acquire()
            held.callback(lock.release)
        yield


def _publish_repacked(stack: StackPlan, channel: Path, runner: Runner, shas: dict[str, str], level: int,
                      replace_: bool, step: Step) -> StackResult:
    """Reuse what the channel has from the same wheels and plan, build the rest, publish them in one step."""
    reused = {p.filename: _existing(channel, p, shas[p.filename], replace_) for p in stack.packages}
    results: list[RepackResult] = []
    with fileops.scratch(channel, "repack") as work:
        todo = [p for p in stack.packages if reused[p.filename] is None]
        built = build_packages(todo, work, runner, stack.specs, shas, level, step)
        step(f"{len(built)} package(s)", "publishing")
        try:
            placed = localchannel.publish_many([b[1] for b in built], channel, SUBDIR, replace=replace_,
                                                  move=True, records={b[1].name: b[5] for b in built})
        except localchannel.ArchiveExistsError as exc:
            raise UsageError(f"{exc.path} is already in the channel", "pass --replace to overwrite it") from None
        for (_package, _archive, report, depends, seconds, _record), published in zip(built, placed):
            results.append(RepackResult(published.path, published.path.stat().st_size, seconds, report, depends))  # type: ignore[arg-type]
    for package in stack.packages:
        existing = reused[package.filename]
        if existing is not None:
            results.append(RepackResult(existing, existing.stat().st_size, 0.0, None, package.depends, reused=True))
    return StackResult(stack, tuple(results))
