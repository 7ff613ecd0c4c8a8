"""A conda channel on the local file system: atomic publication of archives and a locked, atomic re-index.

Shared by `build` (its output folder is a channel), `repack` and `upload --to file://`. Indexing uses
py-rattler's `index_fs`, so the result is readable by conda, mamba, pixi and py-rattler.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

LOCK_NAME = ".torchforge.lock"
ARCHIVE_SUFFIXES = (".conda", ".tar.bz2")
COPY_CHUNK = 8 << 20


def archive_stem(filename: str) -> str:
    for suffix in ARCHIVE_SUFFIXES:
        if filename.endswith(suffix):
            return filename[: -len(suffix)]
    return filename


@contextmanager
def locked(channel: Path, timeout: float = 600) -> Iterator[None]:
    """Hold the channel's lock: one writer (copy + index) at a time, across processes."""
    channel.mkdir(parents=True, exist_ok=True)
    with FileLock(str(channel / LOCK_NAME), timeout=timeout):
        yield


# py-rattler's index_fs has been seen to crash the interpreter (SIGSEGV) after several calls in one process;
# indexing in a short-lived child keeps such a crash from taking the caller down, and the index is idempotent,
# so a crashed attempt is simply run again.
_INDEX_ATTEMPTS = 3


def index(channel: Path) -> None:
    """Write repodata.json for every subdir, in a child process. Caller should hold `locked(channel)`."""
    from torchforge.errors import ToolFailedError
    from torchforge.proc import Command, Runner

    command = Command(argv=(sys.executable, "-m", "torchforge.localchannel", str(channel)))
    for attempt in range(1, _INDEX_ATTEMPTS + 1):
        result = Runner().run(command, check=False)
        if result.returncode == 0:
            return
        if result.returncode > 0 or attempt == _INDEX_ATTEMPTS:
            raise ToolFailedError(f"indexing {channel} failed (exit status {result.returncode})",
                                  "check that the channel folder is writable and its archives are readable",
                                  tail=result.output[-4000:])


def _index_here(channel: Path) -> None:
    from rattler import index as rattler_index

    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    asyncio.run(rattler_index.index_fs(channel, write_zst=False, write_shards=False, force=True))
    # index_fs leaves a scratch folder behind; it is not part of the channel.
    shutil.rmtree(channel / ".tmp", ignore_errors=True)


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
) -> Path:
    """Copy `archive` into `channel/subdir` atomically and re-index, under the channel lock.

    The copy is written to a temporary name in the same folder and renamed, so readers never see a
    partial archive, and repodata is rewritten only after the archive is complete. `progress`, if given,
    is called with the number of bytes copied after each chunk (uploads of large packages show it).
    """
    with locked(channel):
        target_dir = channel / subdir
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / archive.name
        if target.exists() and not replace:
            raise FileExistsError(target)
        fd, tmp_name = tempfile.mkstemp(prefix=".partial-", dir=target_dir)
        os.close(fd)
        try:
            if progress is None:
                shutil.copyfile(archive, tmp_name)
            else:
                _copy_with_progress(archive, Path(tmp_name), progress)
            # mkstemp creates the file 0600; a channel is read by other users and by web servers.
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        index(channel)
        return target


def _copy_with_progress(source: Path, dest: Path, progress: Callable[[int], None]) -> None:
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


if __name__ == "__main__":
    _index_here(Path(sys.argv[1]))
