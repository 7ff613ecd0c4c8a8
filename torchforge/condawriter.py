"""Writing a `.conda` archive (format v2) from a staged package folder, the same bytes on any machine.

The format: a stored (uncompressed) zip holding `metadata.json`, then `pkg-<stem>.tar.zst` (every file outside
info/) and `info-<stem>.tar.zst`. Each tar is one zstd stream. Three things make the bytes reproducible:
- every zstd stream uses zstd's multi-threaded mode, even with one thread: its output depends on the level
  and the input alone, never on the number of workers (nb_workers=0, the single-threaded mode, cuts blocks
  differently, so it is never used);
- tar and zip entries carry one given time (the wheel's) with uid/gid 0 and no user names, in the order given;
- the tar's size is computed from its headers and pledged to zstd, so readers see the content size in the
  frame header; nothing is read twice to find it.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python >= 3.14
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-untyped,unused-ignore]

FORMAT_VERSION = 2
CHUNK = 1 << 20  # what is read from a file and handed to zstd at once: few Python calls per gigabyte
Check = Callable[[], None]  # raises to stop a long write (a cancelled repack); called once per chunk


def _tarinfo(stage: Path, rel: str, mtime: int) -> tarfile.TarInfo:
    path = stage / rel
    st = os.lstat(path)
    info = tarfile.TarInfo(rel)
    info.mtime = mtime
    info.mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    else:
        raise ValueError(f"{path} is neither a file nor a symbolic link")
    return info


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> int:
    return -size % tarfile.BLOCKSIZE


def tar_size(infos: Sequence[tarfile.TarInfo]) -> int:
    """The length of the tar `write_tar` writes for `infos`: headers, data padded to blocks, two zero blocks,
    the whole padded to tar's record size (as tarfile itself pads)."""
    body = sum(len(_header(i)) + i.size + _padding(i.size) for i in infos) + 2 * tarfile.BLOCKSIZE
    return body + (-body % tarfile.RECORDSIZE)


def write_tar(stage: Path, infos: Sequence[tarfile.TarInfo], sink: Callable[[bytes], object], check: Check) -> None:
    """An uncompressed tar of `infos` (files under `stage`) written through `sink`."""
    written = 0
    for info in infos:
        header = _header(info)
        sink(header)
        written += len(header)
        if info.isreg():
            with (stage / info.name).open("rb") as fh:
                left = info.size
                while left:
                    chunk = fh.read(min(CHUNK, left))
                    if not chunk:
                        raise OSError(f"{stage / info.name} shrank while it was being packed")
                    sink(chunk)
                    left -= len(chunk)
                    check()
            sink(b"\0" * _padding(info.size))
            written += info.size + _padding(info.size)
    end = 2 * tarfile.BLOCKSIZE
    end += -(written + end) % tarfile.RECORDSIZE
    sink(b"\0" * end)


def _compressor(level: int, threads: int, size: int) -> zstd.ZstdCompressor:
    options = {zstd.CompressionParameter.compression_level: level,
               zstd.CompressionParameter.nb_workers: max(1, threads)}
    compressor = zstd.ZstdCompressor(options=options)
    compressor.set_pledged_input_size(size)
    return compressor


def _zip_entry(name: str, mtime: int) -> zipfile.ZipInfo:
    entry = zipfile.ZipInfo(name, date_time=time.gmtime(max(mtime, 315532800))[:6])  # zip dates start in 1980
    entry.compress_type = zipfile.ZIP_STORED
    entry.create_system = 3  # Unix, whatever the writing machine
    entry.external_attr = 0o644 << 16
    return entry


def _write_component(archive: zipfile.ZipFile, name: str, stage: Path, infos: Sequence[tarfile.TarInfo],
                     level: int, threads: int, mtime: int, check: Check) -> None:
    compressor = _compressor(level, threads, tar_size(infos))
    with archive.open(_zip_entry(name, mtime), "w", force_zip64=True) as member:
        out: BinaryIO = member  # type: ignore[assignment]

        def sink(data: bytes) -> None:
            out.write(compressor.compress(data))

        write_tar(stage, infos, sink, check)
        out.write(compressor.flush())


def is_info(rel: str) -> bool:
    return rel.split("/", 1)[0] == "info"


def write_conda(stage: Path, files: Iterable[str], dest: Path, *, level: int, threads: int, mtime: int,
                check: Check = lambda: None) -> Path:
    """Write `dest` (named `<stem>.conda`) from the files and symbolic links `files` (relative to `stage`)."""
    stem = dest.name.removesuffix(".conda")
    listed = list(files)
    components = ((f"pkg-{stem}.tar.zst", [r for r in listed if not is_info(r)]),
                  (f"info-{stem}.tar.zst", [r for r in listed if is_info(r)]))
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(_zip_entry("metadata.json", mtime), json.dumps({"conda_pkg_format_version": FORMAT_VERSION}))
        for name, rels in components:
            infos = [_tarinfo(stage, rel, mtime) for rel in rels]
            _write_component(archive, name, stage, infos, level, threads, mtime, check)
    return dest
