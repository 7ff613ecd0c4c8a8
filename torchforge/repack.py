"""`torchforge repack`: an official torch wheel → a conda package named like the official ones.

PyTorch stopped publishing conda packages after 2.5 (official-builds.md §0); the wheels are the binaries
that are still built. Repacking puts the wheel's files under `lib/pythonX.Y/site-packages`, rewrites RPATHs
for the conda layout (§1.8: DT_RPATH to `$ORIGIN` and `<prefix>/lib`), maps `Requires-Dist` to conda names
(torchforge/data/pypi_to_conda.toml), writes a complete `info/` and compresses with conda-package-handling.
The archive is built in a temporary folder and handed to `localchannel.publish` only when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import tomllib
import zipfile
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import HeaderParser
from functools import lru_cache
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from torchforge import __version__, fileops, localchannel
from torchforge.aio import run_async
from torchforge.data import data_text
from torchforge.elf import iter_tree
from torchforge.errors import ArchiveError, AuditFailedError, UsageError
from torchforge.proc import Runner
from torchforge.rpath import AuditReport, Layout, fix_and_audit
from torchforge.wheel import WheelName, write_record
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


def check_zstd_level(level: int) -> int:
    """Checked before any work: a bad level would otherwise fail after minutes of unpacking and patching."""
    if level not in ZSTD_LEVELS:
        raise UsageError(f"--zstd-level {level} is outside zstd's levels {ZSTD_LEVELS.start}..{ZSTD_LEVELS.stop - 1}",
                         f"use {DEFAULT_ZSTD_LEVEL} (the default), or 19 for the smallest package")
    return level


@dataclass(frozen=True)
class Mapping:
    names: dict[str, str]
    drop: frozenset[str]


@lru_cache(maxsize=1)
def pypi_to_conda() -> Mapping:
    data = tomllib.loads(data_text("pypi_to_conda"))
    return Mapping(
        names={canonicalize_name(k): v for k, v in data["names"].items()},
        drop=frozenset(canonicalize_name(n) for n in data["drop"]["names"]),
    )


def conda_depends(requires: Iterable[str], python: str) -> tuple[str, ...]:
    """conda run dependencies from Requires-Dist lines, markers evaluated for linux-64 and `python` (M.m).

    Extras are optional (never run deps). A spec keeps the version constraint: `sympy>=1.13.3` → `sympy >=1.13.3`.
    """
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix", implementation_name="cpython")
    mapping = pypi_to_conda()
    major, minor = (int(x) for x in python.split("."))
    depends = [f"python >={python},<{major}.{minor + 1}.0a0"]
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue  # an extra, or a marker for another platform / python
        name = canonicalize_name(req.name)
        if name in mapping.drop:
            continue
        conda_name = mapping.names.get(name, name)
        spec = ",".join(sorted(str(s) for s in req.specifier))
        depends.append(f"{conda_name} {spec}".strip())
    return tuple(depends)


@dataclass(frozen=True)
class WheelMeta:
    name: WheelName
    python: str  # "3.11"
    requires: tuple[str, ...]
    summary: str
    license: str
    home: str
    entry_points: str  # entry_points.txt content ("" when absent)


# The distributions `repack` knows how to turn into conda packages (PEP 503 names).
REPACKABLE = frozenset({"torch"})


def check_repackable(name: str, wheel: Path) -> None:
    """A wheel of any other project (numpy, a renamed file) would be published as `pytorch`: refused."""
    if canonicalize_name(name) not in REPACKABLE:
        raise UsageError(f"{wheel.name} is a wheel of {name!r}, which torchforge does not repack",
                         f"repack takes wheels of {', '.join(sorted(REPACKABLE))}; install other projects "
                         "from conda-forge or with pip")


def read_wheel(wheel: Path) -> WheelMeta:
    name = WheelName.parse(wheel.name)
    check_repackable(name.name, wheel)
    match = re.fullmatch(r"cp(\d)(\d+)", name.python)
    if not match:
        raise UsageError(f"{wheel.name}: python tag {name.python} is not a CPython tag", "repack handles cpXY wheels")
    try:
        with zipfile.ZipFile(wheel) as zf:
            dist = next((n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")), None)
            if dist is None:
                raise ArchiveError(f"{wheel.name} has no .dist-info folder", "repack official torch wheels")
            headers = HeaderParser().parsestr(zf.read(f"{dist}/METADATA").decode("utf-8"))
            check_repackable(headers.get("Name", ""), wheel)  # the file name can lie; METADATA is what pip reads
            try:
                entry_points = zf.read(f"{dist}/entry_points.txt").decode("utf-8")
            except KeyError:
                entry_points = ""
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise ArchiveError.unreadable(wheel, exc) from exc
    urls = headers.get_all("Project-URL") or []
    home = headers.get("Home-page") or next((u.split(",", 1)[1].strip() for u in urls if "," in u), "https://pytorch.org")
    return WheelMeta(
        name=name,
        python=f"{match[1]}.{match[2]}",
        requires=tuple(headers.get_all("Requires-Dist") or ()),
        summary=headers.get("Summary", ""),
        license=headers.get("License-Expression") or headers.get("License") or "BSD-3-Clause",
        home=home,
        entry_points=entry_points,
    )


def build_string(meta: WheelMeta, build_number: int) -> str:
    """official §1.3: `py{M.m}_cpu_{N}` or `py{M.m}_cuda{M.m}_cudnn{X.Y.Z}_{N}`."""
    local = meta.name.local or "cpu"
    cuda = re.fullmatch(r"cu(\d+)(\d)", local)
    if cuda:
        cudnn = next((re.sub(r"^.*==", "", r).split(".")[:3] for r in meta.requires if r.startswith("nvidia-cudnn")), None)
        cudnn_part = f"_cudnn{'.'.join(cudnn)}" if cudnn else ""
        return f"py{meta.python}_cuda{cuda[1]}.{cuda[2]}{cudnn_part}_{build_number}"
    return f"py{meta.python}_{local}_{build_number}"


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


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def write_info(stage: Path, meta: WheelMeta, build: str, build_number: int, depends: tuple[str, ...],
               prefix_files: Iterable[str], wheel_sha256: str) -> list[str]:
    """Write info/ (index.json, paths.json, files, about.json, has_prefix, recipe/meta.yaml); returns the
    package's file list (payload then info), relative to `stage`."""
    info = stage / "info"
    (info / "recipe").mkdir(parents=True, exist_ok=True)
    payload = sorted(p.relative_to(stage).as_posix() for p in iter_tree(stage) if not p.relative_to(stage).parts[0] == "info")
    links = []
    for dirpath, dirnames, filenames in os.walk(stage):
        for entry in dirnames + filenames:
            full = Path(dirpath, entry)
            if full.is_symlink():
                links.append(full.relative_to(stage).as_posix())
    prefix_set = set(prefix_files)
    # sha256 of ~700 MB: hashlib releases the GIL, so two threads use both cores.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        hashes = dict(zip(payload, pool.map(lambda rel: _sha256(stage / rel), payload)))
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
    version = meta.name.public_version
    index = {
        "name": "pytorch", "version": version, "build": build, "build_number": build_number,
        "depends": list(depends),
        # official §1.5: CPU builds carry `run_constrained: cpuonly`, CUDA builds `cpuonly <0`.
        "constrains": ["cpuonly"] if build.split("_")[1] == "cpu" else ["cpuonly <0"],
        "license": meta.license, "subdir": SUBDIR, "platform": "linux", "arch": "x86_64",
        "timestamp": int(time.time() * 1000),
    }
    about = {
        "summary": meta.summary, "home": meta.home, "license": meta.license,
        "description": f"Repacked by torchforge {__version__} from the official wheel {meta.name.filename}.",
        "extra": {"source_wheel": meta.name.filename, "source_wheel_sha256": wheel_sha256,
                  "repacked_by": f"torchforge {__version__}", "rpath_layout": Layout.CONDA.value},
    }
    files = sorted(payload + links)
    (info / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (info / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}, indent=1) + "\n")
    (info / "about.json").write_text(json.dumps(about, indent=2, sort_keys=True) + "\n")
    (info / "files").write_text("\n".join(files) + "\n")
    if prefix_set:
        (info / "has_prefix").write_text("".join(f"{PREFIX_PLACEHOLDER} text {p}\n" for p in sorted(prefix_set)))
    run = "".join(f"    - {d}\n" for d in depends)
    constrains = "".join(f"    - {c}\n" for c in index["constrains"])
    # The recipe this package is equivalent to: what conda-build would have been given to produce it.
    (info / "recipe" / "meta.yaml").write_text(
        f"package:\n  name: pytorch\n  version: \"{version}\"\n"
        f"source:\n  url: https://download.pytorch.org/whl/{meta.name.filename.replace('+', '%2B')}\n"
        f"  sha256: {wheel_sha256}\n"
        f"build:\n  number: {build_number}\n  string: {build}\n  detect_binary_files_with_prefix: false\n"
        f"  script: torchforge repack {meta.name.filename}  # RPATHs: conda layout, DT_RPATH\n"
        f"requirements:\n  run:\n{run}  run_constrained:\n{constrains}"
        f"test:\n  imports:\n    - torch\nabout:\n  home: {meta.home}\n  license: {meta.license}\n"
        f"  summary: {json.dumps(meta.summary)}\n"
    )
    info_files = sorted(p.relative_to(stage).as_posix() for p in iter_tree(info))
    return files + info_files


@dataclass(frozen=True)
class RepackResult:
    archive: Path
    size: int
    seconds: float
    report: AuditReport | None  # None when the package was reused, not rebuilt
    depends: tuple[str, ...]
    reused: bool = False


def build_archive(
    wheel: Path,
    out_folder: Path,
    runner: Runner,
    *,
    build_number: int = 0,
    zstd_level: int = DEFAULT_ZSTD_LEVEL,
    zstd_threads: int = DEFAULT_ZSTD_THREADS,
    fmt: str = ".conda",
    work: Path | None = None,
    on_step: Callable[[str], None] | None = None,
) -> tuple[Path, AuditReport, tuple[str, ...]]:
    """Build the conda archive for `wheel` into `out_folder` (which should be a fresh temporary folder)."""
    from conda_package_handling import api as cph

    step = on_step or (lambda _s: None)
    check_zstd_level(zstd_level)
    meta = read_wheel(wheel)
    build = build_string(meta, build_number)
    depends = conda_depends(meta.requires, meta.python)
    with tempfile.TemporaryDirectory(prefix="torchforge-repack-", dir=work) as tmp:
        stage = Path(tmp) / "pkg"
        site = stage / "lib" / f"python{meta.python}" / "site-packages"
        site.mkdir(parents=True)
        step("unpacking")
        extract_wheel(wheel, site)
        dist = next(site.glob("*.dist-info"))
        (dist / "INSTALLER").write_text("conda\n")
        (dist / "REQUESTED").unlink(missing_ok=True)
        scripts = _entry_point_scripts(meta.entry_points)
        if scripts:
            (stage / "bin").mkdir()
            for name, text in scripts.items():
                (stage / "bin" / name).write_text(text)
                (stage / "bin" / name).chmod(0o755)
        # index.json first: the audit resolves <prefix>/lib libraries through the declared depends.
        (stage / "info").mkdir()
        (stage / "info" / "index.json").write_text(json.dumps({"depends": list(depends)}))
        step("fixing RPATHs")
        report = fix_and_audit(stage, Layout.CONDA, runner)
        write_record(site, dist.name)  # the .so files changed: RECORD must match what is installed
        step("hashing")
        files = write_info(stage, meta, build, build_number, depends, (f"bin/{n}" for n in scripts),
                           _sha256(wheel)[0])
        step(f"compressing ({fmt}, zstd level {zstd_level})" if fmt == ".conda" else f"compressing ({fmt})")
        out_folder.mkdir(parents=True, exist_ok=True)
        kwargs = {"compression_level": zstd_level, "compression_threads": zstd_threads} if fmt == ".conda" else {}
        cph.create(str(stage), files, f"pytorch-{meta.name.public_version}-{build}{fmt}",
                   out_folder=str(out_folder.resolve()), **kwargs)
        return out_folder / f"pytorch-{meta.name.public_version}-{build}{fmt}", report, depends


def repack(
    wheel: Path,
    channel: Path,
    runner: Runner,
    *,
    build_number: int = 0,
    zstd_level: int = DEFAULT_ZSTD_LEVEL,
    zstd_threads: int = DEFAULT_ZSTD_THREADS,
    replace: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> RepackResult:
    """Repack `wheel` and publish it into `channel/linux-64` (atomic copy + locked re-index)."""
    if not wheel.is_file():
        raise UsageError(f"{wheel} does not exist", "pip download torch==X.Y.Z --no-deps -d DIR")
    check_zstd_level(zstd_level)
    meta = read_wheel(wheel)  # a damaged wheel is refused before the channel is touched
    _check_crcs(wheel)
    start = time.perf_counter()
    with localchannel.locked(channel):
        pass  # taking the lock recovers the channel: a killed repack's scratch folders go, orphans get indexed
    existing = channel / SUBDIR / f"pytorch-{meta.name.public_version}-{build_string(meta, build_number)}.conda"
    if existing.is_file() and not replace:
        # A rerun (after an interruption, or in CI) converges: the same wheel's package is reused, not rebuilt.
        if _source_wheel_sha256(existing) == _sha256(wheel)[0]:
            return RepackResult(existing, existing.stat().st_size, time.perf_counter() - start, None,
                                conda_depends(meta.requires, meta.python), reused=True)
        raise UsageError(f"{existing} is already in the channel, repacked from another wheel",
                         "pass --replace to overwrite it")
    # The work folder lives in the channel (same file system as the result) and is removed by the next run
    # if this one is killed.
    with fileops.scratch(channel, "repack") as work:
        archive, report, depends = build_archive(
            wheel, work / "out", runner, build_number=build_number, zstd_level=zstd_level,
            zstd_threads=zstd_threads, work=work, on_step=on_step,
        )
        if not report.ok:  # fix_and_audit raises first; kept as a guard for the publish step
            raise AuditFailedError(f"{archive.name} failed the RPATH audit", "run `torchforge rpath audit` on it")
        if on_step:
            on_step("publishing")
        try:
            published = localchannel.publish(archive, channel, SUBDIR, replace=replace).path
        except localchannel.ArchiveExistsError as exc:
            raise UsageError(f"{exc.path} is already in the channel", "pass --replace to overwrite it") from None
    return RepackResult(published, published.stat().st_size, time.perf_counter() - start, report, depends)


def _check_crcs(wheel: Path) -> None:
    """Every member's CRC (a few seconds for torch): a damaged download fails here, not after unpacking."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise ArchiveError.unreadable(wheel, exc) from exc
    if bad is not None:
        raise ArchiveError.unreadable(wheel, ValueError(f"member {bad} fails its CRC check"))


def _source_wheel_sha256(archive: Path) -> object:
    """The sha256 of the wheel `archive` was repacked from (None when it cannot be read: then it is not reused)."""
    try:
        return localchannel.about_extra(archive).get("source_wheel_sha256")
    except Exception:  # damaged or foreign: not ours to reuse
        return None


def install_from_channel(channel: Path, prefix: Path, name: str = "pytorch") -> Path:
    """Install the newest `name` from a local channel into a fresh `prefix` with py-rattler, without its
    dependencies (an offline forge channel has no python, sympy ...); returns the prefix's site-packages."""
    
    import rattler

    repodata = channel / SUBDIR / "repodata.json"
    if not repodata.is_file():
        raise UsageError(f"{channel} has no {SUBDIR}/repodata.json", "run `torchforge repack WHEEL --out CHANNEL` first")
    repo = rattler.SparseRepoData(rattler.Channel(str(channel.resolve())), SUBDIR, repodata)
    records = sorted(repo.load_records(rattler.PackageName(name)), key=lambda r: (r.version, r.build_number))
    if not records:
        raise UsageError(f"no {name} package in {channel}", "run `torchforge repack WHEEL --out CHANNEL` first")
    if prefix.exists() and any(prefix.iterdir()):
        raise UsageError(f"{prefix} is not empty", "give a new folder for the prefix")
    run_async(rattler.install([records[-1]], target_prefix=prefix.resolve(), show_progress=False))
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise UsageError(f"{name} installed no site-packages into {prefix}")
    return found[0]
