"""Conda archives as upload sees them: collected from files and build outputs, and verified completely
(every container stream read to its end) before anything leaves the machine, so a truncated or misplaced
file is refused with a clear message instead of half-uploaded.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import re
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchforge.errors import ArchiveError, UsageError
from torchforge.localchannel import ARCHIVE_SUFFIXES, archive_stem
from torchforge.safeextract import MemberRule

# conda subdirs: noarch, or <os>-<arch> (linux-64, osx-arm64, win-64, linux-aarch64, ...).
SUBDIR_RE = re.compile(r"^(noarch|(linux|osx|win|emscripten|wasi|zos|freebsd)-[a-z0-9_]+)$")
HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Archive:
    """A verified conda archive and the facts the targets need about it."""

    path: Path
    name: str
    version: str
    build: str
    subdir: str
    sha256: str
    md5: str
    size: int

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def stem(self) -> str:
        return archive_stem(self.path.name)


def _hashes(path: Path) -> tuple[str, str, int]:
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), md5.hexdigest(), size


def _read_tar(stream: IO[bytes], found: dict[str, int], meta: dict[str, bytes], rule: MemberRule) -> None:
    """Read one tar stream to its end: every member's data is decompressed, so a short or damaged stream
    raises here (zstd and bz2 raise EOFError or their own errors, tarfile ReadError). Every member goes through
    the extraction rule: a package that would install outside its prefix is refused before it is sent."""
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for member in rule.checked(tf):
            if not (member.isfile() or member.issym() or member.islnk()):
                continue
            found[member.name] = member.size if member.isfile() else -1
            fh = tf.extractfile(member) if member.isfile() else None
            if fh is None:
                continue
            data = bytearray() if member.name in ("info/index.json", "info/paths.json") else None
            while chunk := fh.read(HASH_CHUNK):
                if data is not None:
                    data += chunk
            if data is not None:
                meta[member.name] = bytes(data)


def _read_index_json(path: Path) -> dict[str, object]:
    """info/index.json of a .conda or .tar.bz2, after checking the whole package is intact.

    The outer container is not enough: a .conda is a zip of zstd tarballs, and a zip whose CRCs match can
    still hold a truncated inner stream. Every inner stream is decompressed to its end-of-stream marker and
    every tar member read, and the files info/paths.json lists must all be there with their sizes.
    """
    from backports import zstd  # conda-package-handling's own zstd dependency

    stem = archive_stem(path.name)
    found: dict[str, int] = {}
    meta: dict[str, bytes] = {}
    rule = MemberRule(path)
    if path.name.endswith(".conda"):
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise ArchiveError(f"{path}: member {bad} is corrupt", "rebuild or re-download the package")
            names = zf.namelist()
            for part in ("info", "pkg"):
                member = f"{part}-{stem}.tar.zst"
                if member not in names:
                    raise ArchiveError(
                        f"{path}: no {member} inside",
                        "a .conda file must keep the name it was built with (its members are named after it)",
                    )
                with zf.open(member) as raw, zstd.ZstdFile(raw) as stream:
                    _read_tar(stream, found, meta, rule)
    else:
        with path.open("rb") as raw, bz2.BZ2File(raw) as stream:
            _read_tar(stream, found, meta, rule)
    rule.finish()
    if "info/index.json" not in meta:
        raise ArchiveError(f"{path}: no info/index.json inside", "this is not a conda package")
    if "info/paths.json" in meta:
        # Files and links only: a "directory" entry (an empty folder) is not a tar member of its own name.
        listed = [e for e in json.loads(meta["info/paths.json"]).get("paths", [])
                  if e.get("path_type", "hardlink") in ("hardlink", "softlink")]
        missing = [e["_path"] for e in listed if e.get("_path") not in found]
        short = [e["_path"] for e in listed if e.get("_path") in found and e.get("path_type") == "hardlink"
                 and e.get("size_in_bytes") is not None and found[e["_path"]] not in (-1, e["size_in_bytes"])]
        if missing or short:
            names = ", ".join((missing + short)[:3]) + (" ..." if len(missing) + len(short) > 3 else "")
            raise ArchiveError(f"{path}: its payload is incomplete ({len(missing)} file(s) missing, "
                               f"{len(short)} of the wrong size: {names})", "rebuild or re-download the package")
    index = json.loads(meta["info/index.json"])
    if not isinstance(index, dict):
        raise ArchiveError(f"{path}: info/index.json is not a JSON object", "rebuild the package")
    return index


def inspect_archive(path: Path) -> Archive:
    """Verify one archive and describe it. Raises ArchiveError with what is wrong and what would work."""
    if not path.is_file():
        raise ArchiveError(f"{path} does not exist or is not a file")
    if not path.name.endswith(ARCHIVE_SUFFIXES):
        raise ArchiveError(f"{path} is not a conda archive", "upload .conda or .tar.bz2 files")
    try:
        index = _read_index_json(path)
    except ArchiveError:
        raise
    except Exception as exc:  # zipfile, tarfile, bz2, zstd and json each raise their own types
        raise ArchiveError.unreadable(path, exc) from exc
    missing = [key for key in ("name", "version", "build", "subdir") if not index.get(key)]
    if missing:
        raise ArchiveError(f"{path}: info/index.json lacks {', '.join(missing)}", "rebuild the package")
    subdir = str(index["subdir"])
    folder = path.parent.name
    # A file inside a subdir-named folder must be built for that subdir: a linux-64 package under osx-arm64/
    # would otherwise be published where solvers for the wrong platform find it.
    if SUBDIR_RE.match(folder) and folder != subdir:
        raise ArchiveError(
            f"{path} is built for {subdir} but sits in {folder}/",
            f"move it to {path.parent.parent / subdir / path.name} (or check the build's target platform)",
        )
    expected = f"{index['name']}-{index['version']}-{index['build']}"
    if archive_stem(path.name) != expected:
        raise ArchiveError(f"{path}: file name does not match its metadata ({expected})",
                           "conda archives must be named <name>-<version>-<build>; rename it back")
    sha256, md5, size = _hashes(path)
    return Archive(path=path, name=str(index["name"]), version=str(index["version"]), build=str(index["build"]),
                   subdir=subdir, sha256=sha256, md5=md5, size=size)


def collect(packages: Sequence[Path], from_dir: Path | None) -> list[Path]:
    """The archives to upload: the files given, plus every archive in `from_dir/<subdir>/` (a build output)."""
    if not packages and from_dir is None:
        raise UsageError("nothing to upload", "name package files, or --from OUT for a build output folder")
    found: list[Path] = [Path(p) for p in packages]
    if from_dir is not None:
        if not from_dir.is_dir():
            raise UsageError(f"--from {from_dir}: no such folder")
        for sub in sorted(p for p in from_dir.iterdir() if p.is_dir() and SUBDIR_RE.match(p.name)):
            found.extend(sorted(f for f in sub.iterdir() if f.name.endswith(ARCHIVE_SUFFIXES)
                                and not f.name.startswith(".")))
        if len(found) == len(packages):
            raise UsageError(f"--from {from_dir}: no .conda or .tar.bz2 files in its subdir folders",
                             "point --from at a folder laid out as <folder>/<subdir>/<package>")
    seen: set[str] = set()
    unique: list[Path] = []
    for path in found:
        if path.name in seen:
            raise UsageError(f"{path.name} is named twice", "upload each file once")
        seen.add(path.name)
        unique.append(path)
    return unique


def inspect_all(paths: Iterable[Path]) -> list[Archive]:
    """Verify every archive before the first upload, so a bad file aborts the run before it starts."""
    return [inspect_archive(p) for p in paths]
