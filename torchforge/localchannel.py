"""A conda channel on the local file system: atomic publication of archives and a locked, atomic re-index.

Shared by `build` (its output folder is a channel), `repack` and `upload --to file://`. Indexing uses
py-rattler's `index_fs`, so the result is readable by conda, mamba, pixi and py-rattler.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from filelock import FileLock

from torchforge import repodata
from torchforge.aio import run_async
from torchforge.fileops import (clean_stale, ensure_dir, move_into_place, path_of_file_url, scratch, sha256_file,
                                writing)

LOCK_NAME = ".torchforge.lock"
ARCHIVE_SUFFIXES = (".conda", ".tar.bz2")
COPY_CHUNK = 8 << 20


def archive_stem(filename: str) -> str:
    for suffix in ARCHIVE_SUFFIXES:
        if filename.endswith(suffix):
            return filename[: -len(suffix)]
    return filename


class Placed(str, Enum):
    ADDED = "added"
    REPLACED = "replaced"
    IDENTICAL = "identical"  # the channel already had a byte-identical file: nothing to do


@dataclass(frozen=True)
class Published:
    path: Path
    placed: Placed


class ArchiveExistsError(Exception):
    """The channel has a different file under this name and replacing was not asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path


@contextmanager
def locked(channel: Path, timeout: float = 600) -> Iterator[None]:
    """Hold the channel's lock: one writer (copy + index) at a time, across processes. Whoever takes the lock
    first finishes what a killed writer left (see `recover`), so every writer starts from a consistent channel."""
    ensure_dir(channel, "channel folder")
    with FileLock(str(channel / LOCK_NAME), timeout=timeout):
        recover(channel)
        yield


def _listed(subdir: Path) -> set[str] | None:
    """File names repodata.json lists for one subdir; None when it is missing or unreadable."""
    data = repodata.read(subdir)
    return None if data is None else set(data["packages"]) | set(data["packages.conda"])  # type: ignore[call-overload]


def recover(channel: Path) -> bool:
    """Converge a channel after a killed writer (caller holds the lock): remove its scratch folders and
    index_fs's `.tmp/`, and re-index when the archives on disk and repodata.json disagree. An archive on disk
    is always complete (it is renamed into place whole), so completing its index entry is what was left to
    do. Returns whether it re-indexed."""
    clean_stale(channel)
    shutil.rmtree(channel / ".tmp", ignore_errors=True)
    for sub in channel.iterdir():
        if not sub.is_dir() or sub.name.startswith("."):
            continue
        for partial in sub.glob(".partial-*"):  # written by torchforge < 0.2 before its rename
            partial.unlink(missing_ok=True)
        on_disk = _on_disk(sub)
        listed = _listed(sub)
        if (listed is None and on_disk) or (listed is not None and listed != on_disk):
            index(channel)
            return True
    return False


def index(channel: Path) -> None:
    """Write repodata.json for every subdir. Caller should hold `locked(channel)`.

    py-rattler runs in a child that skips interpreter teardown (torchforge.rattlerchild): its index_fs has
    crashed the interpreter at shutdown after writing a complete index."""
    from torchforge.rattlerchild import call

    try:
        call("torchforge.localchannel:_index_here", channel)
    except OSError as exc:  # py-rattler names the file it could not write relative to the channel
        if exc.filename is None or Path(exc.filename).is_absolute():
            raise
        raise OSError(exc.errno, exc.strerror, str(channel / exc.filename)) from None


def _index_here(channel: Path) -> None:
    from rattler import index as rattler_index

    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    run_async(rattler_index.index_fs(channel, write_zst=False, write_shards=False, force=True))
    # index_fs leaves a scratch folder behind; it is not part of the channel.
    shutil.rmtree(channel / ".tmp", ignore_errors=True)


def folder_of(channel: str) -> Path | None:
    """The local folder a channel argument names, or None for a URL or a channel name (conda-forge).

    A file:// URL, or a path: an existing folder, or anything written as one (/abs, ./rel, ~/x), so that a
    missing folder is reported as missing rather than looked up as a channel name.
    """
    if channel.startswith("file://"):
        return path_of_file_url(channel) or Path(channel[len("file://"):])
    if "://" in channel:
        return None
    if channel.startswith(("/", ".", "~")) or Path(channel).is_dir():
        return Path(channel).expanduser()
    return None


def archives(channel: Path) -> Iterator[Path]:
    """Every package archive in the channel's subdirs."""
    for suffix in ARCHIVE_SUFFIXES:
        yield from channel.glob(f"*/*{suffix}")


def find(channel: Path, subdir: str, stem: str) -> Path | None:
    """The archive `<stem>.conda` or `<stem>.tar.bz2` in `channel/subdir`, if present."""
    for suffix in ARCHIVE_SUFFIXES:
        candidate = channel / subdir / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def same_content(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (size first, then sha256 of both)."""
    if a.stat().st_size != b.stat().st_size:
        return False
    return sha256_file(a) == sha256_file(b)


def info_json(archive: Path, name: str) -> dict[str, object]:
    """info/<name> (a JSON file) of a .conda or .tar.bz2, {} when absent. Streams only the info/ part."""
    from conda_package_streaming.package_streaming import stream_conda_info

    for tar, member in stream_conda_info(str(archive)):
        if member.name == f"info/{name}":
            handle = tar.extractfile(member)
            value = json.loads(handle.read()) if handle else {}
            return value if isinstance(value, dict) else {}
    return {}


def about_extra(archive: Path) -> dict[str, object]:
    """The `extra` table of an archive's info/about.json ({} when absent)."""
    extra = info_json(archive, "about.json").get("extra", {})
    return extra if isinstance(extra, dict) else {}


def publish(
    archive: Path,
    channel: Path,
    subdir: str,
    *,
    replace: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Published:
    """Copy `archive` into `channel/subdir` atomically and re-index, under the channel lock.

    The copy is written into a scratch folder of the channel and renamed into place whole, and repodata is
    rewritten right after, under the same lock; a run killed in between leaves a complete archive that the
    next writer indexes (`recover`). A byte-identical file already there is left as is (a rerun converges);
    a different one raises ArchiveExistsError unless `replace`. `progress`, if given, is called with the
    number of bytes copied after each chunk (uploads of large packages show it).
    """
    with locked(channel):
        placed = _place(archive, channel, subdir, replace, progress)
        if placed.placed is not Placed.IDENTICAL:
            index(channel)
        return placed


def publish_many(archives: list[Path], channel: Path, subdir: str, *, replace: bool = False,
                 move: bool = False, records: Mapping[str, repodata.Record] | None = None) -> list[Published]:
    """`publish` for several archives under one lock and one re-index (a repacked stack: indexing reads every
    archive of the channel, so once per archive would read the stack's gigabytes once per package). Each is
    checked before any is copied; a run killed between copies leaves complete archives `recover` indexes.
    `move`: the archives are the caller's scratch files, renamed into place rather than copied where they lie
    on the channel's file system. `records`: each archive's repodata record by file name (repodata.record_of,
    taken while the builds ran), merged into the channel's index instead of re-reading every archive."""
    with locked(channel):
        for archive in archives:
            target = channel / subdir / archive.name
            if target.exists() and not replace and not same_content(archive, target):
                raise ArchiveExistsError(target)
        placed = [_place(archive, channel, subdir, replace, None, move) for archive in archives]
        changed = [p.path.name for p in placed if p.placed is not Placed.IDENTICAL]
        if changed and not (records is not None and _index_known(channel, subdir, {n: records[n] for n in changed
                                                                                  if n in records})):
            index(channel)
        return placed


def _index_known(channel: Path, subdir: str, records: Mapping[str, repodata.Record]) -> bool:
    """Merge `records` into `subdir`'s repodata.json (caller holds the lock; `recover` left the index true to
    the disk). False, and nothing written, where that would not give the index a full re-index writes: an
    index missing or listing other archives than the disk's, or an archive without its record."""
    for name in (subdir, "noarch"):
        folder = channel / name
        expected = set(records) if name == subdir else set()
        if _on_disk(folder) != (_listed(folder) or set()) | expected:
            return False
    for name in ("noarch", subdir) if subdir != "noarch" else (subdir,):
        folder = ensure_dir(channel / name, "channel subdir")
        current = repodata.read(folder) or repodata.empty(name)
        if name == subdir or not (folder / "repodata.json").is_file():
            repodata.write(folder, repodata.merged(current, records if name == subdir else {}))
    return True


def _on_disk(subdir: Path) -> set[str]:
    if not subdir.is_dir():
        return set()
    return {p.name for p in subdir.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES) and not p.name.startswith(".")}


def _place(archive: Path, channel: Path, subdir: str, replace: bool,
           progress: Callable[[int], None] | None, move: bool = False) -> Published:
    """Copy `archive` into place (scratch copy, then rename); the caller holds the lock and indexes."""
    target_dir = ensure_dir(channel / subdir, "channel subdir")
    target = target_dir / archive.name
    existed = target.exists()
    if existed and same_content(archive, target):
        return Published(target, Placed.IDENTICAL)
    if existed and not replace:
        raise ArchiveExistsError(target)
    with scratch(channel, "publish") as tmp:
        partial = tmp / archive.name
        if not (move and _renamed(archive, partial)):
            with writing(target):
                _copy(archive, partial, progress or (lambda _n: None))
        os.chmod(partial, 0o644)  # a channel is read by other users and by web servers
        move_into_place(partial, target)
    return Published(target, Placed.REPLACED if existed else Placed.ADDED)


def _renamed(source: Path, dest: Path) -> bool:
    """Rename when both lie on one file system; False (and nothing done) otherwise."""
    try:
        os.rename(source, dest)
    except OSError:
        return False
    return True


def _copy(source: Path, dest: Path, progress: Callable[[int], None]) -> None:
    with source.open("rb") as src, dest.open("wb") as dst:
        while chunk := src.read(COPY_CHUNK):
            dst.write(chunk)
            progress(len(chunk))


def unpublish(channel: Path, subdir: str, filename: str) -> bool:
    """Remove `channel/subdir/filename` and re-index, under the channel lock. False if it was not there."""
    with locked(channel):
        target = channel / subdir / filename
        if not target.is_file():
            return False
        target.unlink()
        index(channel)
        return True
