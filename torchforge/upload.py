"""Upload sequencing shared by every target: collect and verify archives, retry transient failures, report.

The per-target work (copy + index, anaconda-client, quetz HTTP) lives in `torchforge.uploaders`; this module
decides *what* is sent and checks each archive before anything leaves the machine, so a truncated or
misplaced file is refused here with a clear message instead of half-uploaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from torchforge.errors import UploadFailedError, UsageError
from torchforge.localchannel import ARCHIVE_SUFFIXES, archive_stem

if TYPE_CHECKING:  # uploaders import this module; the protocol is only needed for annotations
    from torchforge.uploaders import Uploader

# conda subdirs: noarch, or <os>-<arch> (linux-64, osx-arm64, win-64, linux-aarch64, ...).
SUBDIR_RE = re.compile(r"^(noarch|(linux|osx|win|emscripten|wasi|zos|freebsd)-[a-z0-9_]+)$")
HASH_CHUNK = 1 << 20


class ExistingPolicy(str, Enum):
    """What to do when the target already has a file with the same name."""

    FAIL = "fail"
    SKIP = "skip"
    FORCE = "force"


class Outcome(str, Enum):
    UPLOADED = "uploaded"
    REPLACED = "replaced"
    SKIPPED = "skipped"
    DRY_RUN = "dry-run"


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


class ArchiveError(UsageError):
    """An archive that must not be sent: unreadable, truncated, without metadata, or in the wrong folder."""


class TransientError(Exception):
    """A failure worth retrying (5xx, reset connection). Never escapes `with_retries`."""


class AuthError(UploadFailedError):
    """The target refused the credentials; retrying cannot help."""


class ExistsError(UploadFailedError):
    """The target already has this file and the policy is FAIL."""


def _hashes(path: Path) -> tuple[str, str, int]:
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), md5.hexdigest(), size


def _read_index_json(path: Path) -> dict[str, object]:
    """info/index.json of a .conda or .tar.bz2, after checking the whole container is intact.

    A .conda is a zip of zstd tarballs: `testzip` checks every member's CRC, which catches truncation and
    bit flips. A .tar.bz2 has no index at the end, so it is read to the end (bz2 checks its block CRCs).
    """
    stem = archive_stem(path.name)
    if path.name.endswith(".conda"):
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise ArchiveError(f"{path}: member {bad} is corrupt", "rebuild or re-download the package")
            if f"info-{stem}.tar.zst" not in zf.namelist():
                raise ArchiveError(
                    f"{path}: no info-{stem}.tar.zst inside",
                    "a .conda file must keep the name it was built with (its members are named after it)",
                )
        from rattler import IndexJson

        index = IndexJson.from_package_archive(path)
        return {"name": index.name.normalized, "version": str(index.version), "build": index.build,
                "subdir": index.subdir}
    found: dict[str, object] | None = None
    with tarfile.open(path, "r:bz2") as tf:
        for member in tf:  # iterating to the end forces every bz2 block to be decompressed and checked
            if member.name == "info/index.json":
                fh = tf.extractfile(member)
                if fh is not None:
                    found = json.loads(fh.read())
    if found is None:
        raise ArchiveError(f"{path}: no info/index.json inside", "this is not a conda package")
    return found


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
    except Exception as exc:  # zipfile, tarfile, bz2, zstd and rattler each raise their own types
        raise ArchiveError(f"{path} is not a readable conda archive ({type(exc).__name__}: {exc})",
                           "rebuild it, or re-download it if it was copied") from exc
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


T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    first_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 30.0


def with_retries(
    action: Callable[[], T],
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `action`; on TransientError wait (exponential back-off) and try again, up to `policy.attempts`."""
    delay = policy.first_delay
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except TransientError as exc:
            if attempt == policy.attempts:
                raise UploadFailedError(
                    f"{what}: gave up after {attempt} attempts: {exc}",
                    "the server kept failing; try again later or check its status",
                ) from exc
            if on_retry is not None:
                on_retry(f"{what}: {exc}; retrying in {delay:.1f}s (attempt {attempt + 1}/{policy.attempts})")
            sleep(delay)
            delay = min(delay * policy.factor, policy.max_delay)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Sent:
    archive: Archive
    outcome: Outcome


def upload_all(
    uploader: Uploader,
    archives: Sequence[Archive],
    policy: ExistingPolicy,
    *,
    advance_for: Callable[[Archive], Callable[[int], None]],
    on_retry: Callable[[str], None] | None = None,
    retry: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
) -> list[Sent]:
    """Upload `archives` one by one with retries. Stops at the first permanent failure (auth, exists, 4xx)."""
    sent: list[Sent] = []
    for archive in archives:
        advance = advance_for(archive)

        def attempt(archive: Archive = archive, advance: Callable[[int], None] = advance) -> Outcome:
            return uploader.upload(archive, policy, advance)

        outcome = with_retries(attempt, f"upload of {archive.filename}", retry, on_retry, sleep)
        sent.append(Sent(archive, outcome))
    return sent
