"""Reading ELF files in-process with pyelftools: DT_NEEDED, DT_RPATH/DT_RUNPATH, SONAME, GLIBC versions.

Nothing here executes a binary or starts a subprocess: reading is pure Python (pyelftools reads the 12
torch shared objects in 0.18 s, tooling.md §3), writing lives in torchforge/rpath/__init__.py and goes through
patchelf via the Runner.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.common.utils import struct_parse
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from elftools.elf.structs import ELFStructs

ELF_MAGIC = b"\x7fELF"
_GLIBC_VERSION = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.\d+)?$")


@dataclass(frozen=True)
class ElfInfo:
    """What the dynamic loader will look at in one ELF file."""

    path: Path
    needed: tuple[str, ...]
    rpath: tuple[str, ...]  # DT_RPATH entries, in order
    runpath: tuple[str, ...]  # DT_RUNPATH entries, in order
    soname: str | None
    # Highest GLIBC_x.y symbol version the file requires (None: no glibc versioned symbols or not read).
    glibc: tuple[int, int] | None = None
    # Every PT_LOAD has p_offset ≡ p_vaddr (mod p_align). patchelf 0.18.0 broke this ("ELF load command
    # address/offset not properly aligned", NixOS/patchelf#492, conda-build#4881); we re-check after patching.
    loads_aligned: bool = True

    @property
    def search_path(self) -> tuple[str, ...]:
        # The loader ignores DT_RPATH when DT_RUNPATH is present.
        return self.runpath if self.runpath else self.rpath


def is_elf(path: Path) -> bool:
    """True for a regular file that starts with the ELF magic (symlinks are not followed)."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with path.open("rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def _split(value: str) -> tuple[str, ...]:
    return tuple(part for part in value.split(":") if part)


@lru_cache(maxsize=None)
def _structs(little_endian: bool, elfclass: int, e_type: str, e_machine: str, osabi: str) -> ELFStructs:
    # Building pyelftools' construct structs costs ~3 ms, more than reading a file's dynamic section;
    # ELFFile builds them per file, so the audit of 136 torch ELF files spends most of its time there.
    # They depend only on these header fields, so they are built once per kind and reused.
    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    structs.create_advanced_structs(e_type, e_machine, osabi)
    return structs


def _read_cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "surrogateescape")


def _read_dynamic(fh: BinaryIO) -> tuple[list[tuple[str, int]], bytes, bool] | None:
    """The dynamic entries (tag, value), the dynamic string table and whether PT_LOADs are aligned."""
    ident = fh.read(16)
    if len(ident) < 16 or ident[:4] != ELF_MAGIC or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ValueError("not a valid ELF identification")
    little, elfclass = ident[5] == 1, 32 if ident[4] == 1 else 64
    probe = _structs(little, elfclass, "ET_NONE", "EM_NONE", "ELFOSABI_SYSV")
    fh.seek(0)
    ehdr = struct_parse(probe.Elf_Ehdr, fh, 0)
    structs = _structs(little, elfclass, ehdr.e_type, ehdr.e_machine, ehdr.e_ident.EI_OSABI)
    dynamic = None
    loads = []
    for index in range(ehdr.e_phnum):
        phdr = struct_parse(structs.Elf_Phdr, fh, ehdr.e_phoff + index * ehdr.e_phentsize)
        if phdr.p_type == "PT_DYNAMIC":
            dynamic = phdr
        elif phdr.p_type == "PT_LOAD":
            loads.append(phdr)
    aligned = all(p.p_align <= 1 or (p.p_offset - p.p_vaddr) % p.p_align == 0 for p in loads)
    if dynamic is None:
        return None  # static executable, object file or core: nothing for the loader to resolve
    entry_size = structs.Elf_Dyn.sizeof()
    fh.seek(dynamic.p_offset)
    raw = fh.read(dynamic.p_filesz)
    entries: list[tuple[str, int]] = []
    for offset in range(0, len(raw) - entry_size + 1, entry_size):
        dyn = structs.Elf_Dyn.parse(raw[offset : offset + entry_size])
        if dyn.d_tag == "DT_NULL":
            break
        entries.append((dyn.d_tag, dyn.d_val))
    values = dict(entries)
    strtab_addr, strtab_size = values.get("DT_STRTAB"), values.get("DT_STRSZ", 0)
    if strtab_addr is None:
        return entries, b"", aligned
    # DT_STRTAB is a virtual address: map it to a file offset through the PT_LOAD segment holding it.
    for load in loads:
        if load.p_vaddr <= strtab_addr < load.p_vaddr + load.p_filesz:
            fh.seek(strtab_addr - load.p_vaddr + load.p_offset)
            return entries, fh.read(strtab_size), aligned
    raise ValueError("DT_STRTAB lies outside every PT_LOAD segment")


def _max_glibc(fh: BinaryIO) -> tuple[int, int] | None:
    fh.seek(0)
    highest: tuple[int, int] | None = None
    for section in ELFFile(fh).iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _verneed, aux_iter in section.iter_versions():
            for aux in aux_iter:
                match = _GLIBC_VERSION.match(aux.name)
                if match:
                    version = (int(match.group(1)), int(match.group(2)))
                    highest = version if highest is None else max(highest, version)
    return highest


def read_elf(path: Path, *, glibc: bool = False) -> ElfInfo | None:
    """Read the dynamic section of `path`; None when it is not an ELF file or has no dynamic section.

    `glibc=True` also walks .gnu.version_r for GLIBC_x.y requirements (used by wheel repair to pick the
    manylinux tag); the audit does not need it and skips it.
    """
    try:
        with path.open("rb") as fh:
            if fh.read(4) != ELF_MAGIC:
                return None
            fh.seek(0)
            dynamic = _read_dynamic(fh)
            if dynamic is None:
                return None
            entries, strings, aligned = dynamic
            needed: list[str] = []
            rpath: tuple[str, ...] = ()
            runpath: tuple[str, ...] = ()
            soname: str | None = None
            for tag, value in entries:
                if tag == "DT_NEEDED":
                    needed.append(_read_cstr(strings, value))
                elif tag == "DT_RPATH":
                    rpath = _split(_read_cstr(strings, value))
                elif tag == "DT_RUNPATH":
                    runpath = _split(_read_cstr(strings, value))
                elif tag == "DT_SONAME":
                    soname = _read_cstr(strings, value)
            highest = _max_glibc(fh) if glibc else None
            return ElfInfo(path, tuple(needed), rpath, runpath, soname, highest, aligned)
    except (ELFError, OSError, ValueError, ConstructError) as exc:
        # A truncated or garbled file (e.g. conda-build#4881-style damaged load commands) is reported by
        # the caller as unreadable; it is never silently treated as "not ELF".
        raise ElfReadError(path, str(exc)) from exc


class ElfReadError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# Source, text and data suffixes that are never ELF. The torch wheel has 12,248 files of which 136 are ELF;
# skipping these avoids opening ~12,000 headers (0.25 s) just to read their magic.
NOT_ELF_SUFFIXES = frozenset(
    ".h .hpp .hxx .cuh .c .cc .cpp .cu .py .pyi .pyc .pyx .pxd .cmake .txt .md .rst .json .yaml .yml .toml "
    ".jinja .j2 .html .css .js .mjs .typed .thrift .ld .cfg .ini .csv .in .sh .bat .ps1 .pt .ptl .ff".split()
)


def iter_tree(root: Path, symlinks: list[Path] | None = None) -> Iterator[Path]:
    """Every regular file under `root`, sorted, never following symlinks (to files or directories).

    Symlinks met on the way are appended to `symlinks` when given (the audit checks where they point).
    """
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            # DirEntry answers from d_type without a stat; follow_symlinks=False never leaves the tree.
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield Path(entry.path)
            elif symlinks is not None and entry.is_symlink():
                symlinks.append(Path(entry.path))
        stack.extend(reversed(subdirs))


def maybe_elf(path: Path) -> bool:
    return path.suffix.lower() not in NOT_ELF_SUFFIXES


def scan_tree(root: Path, *, glibc: bool = False, symlinks: list[Path] | None = None) -> list[ElfInfo]:
    """ElfInfo for every ELF file with a dynamic section under `root` (symlinks skipped).

    Raises ElfReadError for a file that starts with the ELF magic but cannot be parsed.
    """
    found: list[ElfInfo] = []
    for path in iter_tree(root, symlinks):
        if not maybe_elf(path):
            continue
        info = read_elf(path, glibc=glibc)
        if info is not None:
            found.append(info)
    return found
