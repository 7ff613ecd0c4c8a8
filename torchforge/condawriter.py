"""Writing a `.conda` archive (format v2) from a staged package folder, the same bytes on any machine.

The format: a stored (uncompressed) zip holding `metadata.json`, then `pkg-<stem>.tar.zst` (every file outside
info/) and `info-<stem>.tar.zst`. Each tar is one zstd stream. Three things make the bytes reproducible:
- every zstd stream uses zstd's multi-threaded mode, even with one thread: its output depends on the level
  and the input alone, never on the number of workers (nb_workers=0, the single-threaded mode, cuts blocks
  differently, so it is never used);
- tar and zip entries carry one given time (the wheel's) with uid/gid 0 and no user names, in the order given;
- the tar's size is computed from its headers and pledged to zstd, so readers see the content size in the
  frame header; nothing is read twice to find it.
Each file's sha256 is taken from the bytes as they are packed (FileDigests): the thread that hands them to zstd
passes each chunk on to one hashing thread, so no file is read twice and the stream never waits for a digest
(on 16 cores a pool of hashing threads re-reading the files, contending for the GIL with the feeding thread,
made one package's stream three times slower; hashing in the feeding thread itself made it twice slower). The info component is asked for (`finish`) only once the pkg component
is written, and a `prepare` hook runs before each file is read: the caller writes the wheel's RECORD (packed
last) and then info/paths.json from the digests of the files packed before.
All of a stack's builds are threads of one process, so the feeding thread shares the GIL with the others' Python
work, and each release (a read, a compress call, a write) can cost a switch interval before it is back: beside one
thread running Python, one call per file and a few per MiB made the torch CPU package's stream (12,000 files) 40x
slower (88 s against 2.2 s at level 1 on 2 cores). So the feeding thread makes few calls that release it: a
small file is read with one `os.read`, the tar's bytes go to zstd in pieces of CHUNK (small files batched), and
the chunks go to the hashing thread in batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import stat
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python >= 3.14
except ImportError:
    from backports import zstd  # type: ignore[no-redef,import-untyped,unused-ignore]

FORMAT_VERSION = 2
CHUNK = 2 << 20  # what is read from a file and handed to zstd at once: few calls that release the GIL
Check = Callable[[], None]  # raises to stop a long write (a cancelled repack); called once per chunk
Prepare = Callable[[str], None]
Digests = dict[str, tuple[str, int]]  # sha256 (hex) and size of each packed file, by its path in the package
HASH_QUEUE = 8  # batches (about CHUNK each) handed to the hashing thread and not yet hashed: about 16 MiB held


class FileDigests:
    """sha256 and size of each packed file, from the chunks the feeding thread hands over (`add`), hashed by one
    thread of their own while the stream goes on; `result()` waits for what was handed over so far. Chunks go
    over in batches of about CHUNK bytes: one queue hand-over (and one wake-up of the hashing thread, both
    taking the GIL) per batch, not per small file."""

    def __init__(self) -> None:
        self._queue: queue.Queue[list[tuple[str, bytes, bool]] | None] = queue.Queue(HASH_QUEUE)
        self._batch: list[tuple[str, bytes, bool]] = []
        self._batched = 0
        self._done: Digests = {}
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def add(self, name: str, chunk: bytes, last: bool) -> None:
        self._batch.append((name, chunk, last))
        self._batched += len(chunk)
        if self._batched >= CHUNK:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._batch:
            self._queue.put(self._batch)
            self._batch, self._batched = [], 0

    def result(self) -> Digests:
        """Called by the feeding thread (the one that adds): what it added so far, hashed."""
        self._hand_over()
        self._queue.join()
        if self._failure is not None:
            raise self._failure
        return dict(self._done)

    def _run(self) -> None:
        digest, size = hashlib.sha256(), 0
        while (batch := self._queue.get()) is not None:
            try:
                for name, chunk, last in batch:
                    digest.update(chunk)
                    size += len(chunk)
                    if last:
                        self._done[name] = (digest.hexdigest(), size)
                        digest, size = hashlib.sha256(), 0
            except BaseException as exc:  # handed to the feeding thread by result()
                self._failure = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    @contextmanager
    def running(self) -> Iterator[FileDigests]:
        self._thread = threading.Thread(target=self._run, name="condawriter-sha256", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._hand_over()
            self._queue.put(None)  # the thread hashes what it was given, then ends
            self._thread.join()


class _Batched:
    """The tar's bytes handed to `sink` in pieces of at least CHUNK (the last one excepted): a small file's
    header, data and padding join the next file's instead of costing a compress call (and a GIL release) each."""

    def __init__(self, sink: Callable[[bytes], object]) -> None:
        self._sink = sink
        self._pending = bytearray()

    def __call__(self, data: bytes) -> None:
        if len(data) >= CHUNK and not self._pending:
            self._sink(data)
            return
        self._pending += data
        if len(self._pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._sink(self._pending)  # zstd copies it in
            self._pending = bytearray()


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
              prepare: Prepare, digests: FileDigests) -> None:
    """An uncompressed tar of `infos` (files under `stage`) written through `sink`. `prepare(name)` runs before
    a file is read (the package's RECORD, packed last, is filled in then); each file's bytes go to `digests`."""
    written = 0
    for info in infos:
        header = _header(info)
        sink(header)
        written += len(header)
        if info.isreg():
            prepare(info.name)
            _stream(stage / info.name, info.size, sink, check, lambda chunk, last, name=info.name: digests.add(
                name, chunk, last))
            sink(b"\0" * _padding(info.size))
            written += info.size + _padding(info.size)
    end = 2 * tarfile.BLOCKSIZE
    end += -(written + end) % tarfile.RECORDSIZE
    sink(b"\0" * end)


def _stream(path: Path, size: int, sink: Callable[[bytes], object], check: Check,
            hand_over: Callable[[bytes, bool], None]) -> None:
    """`size` bytes of `path` through `sink`, each chunk also handed over (with whether it is the file's last).
    The size was read when the headers were made: a file that changed since is an error, never a tar whose
    header lies. Plain os calls: open, one read per CHUNK (the last asks for one byte more, to see whether the
    file grew) and close, the fewest that release the GIL."""
    fd = os.open(path, os.O_RDONLY)
    try:
        left = size
        while True:
            want = left + 1 if left < CHUNK else CHUNK  # one byte past the end: a read short of `want` is EOF
            chunk = os.read(fd, want)
            if len(chunk) > left:
                raise OSError(f"{path} grew while it was being packed")
            if len(chunk) < min(want, left):
                raise OSError(f"{path} shrank while it was being packed")
            left -= len(chunk)
            if chunk or not size:
                sink(chunk)
                hand_over(chunk, not left)
                check()
            if len(chunk) < want:
                return
    finally:
        os.close(fd)


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
                     prepare: Prepare, digests: FileDigests) -> None:
    infos = [_tarinfo(stage, rel, options.mtime) for rel in rels]
    compressor = _compressor(options.level, options.threads, tar_size(infos))
    with archive.open(_zip_entry(name, options.mtime), "w", force_zip64=True) as member:
        out: BinaryIO = member  # type: ignore[assignment]

        def compress(data: bytes) -> None:
            if packed := compressor.compress(data):  # zstd's workers mostly hold it back: no empty write
                out.write(packed)

        sink = _Batched(compress)
        write_tar(stage, infos, sink, options.check, prepare, digests)
        sink.flush()
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
                options: Options, prepare: Prepare = lambda _name: None, digests: FileDigests | None = None) -> None:
    """Write `dest` (`<stem>.conda`): `pkg_files` (files and symbolic links relative to `stage`, none under
    info/) in the pkg component, then the info component of the files `finish()` returns (called once the pkg
    component is written: info/paths.json is written from the pkg files' `digests`, taken as they are packed)."""
    stem = dest.name.removesuffix(".conda")
    with (digests or FileDigests()).running() as hashed, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(_zip_entry("metadata.json", options.mtime),
                         json.dumps({"conda_pkg_format_version": FORMAT_VERSION}))
        _write_component(archive, f"pkg-{stem}.tar.zst", stage, pkg_files, options, prepare, hashed)
        _write_component(archive, f"info-{stem}.tar.zst", stage, finish(), options, prepare, hashed)
