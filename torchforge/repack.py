"""One official wheel → one conda package, as torchforge.binaries.plan describes it (name, build string,
run requirements).

PyTorch stopped publishing conda packages after 2.5 (official-builds.md §0); the wheels are the binaries
that are still built. Repacking puts the wheel's files under `lib/pythonX.Y/site-packages`, adds to the run
requirements the stack's packages whose libraries the ELF files link, rewrites RPATHs for the conda layout
(§1.8: DT_RPATH to `$ORIGIN`, the folders of linked libraries and `<prefix>/lib`), writes a complete `info/`
(with the wheel's licence files) and writes the .conda with torchforge.condawriter (the same bytes for one wheel
whatever the number of zstd threads). The archive is built in a temporary folder; torchforge.binaries.stack
builds a stack's packages in parallel and publishes them only when the whole stack is built.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from email.parser import HeaderParser
from pathlib import Path

from torchforge import __version__, archcheck, cudaarch, localchannel
from torchforge.aio import run_async
from torchforge.condawriter import FileDigests, Options, is_info, write_conda
from torchforge.binaries.catalog import catalog, outside_libraries
from torchforge.binaries.schedule import Cancelled
from torchforge.binaries.plan import PackagePlan
from torchforge.elf import iter_tree, maybe_elf, read_elf
from torchforge.errors import ArchiveError, UsageError
from torchforge.pausepoint import pause_at
from torchforge.proc import Runner
from torchforge.rpath import AuditReport, Layout
from torchforge.rpath.fix import fix_and_audit
from torchforge.templates import render_template
from torchforge.wheel import write_record
from torchforge.wheelzip import extract_wheel

SUBDIR = "linux-64"
PREFIX_PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"
# The target: >= 10x faster than cph's default (zstd 19, 1 thread) with a package <= 15 % larger.
# Level 3 is 87x faster but +19 % (first 32 MB of libtorch_cpu.so, bench_rpath) and +27 % on all of
# torch/lib (tooling.md §2): too large. Level 10 with all cores is 18x faster and +10 % on the subset,
# 15-22x faster and +13 % on torch/lib (tooling.md: 12.8 s vs 194-287 s, 97.1 vs 86.1 MB).
# `make bench` re-measures levels 3, 10 and 19 on every run.
DEFAULT_ZSTD_LEVEL = 10
DEFAULT_ZSTD_THREADS = -1
ZSTD_LEVELS = range(1, 23)  # what zstd accepts (cph passes the level through)
PLACEHOLDER_SHA256 = "0" * 64  # RECORD's first draft: as long as the real digest, so the file keeps its size
# Memory one zstd worker holds (its tables and job buffers), by the highest level it covers: ru_maxrss growth of
# one compression of the first 190 MB of the torch 2.13.0 CPU wheel with one worker, then two (backports.zstd
# 1.8.0): level 3 80 -> 114 MB, level 10 149 -> 225 MB, level 19 345 -> 504 MB; level 22 (400 MB, its window
# is 128 MB) 1414 MB with one or two. Each figure is the one-worker peak, rounded up: the second worker's share
# is smaller, so this over-counts.
ZSTD_WORKER_BYTES = ((3, 80 << 20), (10, 150 << 20), (19, 350 << 20), (22, 1536 << 20))


def build_footprint(wheel: Path, zstd_threads: int, level: int) -> tuple[int, int]:
    """(unpacked bytes, peak memory in bytes) of repacking `wheel`: the scheduler starts the largest first and
    runs together only what fits in memory. The peak: patchelf holds the largest library twice (read, then
    written with its new dynamic section) and each zstd worker holds its tables and job buffers."""
    with zipfile.ZipFile(wheel) as zf:
        sizes = [m.file_size for m in zf.infolist()]
    per_worker = next(b for top, b in ZSTD_WORKER_BYTES if level <= top)
    return sum(sizes), 2 * max(sizes, default=0) + zstd_workers(zstd_threads) * per_worker


def check_zstd_level(level: int) -> int:
    """Checked before any work: a bad level would otherwise fail after minutes of unpacking and patching."""
    if level not in ZSTD_LEVELS:
        raise UsageError(f"--zstd-level {level} is outside zstd's levels {ZSTD_LEVELS.start}..{ZSTD_LEVELS.stop - 1}",
                         f"use {DEFAULT_ZSTD_LEVEL} (the default), or 19 for the smallest package")
    return level


def _entry_point_scripts(entry_points: str) -> dict[str, str]:
    scripts: dict[str, str] = {}
    section = ""
    for raw in entry_points.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "console_scripts" and "=" in line:
            name, target = (part.strip() for part in line.split("=", 1))
            module, _, func = target.partition(":")
            scripts[name] = (
                f"#!{PREFIX_PLACEHOLDER}/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                f"from {module} import {func.split('.')[0]}\n"
                "if __name__ == '__main__':\n"
                "    sys.argv[0] = re.sub(r'(-script\\.pyw?|\\.exe)?$', '', sys.argv[0])\n"
                f"    sys.exit({func}())\n"
            )
    return scripts


def sha256_of(path: Path, stop: threading.Event | None = None) -> str:
    """The file's sha256; once `stop` is set (the run is ending) it stops within a MiB, raising Cancelled."""
    return _sha256(path, stop)[0]


def _sha256(path: Path, stop: threading.Event | None = None) -> tuple[str, int]:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            if stop is not None and stop.is_set():
                raise Cancelled()
    return digest.hexdigest(), path.stat().st_size


@dataclass(frozen=True)
class About:
    """What about.json and the recipe say, read from the unpacked wheel's METADATA."""

    summary: str
    license: str
    home: str
    entry_points: str  # entry_points.txt content ("" when absent)

    @classmethod
    def read(cls, dist: Path) -> About:
        headers = HeaderParser().parsestr((dist / "METADATA").read_text("utf-8", errors="replace"))
        urls = headers.get_all("Project-URL") or []
        home = headers.get("Home-page") or next((u.split(",", 1)[1].strip() for u in urls if "," in u), "")
        points = dist / "entry_points.txt"
        return cls(headers.get("Summary", ""), headers.get("License-Expression") or headers.get("License") or "",
                   home, points.read_text("utf-8") if points.is_file() else "")


def payload_of(stage: Path) -> tuple[list[str], list[str]]:
    """The package's regular files and its symbolic links outside info/, relative to `stage`, sorted."""
    payload = sorted(p.relative_to(stage).as_posix() for p in iter_tree(stage) if p.relative_to(stage).parts[0] != "info")
    links = []
    for dirpath, dirnames, filenames in os.walk(stage):
        for entry in dirnames + filenames:
            full = Path(dirpath, entry)
            if full.is_symlink():
                links.append(full.relative_to(stage).as_posix())
    return payload, sorted(links)


def hash_files(stage: Path, rels: Iterable[str], threads: int | None = None) -> dict[str, tuple[str, int]]:
    """sha256 (hex) and size of each file, by path relative to `stage`. hashlib releases the GIL: one thread
    per core hashes a package's gigabytes in parallel."""
    listed = list(rels)
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 2) as pool:
        return dict(zip(listed, pool.map(lambda rel: _sha256(stage / rel), listed)))


def write_info(stage: Path, plan: PackagePlan, about: About, prefix_files: Iterable[str], wheel_sha256: str,
               licenses: Iterable[str], extra: dict[str, str] | None = None, *,
               timestamp_ms: int | None = None, known: dict[str, tuple[str, int]] | None = None) -> list[str]:
    """Write info/ (index.json, paths.json, files, about.json, has_prefix, licenses/, recipe/meta.yaml); returns
    the package's file list (payload then info), relative to `stage`. `known` holds hashes already computed
    (hash_files), `timestamp_ms` the index's time (now when not given)."""
    info = stage / "info"
    (info / "recipe").mkdir(parents=True, exist_ok=True)
    payload, links = payload_of(stage)
    prefix_set = set(prefix_files)
    known = known or {}
    hashes = {**hash_files(stage, [rel for rel in payload if rel not in known]), **known}
    paths = []
    for rel in sorted(payload + links):
        if rel in links:
            paths.append({"_path": rel, "path_type": "softlink", "size_in_bytes": 0,
                          "sha256": hashlib.sha256(os.readlink(stage / rel).encode()).hexdigest()})
            continue
        sha, size = hashes[rel]
        entry: dict[str, object] = {"_path": rel, "path_type": "hardlink", "sha256": sha, "size_in_bytes": size}
        if rel in prefix_set:
            entry.update(file_mode="text", prefix_placeholder=PREFIX_PLACEHOLDER)
        paths.append(entry)
    source = plan.wheel.name.filename
    index = {
        "name": plan.name, "version": plan.version, "build": plan.build, "build_number": plan.build_number,
        "depends": list(plan.depends), "constrains": list(plan.constrains),
        "license": about.license, "subdir": SUBDIR, "platform": "linux", "arch": "x86_64",
        "timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
    }
    about_json = {
        "summary": about.summary, "home": about.home, "license": about.license,
        "description": f"Repacked by torchforge {__version__} from the official wheel {source}.",
        "extra": {"source_wheel": source, "source_wheel_sha256": wheel_sha256,
                  "repacked_by": f"torchforge {__version__}", "rpath_layout": Layout.CONDA.value, **(extra or {})},
    }
    license_names = []
    for path in licenses:
        (info / "licenses").mkdir(exist_ok=True)
        target = info / "licenses" / Path(path).name
        target.write_bytes((stage / path).read_bytes())
        license_names.append(target.name)
    if license_names:
        about_json["license_file"] = license_names
    files = sorted(payload + links)
    (info / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (info / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}, indent=1) + "\n")
    (info / "about.json").write_text(json.dumps(about_json, indent=2, sort_keys=True) + "\n")
    (info / "files").write_text("\n".join(files) + "\n")
    if prefix_set:
        (info / "has_prefix").write_text("".join(f"{PREFIX_PLACEHOLDER} text {p}\n" for p in sorted(prefix_set)))
    _write_recipe(info, plan, about, wheel_sha256)
    info_files = sorted(p.relative_to(stage).as_posix() for p in iter_tree(info))
    return files + info_files


def _write_recipe(info: Path, plan: PackagePlan, about: About, wheel_sha256: str) -> None:
    """The recipe this package is equivalent to: what conda-build would have been given to produce it."""
    top = catalog().project(plan.wheel.project)
    (info / "recipe" / "meta.yaml").write_text(render_template(
        "repack/meta.yaml.j2", name=plan.name, version=plan.version, wheel=plan.wheel.name.filename,
        wheel_sha256=wheel_sha256, build_number=plan.build_number, build=plan.build, depends=plan.depends,
        constrains=plan.constrains, import_name=top.top if top is not None else None, home=about.home,
        license=about.license, summary=about.summary))


@dataclass(frozen=True)
class RepackResult:
    archive: Path
    size: int
    seconds: float
    report: AuditReport | None  # None when the package was reused, not rebuilt
    depends: tuple[str, ...]
    reused: bool = False


def linked_depends(stage: Path, plan: PackagePlan, specs: dict[str, str]) -> tuple[str, ...]:
    """`plan.depends` plus the stack's packages whose libraries the ELF files link and that the package does
    not carry itself (torchvision's _C.so links libtorch_cuda.so and libcudart.so.12 with no RPATH to them),
    and the packages outside the stack that provide the other libraries they link (sonames.toml: cuDNN's
    libz.so.1 is conda-forge's libzlib)."""
    inside = {p.name for p in iter_tree(stage) if maybe_elf(p)}
    needed: set[str] = set()
    for path in iter_tree(stage):
        if maybe_elf(path):
            info = read_elf(path)
            if info is not None:
                needed.update(n for n in info.needed if n not in inside)
    names = {d.split()[0] for d in plan.depends}
    extra = []
    for conda_name, spec in specs.items():
        if conda_name in names or conda_name == plan.name:
            continue
        prefixes = catalog().libraries_of(conda_name)
        if any(n.startswith(prefixes) for n in needed if prefixes):
            extra.append(spec)
    for soname, spec in outside_libraries().items():
        if soname in needed and spec.split()[0] not in names:
            extra.append(spec)
    return plan.depends + tuple(sorted(extra))


def zstd_workers(threads: int) -> int:
    """The zstd workers for `threads` (-1: one per core). Never 0: see torchforge.condawriter."""
    return max(1, os.cpu_count() or 1) if threads == -1 else max(1, threads)


def wheel_time(wheel: Path) -> int:
    """When the wheel was made (its newest member's zip date, read as UTC), in seconds: the time every file of
    the package and its index carry, so that a repack of one wheel gives the same bytes wherever it runs."""
    with zipfile.ZipFile(wheel) as zf:
        newest = max((info.date_time for info in zf.infolist()), default=(1980, 1, 1, 0, 0, 0))
    return calendar.timegm((*newest, 0, 0, 0))


@dataclass(frozen=True)
class Staged:
    """A wheel unpacked into a package folder, before its RPATHs are fixed."""

    plan: PackagePlan  # with the depends its ELF files add
    about: About
    site: Path
    dist: Path
    scripts: tuple[str, ...]


# The step that follows a package's unpack, and the first words of the steps that follow its RPATH fix
# (torchforge.binaries.stack starts the other builds once the largest package reaches those).
UNPACKED_STEP = "fixing RPATHs"
PACKING_STEPS = ("compressing", "hashing")


def _stage(plan: PackagePlan, stage: Path, specs: dict[str, str], step: Callable[[str], None],
           check: Callable[[], None] = lambda: None) -> Staged:
    site = stage / "lib" / f"python{plan.python}" / "site-packages"
    site.mkdir(parents=True)
    step("unpacking")
    extract_wheel(plan.wheel.path, site, check)
    for rel in plan.drop:
        (site / rel).unlink(missing_ok=True)
    dist = next(site.glob("*.dist-info"))
    (dist / "INSTALLER").write_text("conda\n")
    (dist / "REQUESTED").unlink(missing_ok=True)
    about = About.read(dist)
    scripts = _entry_point_scripts(about.entry_points)
    if scripts:
        (stage / "bin").mkdir()
        for name, text in scripts.items():
            (stage / "bin" / name).write_text(text)
            (stage / "bin" / name).chmod(0o755)
    plan = replace(plan, depends=linked_depends(stage, plan, specs))
    return Staged(plan, about, site, dist, tuple(scripts))


def build_archive(
    plan: PackagePlan,
    out_folder: Path,
    runner: Runner,
    *,
    specs: dict[str, str] | None = None,
    zstd_level: int = DEFAULT_ZSTD_LEVEL,
    zstd_threads: int = DEFAULT_ZSTD_THREADS,
    fmt: str = ".conda",
    work: Path | None = None,
    extra: dict[str, str] | None = None,
    on_step: Callable[[str], None] | None = None,
    check: Callable[[], None] = lambda: None,
    wheel_sha256: str | None = None,
) -> tuple[Path, AuditReport, tuple[str, ...]]:
    """Build the conda archive `plan` describes into `out_folder` (which should be a fresh temporary folder).
    `check` is called between steps and while compressing; it raises to stop the build (a cancelled stack)."""
    def step(what: str) -> None:
        check()
        (on_step or (lambda _s: None))(what)

    def unpacking() -> None:  # after each MiB unpacked; the suite interrupts a repack here (torchforge.pausepoint)
        check()
        pause_at("repack-unpacking", check)

    check_zstd_level(zstd_level)
    with tempfile.TemporaryDirectory(prefix="torchforge-repack-", dir=work) as tmp:
        stage = Path(tmp) / "pkg"
        staged = _stage(plan, stage, specs or {}, step, unpacking)
        # index.json first: the audit resolves libraries of other packages through the declared depends.
        (stage / "info").mkdir()
        (stage / "info" / "index.json").write_text(json.dumps({"depends": list(staged.plan.depends)}))
        step(UNPACKED_STEP)
        report = fix_and_audit(stage, Layout.CONDA, runner, keep_provided=staged.plan.keep_wheel_rpaths)
        staged = _with_cuda_arch(staged, stage)
        info = _InfoArgs(staged, wheel_sha256 or sha256_of(plan.wheel.path), wheel_time(plan.wheel.path), extra)
        out_folder.mkdir(parents=True, exist_ok=True)
        dest = out_folder.resolve() / plan.filename.removesuffix(".conda")
        if fmt == ".conda":
            step(f"compressing ({fmt}, zstd level {zstd_level})")
            options = Options(zstd_level, zstd_workers(zstd_threads), info.made, check)
            _write_conda(stage, dest.with_name(f"{dest.name}.conda"), info, options)
        else:
            step("hashing")
            files = _write_hashed(stage, info)
            step(f"compressing ({fmt})")
            from conda_package_handling import api as cph

            cph.create(str(stage), files, f"{dest.name}{fmt}", out_folder=str(dest.parent))
        return dest.with_name(f"{dest.name}{fmt}"), report, staged.plan.depends


def _with_cuda_arch(staged: Staged, stage: Path) -> Staged:
    """The package's CEP 46 `__cuda_arch` run constraint, from the device code the wheel really holds
    (torchforge.cudaarch; none for a package without any)."""
    constrains = tuple(cudaarch.with_constraint(staged.plan.constrains, cudaarch.spec(archcheck.tree_device_code(stage).values())))
    if constrains == staged.plan.constrains:
        return staged
    return replace(staged, plan=replace(staged.plan, constrains=constrains))


@dataclass(frozen=True)
class _InfoArgs:
    """What info/ is written from, besides the files' hashes."""

    staged: Staged
    wheel_sha256: str
    made: int  # wheel_time: the index's timestamp and every entry's time
    extra: dict[str, str] | None

    def record(self, stage: Path) -> str:
        return f"{self.staged.site.relative_to(stage).as_posix()}/{self.staged.dist.name}/RECORD"

    def write(self, stage: Path, known: dict[str, tuple[str, int]]) -> list[str]:
        site_rel = self.staged.site.relative_to(stage).as_posix()
        return write_info(stage, self.staged.plan, self.staged.about, (f"bin/{n}" for n in self.staged.scripts),
                          self.wheel_sha256, (f"{site_rel}/{n}" for n in self.staged.plan.wheel.license_files),
                          self.extra, timestamp_ms=self.made * 1000, known=known)

    def write_record(self, stage: Path, known: dict[str, tuple[str, int]]) -> None:
        """RECORD from `known` (by path relative to `stage`): the .so files changed, so it must say what is installed."""
        prefix = self.staged.site.relative_to(stage).as_posix() + "/"
        write_record(self.staged.site, self.staged.dist.name,
                     {rel[len(prefix):]: v for rel, v in known.items() if rel.startswith(prefix)})


def _write_conda(stage: Path, dest: Path, info: _InfoArgs, options: Options) -> None:
    """The .conda, each file hashed from the bytes as they are packed (torchforge.condawriter). RECORD goes last
    in the pkg component: first a placeholder of its final size (the tar headers are made before any file is
    read), then, just before it is packed, the real one from the digests of every file packed before it."""
    payload, links = payload_of(stage)
    record = info.record(stage)
    info.write_record(stage, {rel: (PLACEHOLDER_SHA256, os.lstat(stage / rel).st_size)
                              for rel in payload if rel != record})
    pkg_files = sorted(set(payload + links) - {record}) + [record]
    digests = FileDigests()

    def prepare(rel: str) -> None:
        if rel == record:
            info.write_record(stage, digests.result())

    def finish() -> list[str]:
        return [rel for rel in info.write(stage, digests.result()) if is_info(rel)]

    write_conda(stage, dest, pkg_files, finish, options, prepare, digests)


def _write_hashed(stage: Path, info: _InfoArgs) -> list[str]:
    """RECORD and info/ from one hashing pass (the .tar.bz2 path); the package's file list."""
    payload, _links = payload_of(stage)
    known = hash_files(stage, payload)
    info.write_record(stage, known)
    known.pop(info.record(stage), None)
    return info.write(stage, known)


def check_crcs(wheels: Iterable[Path], threads: int | None = None, stop: threading.Event | None = None) -> None:
    """Every member's CRC, before anything is written: a damaged download fails here, not after unpacking.
    The members of all the wheels are read by one thread per core, largest first (zlib releases the GIL).
    An interrupt (or `stop`) ends the readers within a MiB each, before it is raised."""
    members: list[tuple[Path, zipfile.ZipInfo]] = []
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                members.extend((wheel, m) for m in zf.infolist() if not m.is_dir())
        except (zipfile.BadZipFile, OSError) as exc:
            raise ArchiveError.unreadable(wheel, exc) from exc
    members.sort(key=lambda item: -item[1].file_size)
    workers = max(1, min(len(members), threads or os.cpu_count() or 1))
    ending = stop or threading.Event()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            list(pool.map(lambda share: _read_members(share, ending), [members[i::workers] for i in range(workers)]))
        except BaseException:
            ending.set()  # the pool's exit waits for the readers: they stop at their next MiB
            raise


def _read_members(share: list[tuple[Path, zipfile.ZipInfo]], stop: threading.Event) -> None:
    """Read (and so CRC-check) each member; ZipExtFile raises on a wrong CRC at the member's end."""
    opened: dict[Path, zipfile.ZipFile] = {}
    wheel = None
    try:
        for wheel, member in share:
            zf = opened.get(wheel) or opened.setdefault(wheel, zipfile.ZipFile(wheel))
            with zf.open(member) as fh:
                while fh.read(1 << 20):
                    if stop.is_set():
                        return
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as exc:
        raise ArchiveError.unreadable(wheel, exc) from exc  # type: ignore[arg-type]
    finally:
        for zf in opened.values():
            zf.close()


def _source_wheel_sha256(archive: Path) -> object:
    """The sha256 of the wheel `archive` was repacked from (None when it cannot be read: then it is not reused)."""
    try:
        return localchannel.about_extra(archive).get("source_wheel_sha256")
    except Exception:  # damaged or foreign: not ours to reuse
        return None


def install_from_channel(channel: Path, prefix: Path, name: str = "pytorch", file_name: str | None = None) -> Path:
    """Install the newest `name` (or exactly the package `file_name`) from a local channel into a fresh `prefix`
    with py-rattler, without its dependencies (an offline forge channel has no python, sympy ...); returns the
    prefix's site-packages. py-rattler runs in a child process (torchforge.rattlerchild)."""
    from torchforge.rattlerchild import call

    return call("torchforge.repack:_install_here", channel, prefix, name, file_name)  # type: ignore[no-any-return]


def _install_here(channel: Path, prefix: Path, name: str, file_name: str | None = None) -> Path:
    """`install_from_channel`'s work, in this process."""
    import rattler

    repodata = channel / SUBDIR / "repodata.json"
    if not repodata.is_file():
        raise UsageError(f"{channel} has no {SUBDIR}/repodata.json", "run `torchforge repack WHEEL --out CHANNEL` first")
    repo = rattler.SparseRepoData(rattler.Channel(str(channel.resolve())), SUBDIR, repodata)
    records = sorted((r for r in repo.load_records(rattler.PackageName(name)) if file_name in (None, r.file_name)),
                     key=lambda r: (r.version, r.build_number))
    if not records:
        raise UsageError(f"no {file_name or name} package in {channel}",
                         "run `torchforge repack WHEEL --out CHANNEL` first")
    if prefix.exists() and any(prefix.iterdir()):
        raise UsageError(f"{prefix} is not empty", "give a new folder for the prefix")
    run_async(rattler.install([records[-1]], target_prefix=prefix.resolve(), show_progress=False))
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise UsageError(f"{name} installed no site-packages into {prefix}")
    return found[0]
