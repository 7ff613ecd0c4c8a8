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

import json
import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence
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
    UsageError,
)
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


def version_tuple(text: str) -> tuple[int, ...]:
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
        patchelf_minimum=version_tuple(data["patchelf"]["minimum"]),
        patchelf_broken=tuple(version_tuple(v) for v in data["patchelf"]["broken_series"]),
        env_libraries={k: tuple(v) for k, v in data["env_libraries"].items()},
    )


# ---------------------------------------------------------------------------------------------- tree


@dataclass(frozen=True)
class Tree:
    """Where things sit in an unpacked package. All `*rel` values are POSIX paths relative to `root`,
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


def normalized(rel: str) -> str:
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
    provided = {normalized(f"{site}/{folder}"): libs for folder, libs in catalog().provided_dirs(depends).items()}
    return Tree(
        root=root,
        site_rel=site,
        env_lib_rel=normalized(f"{site}/../..") if _is_wheel_root(root, site) else "lib",
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
    return tuple(normalized(f"{tree.site_rel}/{d}") for d in entries)


def relative_path(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def expand_entry(entry: str, file_dir_rel: str) -> str | None:
    """The directory an RPATH entry names, relative to the root; None for an absolute entry."""
    for token in ORIGIN_TOKENS:
        if entry == token or entry.startswith(token + "/"):
            return normalized(posixpath.join(file_dir_rel, entry[len(token) :].lstrip("/")))
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
    rel = relative_path(tree.root, info.path)
    file_dir = posixpath.dirname(rel) or "."
    findings: list[Finding] = []
    tag = "RUNPATH" if info.runpath else ("RPATH" if info.rpath else "-")
    if layout.needs_dt_rpath and info.runpath:
        findings.append(Finding(rel, Kind.RUNPATH, f"DT_RUNPATH {':'.join(info.runpath)}; {layout.value} needs DT_RPATH"))
    dirs: list[tuple[str, str]] = []  # (where, dir_rel) usable for resolution, in search order
    for entry in info.search_path:
        expanded = expand_entry(entry, file_dir)
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
    findings.extend(Finding(relative_path(root, e.path), Kind.UNREADABLE, e.reason) for e in found.unreadable)
    if tree.is_prefix:
        findings.extend(_undeclared(root, files))
    real_root = os.path.realpath(root)
    for link in found.symlinks:
        target = os.path.realpath(link)
        if not target.startswith(real_root + os.sep):
            findings.append(Finding(relative_path(root, link), Kind.SYMLINK_ESCAPES, f"-> {os.readlink(link)}"))
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


# ---------------------------------------------------------------------------------------------- apply


def summarize(findings: Iterable[Finding], limit: int = 3) -> str:
    items = list(findings)
    shown = "; ".join(f"{f.file}: {f.kind.value} {f.detail}" for f in items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")
