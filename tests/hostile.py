"""Hostile archives for the extraction-rule tests (no tests here): real wheels, .conda and .tar.bz2 packages and
source tarballs, built by a good builder and then given members that would land outside the folder they are
unpacked into (an absolute path, `../`, an escaping symlink or hardlink, a file written through such a link, a
device or a fifo)."""

from __future__ import annotations

import bz2
import io
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.pkgfactory import make_package
from tests.test_wheel_repair import build_hello_wheel

CLIMB = "../" * 40  # more than any folder is deep: `..` stops at /, so this reaches the absolute path after it


@dataclass(frozen=True)
class Member:
    name: str
    kind: str = "file"  # file, symlink, hardlink, chr, fifo
    target: str = ""  # of a link
    data: bytes = b"written by a hostile archive\n"


@dataclass(frozen=True)
class Case:
    """A hostile member set: `members` to add, `refused` the member the message names, `why` its words."""

    id: str
    members: tuple[Member, ...]
    refused: str
    why: str


def cases(victim: Path, outside: Path) -> list[Case]:
    """Every kind of escape: `victim` is an existing file an escape would overwrite, `outside` a folder where a
    new file would appear."""
    return [
        Case("absolute", (Member(str(victim)),), str(victim), "is an absolute path"),
        Case("dotdot", (Member(CLIMB + str(outside / "escaped")[1:]),), CLIMB + str(outside / "escaped")[1:],
             "climbs out of its folder with '..'"),
        Case("symlink", (Member("share/evil", "symlink", str(outside)), Member("share/evil/escaped")),
             "share/evil", f"is a symbolic link to '{outside}', outside its folder"),
        Case("relative-symlink", (Member("share/evil", "symlink", CLIMB + str(outside)[1:]),),
             "share/evil", "is a symbolic link to"),
        Case("link-chain", (Member("share/a/up", "symlink", ".."), Member("share/a/up/up2", "symlink", "../.."),),
             "share/a/up/up2", "is a symbolic link to '../..', outside its folder"),
        Case("hardlink", (Member("share/hard", "hardlink", str(victim)),), "share/hard",
             f"is a hardlink to '{victim}', outside its folder"),
        Case("device", (Member("share/dev0", "chr"),), "share/dev0", "is a character device"),
        Case("fifo", (Member("share/pipe", "fifo"),), "share/pipe", "is a fifo"),
    ]


def _tar_info(member: Member) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(member.name)
    info.mode = 0o644
    if member.kind == "file":
        info.size = len(member.data)
        return info, member.data
    info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE,
                 "fifo": tarfile.FIFOTYPE}[member.kind]
    info.linkname = member.target
    info.devmajor, info.devminor = (1, 3) if member.kind == "chr" else (0, 0)  # 1,3: /dev/null's numbers
    return info, None


def _append(tar_bytes: bytes, members: tuple[Member, ...]) -> bytes:
    """An uncompressed tar: the members of `tar_bytes`, then `members`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as src, tarfile.open(fileobj=out, mode="w",
                                                                          format=tarfile.PAX_FORMAT) as dst:
        for info in src.getmembers():
            dst.addfile(info, src.extractfile(info) if info.isfile() else None)
        for member in members:
            info, data = _tar_info(member)
            dst.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def hostile_package(out_dir: Path, members: tuple[Member, ...], fmt: str = ".conda", name: str = "hello") -> Path:
    """A real package from tests.pkgfactory (index.json, paths.json, a payload) with `members` added to its
    payload stream (the .conda's pkg tarball, or the .tar.bz2)."""
    from backports import zstd

    package = make_package(out_dir, name=name, fmt=fmt)
    if fmt == ".tar.bz2":
        package.write_bytes(bz2.compress(_append(bz2.decompress(package.read_bytes()), members)))
        return package
    with zipfile.ZipFile(package) as zf:
        parts = {info.filename: zf.read(info) for info in zf.infolist()}
    payload = next(n for n in parts if n.startswith("pkg-"))
    parts[payload] = zstd.compress(_append(zstd.decompress(parts[payload]), members))
    with zipfile.ZipFile(package, "w", zipfile.ZIP_STORED) as zf:
        for filename, data in parts.items():
            zf.writestr(filename, data)
    return package


def hostile_wheel(out_dir: Path, members: tuple[Member, ...]) -> Path:
    """The smallest wheel `repack` takes (a torch-named CPython wheel with a C extension built by gcc), with
    `members` added: files as zip entries under their raw names, symlinks as zip symlink entries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = build_hello_wheel(out_dir, name="torch")
    with zipfile.ZipFile(wheel, "a") as zf:
        for member in members:
            info = zipfile.ZipInfo(member.name)
            info.create_system = 3
            kind = {"file": stat.S_IFREG, "symlink": stat.S_IFLNK, "chr": stat.S_IFCHR, "fifo": stat.S_IFIFO}
            info.external_attr = (kind[member.kind] | 0o644) << 16
            zf.writestr(info, member.target.encode() if member.kind == "symlink" else member.data)
    return wheel


def hostile_tarball(path: Path, top: str, files: dict[str, bytes], members: tuple[Member, ...]) -> Path:
    """A .tar.gz with `files` under `top/`, then `members` (source and MAGMA tarballs are gzipped tars)."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for member in members:
            info, data = _tar_info(member)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path
