"""Extracting a wheel (a zip) with its file modes: zipfile's extractall drops them, and executables and
shared libraries must keep their bits. One worker per core: zlib releases the GIL, and the torch wheel is
700 MB unpacked. Used by the RPATH audit, wheel repair and repack alike.
"""

from __future__ import annotations

import os
import threading
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torchforge.errors import ArchiveError
from torchforge.safeextract import check_zip


CHUNK = 1 << 20


def extract_wheel(wheel: Path, dest: Path, check: Callable[[], None] = lambda: None) -> None:
    """Extract every member with its mode. A damaged wheel (bad zip, CRC or deflate stream), or one with a member
    that would land outside `dest` (torchforge.safeextract), is an ArchiveError and nothing is written. `check`
    is called after each MiB written; it raises to stop the extraction (a cancelled repack stops within a chunk,
    not after the wheel's 700 MB)."""
    try:
        _extract(wheel, dest, check)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ArchiveError.unreadable(wheel, exc) from exc


def _extract(wheel: Path, dest: Path, check: Callable[[], None]) -> None:
    with zipfile.ZipFile(wheel) as zf:
        check_zip(wheel, zf)  # every member judged before the first folder is made
        entries = zf.infolist()
    members = [m for m in entries if not m.is_dir()]
    for entry in entries:
        folder = dest / entry.filename if entry.is_dir() else (dest / entry.filename).parent
        folder.mkdir(parents=True, exist_ok=True)
    workers = os.cpu_count() or 1
    # Largest first, each worker taking the next member when it is done (longest-processing-time first): the
    # worker that inflates libtorch_cpu.so gets nothing else, where a round-robin deal gave it a share as well.
    members.sort(key=lambda m: -m.file_size)
    todo = iter(members)
    taking = threading.Lock()

    def take() -> zipfile.ZipInfo | None:
        with taking:
            return next(todo, None)

    def work(_worker: int) -> None:
        with zipfile.ZipFile(wheel) as zf:
            while (member := take()) is not None:
                target = dest / member.filename
                with zf.open(member) as src, target.open("wb") as dst:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                        check()
                mode = (member.external_attr >> 16) & 0o777
                if mode:
                    target.chmod(mode)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, range(workers)))
