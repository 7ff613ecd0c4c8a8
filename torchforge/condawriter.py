"""Writing a `.conda` archive (format v2) from a staged package folder, the same bytes on any machine.

The format: a stored (uncompressed) zip holding `metadata.json`, then `pkg-<stem>.tar.zst` (every file outside
info/) and `info-<stem>.tar.zst`. Each tar is one zstd stream. Three things make the bytes reproducible:
- every zstd stream uses zstd's multi-threaded mode, even with one thread: its output depends on the level
  and the input alone, never on the number of workers (nb_workers=0, the single-threaded mode, cuts blocks
  differently, so it is never used);
- tar and zip entries carry one given time (the wheel's) with uid/gid 0 and no user names, in the order given;
- the tar's size is computed from its headers and pledged to zstd, so readers see the content size in the
  frame header; nothing is read twice to find it.
Each file's sha256 is taken from the bytes as they are packed, by the thread that hands them to zstd (the
digests the caller passes in fill up as the files go): no second read of a file, and no pool of hashing
threads beside the stream (on 16 cores such a pool, contending for the GIL with the feeding thread, made one
package's stream three times slower). The info component is asked for (`finish`) only once the pkg component
is written, and a `prepare` hook runs before each file is read: the caller writes the wheel's RECORD (packed
last) and then info/paths.json from the digests of the files packed before.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python >= 3.14
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-untyped,unused-ignore]

FORMAT_VERSION = 2
CHUNK = 1 << 20  # what is read from a file and handed to zstd at once: few Python calls per gigabyte
Check = Callable[[], None]  # raises to stop a long write (a cancelled repack); called once per chunk
Prepare = Callable[[str], None]
Digests = dict[str, tuple[str, int]]  # sha256 (hex) and size of each packed file, by its path in the package


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


def write_tar(stage: Path, infos: Sequence[tarfile.TarInfo], sink: Callable[[bytes], object], check: Check,
              prepare: Prepare, digests: Digests) -> None:
    """An uncompressed tar of `infos` (files under `stage`) written through `sink`. `prepare(name)` runs before
    a file is read (the package's RECORD, packed last, is filled in then); each file's digest goes into
    `digests` once it is packed."""
    written = 0
    for info in infos:
        header = _header(info)
        sink(header)
        written += len(header)
        if info.isreg():
            prepare(info.name)
            digests[info.name] = (_stream(stage / info.name, info.size, sink, check), info.size)
            sink(b"\0" * _padding(info.size))
            written += info.size + _padding(info.size)
    end = 2 * tarfile.BLOCKSIZE
    end += -(written + end) % tarfile.RECORDSIZE
    sink(b"\0" * end)


def _stream(path: Path, size: int, sink: Callable[[bytes], object], check: Check) -> str:
    """`size` bytes of `path` through `sink`; their sha256 (hex). The size was read when the headers were made:
    a file that changed since is an error, never a tar whose header lies."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        left = size
        while left:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                raise OSError(f"{path} shrank while it was being packed")
            digest.update(chunk)
            sink(chunk)
            left -= len(chunk)
            check()
        if fh.read(1):
            raise OSError(f"{path} grew while it was being packed")
    return digest.hexdigest()


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


def _write_component(archive: zipfile.ZipFile, name: str, stage: Path, rels: Sequence[str], options: Options,
                     prepare: Prepare, digests: Digests) -> None:
    infos = [_tarinfo(stage, rel, options.mtime) for rel in rels]
    compressor = _compressor(options.level, options.threads, tar_size(infos))
    with archive.open(_zip_entry(name, options.mtime), "w", force_zip64=True) as member:
        out: BinaryIO = member  # type: ignore[assignment]

        def sink(data: bytes) -> None:
            out.write(compressor.compress(data))

        write_tar(stage, infos, sink, options.check, prepare, digests)
        out.write(compressor.flush())


def is_info(rel: str) -> bool:
    return rel.split("/", 1)[0] == "info"


@dataclass(frozen=True)
class Options:
    level: int
    threads: int
    mtime: int  # the time every entry carries (seconds since the epoch)
    check: Check = lambda: None


def write_conda(stage: Path, dest: Path, pkg_files: Sequence[str], finish: Callable[[], Sequence[str]],
                options: Options, prepare: Prepare = lambda _name: None, digests: Digests | None = None) -> None:
    """Write `dest` (`<stem>.conda`): `pkg_files` (files and symbolic links relative to `stage`, none under
    info/) in the pkg component, then the info component of the files `finish()` returns (called once the pkg
    component is written: info/paths.json is written from the pkg files' `digests`, filled as they are packed)."""
    digests = {} if digests is None else digests
    stem = dest.name.removesuffix(".conda")
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(_zip_entry("metadata.json", options.mtime),
                         json.dumps({"conda_pkg_format_version": FORMAT_VERSION}))
        _write_component(archive, f"pkg-{stem}.tar.zst", stage, pkg_files, options, prepare, digests)
        _write_component(archive, f"info-{stem}.tar.zst", stage, finish(), options, prepare, digests)
