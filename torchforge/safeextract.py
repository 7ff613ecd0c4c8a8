"""The one rule for what an archive may hold, applied by every reader (wheels, .conda and .tar.bz2 packages,
source and MAGMA tarballs) before a member is written: every member lands inside the folder it is unpacked into.

Refused, as an ArchiveError (exit 2) naming the archive and the member: an absolute path, a `..` component, a
symlink or hardlink whose target leaves the folder (directly or through another link of the same archive), and
device, fifo or socket entries. Links are followed the way extraction would follow them, so a member written
through an earlier link of the archive is judged where it would really land.
"""

from __future__ import annotations

import re
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from torchforge.errors import ArchiveError

_DRIVE = re.compile(r"^[A-Za-z]:")
# More link hops than this while resolving one path is a loop (Linux's own limit is 40).
MAX_LINK_HOPS = 40
HINT = ("an archive may hold only files, folders and links inside the folder it is unpacked into: "
        "do not use this one; rebuild it, or download it again from a source you trust")
_SPECIAL = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a fifo",
            stat.S_IFSOCK: "a socket"}


class MemberRule:
    """The rule for one archive. It remembers the archive's symlinks (member path -> target) to resolve later
    members through them, across every stream of the archive (a .conda's info and pkg tarballs share a folder)."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self._links: dict[str, str] = {}

    def refuse(self, member: str, why: str) -> ArchiveError:
        return ArchiveError(f"{self.archive}: member {member!r} {why}", HINT)

    def check_name(self, name: str) -> list[str]:
        """The member's path components; an absolute path or a `..` component is refused."""
        if name.startswith(("/", "\\")) or _DRIVE.match(name):  # a Windows drive counts: packages install there too
            raise self.refuse(name, "is an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self.refuse(name, "climbs out of its folder with '..'")
        return parts

    def _lands_inside(self, parts: list[str], follow_last: bool) -> bool:
        """Whether `parts` (from the folder's root) stays inside it with the archive's links followed."""
        resolved: list[str] = []
        todo = list(reversed(parts))
        hops = 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not resolved:
                    return False
                resolved.pop()
                continue
            resolved.append(part)
            target = self._links.get("/".join(resolved))
            if target is not None and (todo or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS or target.startswith("/"):
                    return False
                resolved.pop()
                todo.extend(reversed(target.split("/")))
        return True

    def _check_link(self, name: str, parts: list[str], target: str, hard: bool) -> None:
        if not self._lands_inside(parts, follow_last=False):
            raise self.refuse(name, "is written through a link that leaves its folder")
        # A symlink's target is relative to the link's own folder; a hardlink's to the archive's root.
        base = [] if hard else parts[:-1]
        if target.startswith("/") or not self._lands_inside(base + target.split("/"), follow_last=True):
            raise self.refuse(name, f"is a {'hard' if hard else 'symbolic '}link to {target!r}, outside its folder")
        if not hard:
            self._links["/".join(parts)] = target

    def check_entry(self, name: str, mode: int, link_target: str | None = None, hard: bool = False) -> None:
        """Check one member: its path, its kind (`mode`'s file-type bits, 0 when unknown) and its link target."""
        parts = self.check_name(name)
        kind = _SPECIAL.get(stat.S_IFMT(mode))
        if kind is not None:
            raise self.refuse(name, f"is {kind}")
        if link_target is not None:
            self._check_link(name, parts, link_target, hard)
        elif not self._lands_inside(parts, follow_last=True):
            raise self.refuse(name, "is written through a link that leaves its folder")

    def check_tar_member(self, member: tarfile.TarInfo) -> None:
        if member.ischr() or member.isblk() or member.isfifo():
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK if member.isblk() else stat.S_IFIFO
            self.check_entry(member.name, kind)
        elif member.issym() or member.islnk():
            self.check_entry(member.name, 0, member.linkname, hard=member.islnk())
        else:
            self.check_entry(member.name, 0)

    def finish(self) -> None:
        """Every link again, with the archive's final links: a later link may have changed where one leads."""
        for name, target in list(self._links.items()):
            parts = name.split("/")
            if target.startswith("/") or not self._lands_inside(parts[:-1] + target.split("/"), follow_last=True):
                raise self.refuse(name, f"is a symbolic link to {target!r}, outside its folder")

    def checked(self, tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
        """The members of `tar` in order, each checked before the caller gets it (to extract or read)."""
        for member in tar:
            self.check_tar_member(member)
            yield member


def check_zip(archive: Path, zf: zipfile.ZipFile) -> None:
    """Check every member of an open zip (a wheel) before anything is written. A zip symlink's target is its
    content; wheel readers write it as a plain file, but one that would leave the folder is refused all the same."""
    rule = MemberRule(archive)
    for info in zf.infolist():
        mode = info.external_attr >> 16 if info.create_system == 3 else 0  # 3: Unix, the only system with modes
        if stat.S_ISLNK(mode):
            rule.check_entry(info.filename, 0, zf.read(info).decode("utf-8", errors="replace"))
        else:
            rule.check_entry(info.filename, mode)
    rule.finish()


def tar_members(archive: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Every member of a (compressed) tarball, each checked, for readers that look inside without unpacking
    (a source or MAGMA tarball handed to a build engine that unpacks it later)."""
    rule = MemberRule(archive)
    with tarfile.open(archive, mode="r|*") as tar:
        for member in rule.checked(tar):
            yield tar, member
    rule.finish()


def is_archive(path: Path) -> bool:
    """Whether `path` starts like a zip or a tarball this rule can read (a damaged one still counts)."""
    try:
        return zipfile.is_zipfile(path) or tarfile.is_tarfile(path)
    except OSError:
        return False


def check_archive(archive: Path) -> None:
    """Judge a whole local source archive (a zip or a compressed tarball) that a build engine unpacks later."""
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                check_zip(archive, zf)
            return
        for _tar, _member in tar_members(archive):
            pass
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise ArchiveError.unreadable(archive, exc) from exc


def extract_conda(archive: Path, dest: Path) -> None:
    """Unpack a .conda or .tar.bz2 into `dest`, each member checked before it is written. On a refusal, what
    was written is inside `dest`: callers unpack into a scratch folder they remove."""
    from conda_package_streaming import package_streaming as streaming

    rule = MemberRule(archive)
    components = ([streaming.CondaComponent.pkg, streaming.CondaComponent.info] if archive.name.endswith(".conda")
                  else [streaming.CondaComponent.pkg])  # a .tar.bz2 is one stream
    dest.mkdir(parents=True, exist_ok=True)
    with archive.open("rb") as fh:
        for component in components:
            stream = streaming.stream_conda_component(str(archive), fh, component=component)
            _extract_stream(stream, dest, rule.checked)
    rule.finish()


def _extract_stream(stream: Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]], dest: Path,
                    checked: Callable[[tarfile.TarFile], Iterator[tarfile.TarInfo]]) -> None:
    for tar, _first in stream:
        # Iterating the tar again starts from its first member (already read); the stream must not seek back.
        # "fully_trusted": the rule above has judged every member; keep modes as the package has them. Pythons
        # before 3.11.4 (Debian 12's 3.11.2, found by `make ci-local`) have no filters: that is how they extract.
        trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        tar.extractall(dest, members=checked(tar), **trusted)
        stream.close()  # type: ignore[attr-defined]
        return
