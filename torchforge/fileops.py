"""Writing outputs safely: atomic writes and moves, scratch folders a killed run cannot strand, and one
translation of file-system errors into messages that say what would work.

Every command writes under a folder the user names (`--out`, `--to file://`). Its temporary files live
there too, in `.torchforge-tmp-<purpose>-*` folders: same file system as the result (a final rename never
crosses devices), and the next run that touches the folder removes the ones no live process owns.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from torchforge.errors import FileSystemError, UsageError

SCRATCH_PREFIX = ".torchforge-tmp-"
_OWNER = ".owner"
# A "new-" scratch folder without its owner file yet is younger than this only while its creator is starting.
_UNOWNED_GRACE_S = 60.0


def check_dir(path: Path, role: str = "output folder") -> Path:
    """`path` must be a folder or not exist yet: a file or device there (`/dev/null`) is a clear error."""
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a folder"
        raise FileSystemError(f"{role} {path} is {kind}", "point it at a folder (a new one is created)")
    return path


def ensure_dir(path: Path, role: str = "output folder") -> Path:
    """`path` as an existing folder (created if missing); a file or device there is a clear error."""
    check_dir(path, role)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise translate(exc, role) from None
    return path


def _copy_any(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def move_into_place(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` atomically (replacing a file at `dst`). Across file systems (EXDEV: a mount
    point, a container volume) the data is first copied beside `dst`, then renamed there, so `dst` is still
    never seen half-written."""
    try:
        os.replace(src, dst)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    partial = dst.parent / f"{SCRATCH_PREFIX}move-{os.getpid()}-{dst.name}"
    _remove(partial)
    try:
        _copy_any(src, partial)
        os.replace(partial, dst)
    except BaseException:
        _remove(partial)
        raise
    _remove(src)


@contextmanager
def writing(target: Path) -> Iterator[None]:
    """Name `target` in an OSError that names no file: a write to an open file (a full disk: ENOSPC) knows only
    its descriptor, and the message must say which file could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc


def atomic_write(target: Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write `target` so readers see the old content or the new one, never a part."""
    ensure_dir(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f"{SCRATCH_PREFIX}write-", dir=target.parent)
    try:
        with writing(target), os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)  # mkstemp creates 0600; outputs are read by other users and servers
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def scratch(root: Path, purpose: str) -> Iterator[Path]:
    """A private folder `root/.torchforge-tmp-<purpose>-*`, removed on exit. While this process lives it
    holds a lock on the folder's owner file, which the kernel releases however the process ends (SIGKILL
    included): that is how `clean_stale` tells a killed run's leftovers from a live run's work."""
    ensure_dir(root)
    with deferred_interrupt():  # a Ctrl-C between creating the folder and locking it would strand it
        # Made and locked under a "new-" name, then renamed (the lock stays with the open file): a folder named
        # for its purpose is owned from the moment it exists. A run killed before the rename leaves a "new-"
        # folder, which a later run removes like any other scratch folder nobody owns.
        unborn = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}new-", dir=root))
        fd = os.open(unborn / _OWNER, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = unborn.with_name(f"{SCRATCH_PREFIX}{purpose}-{unborn.name.removeprefix(f'{SCRATCH_PREFIX}new-')}")
        os.rename(unborn, folder)
    try:
        yield folder
    finally:
        with deferred_interrupt():  # a Ctrl-C during the cleanup waits until the folder is gone
            shutil.rmtree(folder, ignore_errors=True)
            os.close(fd)


def private_root() -> Path:
    """This user's folder for scratch work with no output folder to hold it (auditing a package, a channel
    check, an upload client's config): `$TMPDIR/torchforge-<uid>`, readable by its owner alone."""
    root = Path(tempfile.gettempdir()) / f"torchforge-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise translate(exc, "temporary folder") from exc
    if root.is_symlink() or root.stat().st_uid != os.getuid():
        raise FileSystemError(f"{root} is not a folder of yours", "set TMPDIR to a folder you own")
    return root


@contextmanager
def private_scratch(purpose: str) -> Iterator[Path]:
    """`scratch` in `private_root()`, after removing what killed runs left there: an interrupted audit or upload
    leaves nothing in /tmp for long, and its rerun converges."""
    root = private_root()
    clean_stale(root)
    with scratch(root, purpose) as folder:
        yield folder


@contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold back SIGINT (Ctrl-C) for the duration of a short step that must finish, then deliver it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals and may change their handlers
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt here


def _owned(folder: Path) -> bool:
    try:
        fd = os.open(folder / _OWNER, os.O_RDWR)
    except FileNotFoundError:
        # A folder named for its purpose was locked before it got that name: without its owner file it is one
        # whose removal was cut short (rmtree took the owner file, then a SIGKILL came). Only a "new-" folder
        # may be a live creator's, between mkdtemp and the owner file.
        if not folder.name.startswith(f"{SCRATCH_PREFIX}new-"):
            return False
        try:
            return time.time() - folder.stat().st_mtime < _UNOWNED_GRACE_S
        except FileNotFoundError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


def clean_stale(root: Path) -> list[Path]:
    """Remove what killed runs left in `root`: scratch folders no live process owns, and the partial files of
    interrupted atomic writes. Returns what was removed."""
    if not root.is_dir():
        return []
    removed: list[Path] = []
    for entry in root.iterdir():
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        if entry.is_dir() and not entry.is_symlink():
            if _owned(entry):
                continue
        elif time.time() - entry.lstat().st_mtime < _UNOWNED_GRACE_S:
            continue  # a partial file of a write that may still be running (they have no owner lock)
        _remove(entry)
        removed.append(entry)
    return removed


_HINTS: dict[int, str] = {
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "you may not write there: choose a folder you own, or fix its permissions",
    errno.EPERM: "you may not change that: choose a folder you own, or fix its permissions",
    errno.ENOSPC: "the disk is full: free space or choose a folder on another disk",
    errno.EDQUOT: "your disk quota is used up: free space or choose a folder on another disk",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EEXIST: "something is already there: remove it or choose another path",
    errno.EISDIR: "a folder is there where a file is expected: choose another path",
    errno.ENOENT: "check the path (a folder on the way may be missing)",
    errno.ENAMETOOLONG: "choose a shorter path",
    errno.EXDEV: "source and target are on different file systems: choose a target on the same one",
}


def translate(exc: OSError, role: str | None = None) -> FileSystemError:
    """A FileSystemError for an OSError: which path, what the system said, and what would work."""
    where = exc.filename if exc.filename is not None else role or "a file"
    extra = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    what = exc.strerror or type(exc).__name__
    prefix = f"{role}: " if role and exc.filename is not None else ""
    return FileSystemError(f"{prefix}cannot use {where}{extra}: {what}",
                           _HINTS.get(exc.errno or 0, "check the path and its permissions"))


def sha256_file(path: Path) -> str:
    """The sha256 of a file's content, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def path_of_file_url(url: str) -> Path | None:
    """The local path a `file://` URL names, percent-decoded as conda and py-rattler read it
    (`file:///srv/my%20channel` is `/srv/my channel`); None when it names no absolute path on this machine."""
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        return None
    return Path(unquote(parts.path))


def read_utf8(path: Path) -> str:
    """The text of a file the user wrote (a TOML config): one that is not UTF-8 is bad input, named with the
    first byte that is not, rather than a decoding error. OSError passes to the caller."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"{path} is not UTF-8 text: byte {exc.start} (line {line}) is 0x{data[exc.start]:02x}",
                         "save it as UTF-8 (TOML files are UTF-8), e.g. `iconv -f latin1 -t utf-8`") from None


def write_folders(folders: dict[str, dict[str, str | bytes]], out: Path, *, force: bool = False) -> list[Path]:
    """Write every folder under `out`, all or nothing: render into a temporary folder, then move into place."""
    out = out.resolve()
    existing = [name for name in folders if (out / name).exists()]
    if existing and not force:
        raise UsageError(
            f"{len(existing)} recipe folder(s) already exist in {out}: {', '.join(existing[:3])}"
            + (" ..." if len(existing) > 3 else ""),
            "pass --force to replace them, or choose another --out",
        )
    # Staged inside `out` itself: the final renames never cross file systems (`out` may be a mount point),
    # and a killed run's staging is removed by the next one.
    ensure_dir(out, "--out")
    clean_stale(out)
    with scratch(out, "render") as staging:
        for name, files in folders.items():
            folder = staging / name
            folder.mkdir()
            for filename, content in files.items():
                target = folder / filename
                target.parent.mkdir(parents=True, exist_ok=True)  # a recipe's subfolder (a test's project)
                with writing(out / name / filename):  # the file the user asked for, not its staged copy
                    if isinstance(content, bytes):
                        target.write_bytes(content)
                    else:
                        target.write_text(content, encoding="utf-8")
                if filename.endswith((".sh", ".py")):
                    target.chmod(0o755)
        written = []
        for name in folders:
            final = out / name
            if final.exists():
                trash = staging / f".old-{name}"
                os.replace(final, trash)
            os.replace(staging / name, final)
            written.append(final)
        return written
