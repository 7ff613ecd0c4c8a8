"""What CUDA device code a file really holds: every fatbin container anywhere in it, read in pure Python.

cuobjdump reads only the `.nv_fatbin` section; NVIDIA's own libraries also keep fatbins elsewhere (the CUDA 13
`libcufft.so.12` holds one sm_75 cubin in a 672-byte `.nv_fatbin` and ~24,000 entries in `.ldata`,
shared/reference/device.md), so a listing of that section alone is no verdict. This reader maps the file, scans it
for the container magic, parses each container's entry headers and skips their payloads (nothing is decompressed,
so a library of hundreds of MB costs one pass of `mmap.find`).

The layout (docs/repack.md "How device code is read" gives it with its sources): a 16-byte container header
`magic u32 = 0xBA55ED50, version u16 = 1, header size u16 = 16, size of the entries u64`, then entries, each
`kind u16, u16, header size u32, payload size u64, compressed size u32, u32, version minor u16, major u16,
arch u32, name offset u32, name length u32, flags u64, u64, uncompressed size u64`, its payload right after its
header. Kinds: 1 PTX, 2 cubin, 8 LTO-IR (nvcc `code=lto_90`); flags: 0x2000 or 0x8000 compressed, 0x100000 arch-
specific (`sm_90a`), 0x200000 family-specific (`sm_100f`) - checked against what nvcc 13.0 writes for each
`-gencode` (tests/test_fatbin.py).
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQI4xHHI8xQ")  # kind, _, header size, payload size, compressed size, minor, major, arch, flags
KINDS = {1: "PTX", 2: "cubin", 8: "LTO-IR"}
COMPRESSED = 0x2000 | 0x8000
ARCH_SPECIFIC, FAMILY_SPECIFIC = 0x100000, 0x200000
OUTSIDE = "(outside every section)"


@dataclass(frozen=True, order=True)
class EntryKind:
    """One kind of entry; a library holds many entries of each (one per object file that was compiled)."""

    kind: str  # PTX, cubin, LTO-IR, or "kind N" for one this reader does not know
    arch: str  # sm_90, sm_90a, sm_100f
    compressed: bool
    section: str  # the ELF section holding the container, or OUTSIDE


@dataclass(frozen=True)
class DeviceCode:
    """Every fatbin entry of one file, counted by kind, and what could not be read (information, not failure)."""

    entries: tuple[tuple[EntryKind, int], ...] = ()
    unreadable: tuple[str, ...] = ()  # why a container that starts like one could not be read
    containers: int = 0

    @property
    def present(self) -> bool:
        """Any fatbin at all, readable or not."""
        return bool(self.containers or self.unreadable)

    @property
    def listable(self) -> bool:
        return bool(self.entries) and not self.unreadable

    def archs(self, kind: str) -> set[str]:
        return {entry.arch for entry, _ in self.entries if entry.kind == kind}

    @property
    def sass(self) -> set[str]:
        return self.archs("cubin")

    @property
    def ptx(self) -> set[str]:
        return self.archs("PTX")

    def count(self, kind: str, arch: str) -> int:
        return sum(n for entry, n in self.entries if entry.kind == kind and entry.arch == arch)

    def summary(self) -> str:
        """`cubin sm_80 x2, sm_90 x2; PTX sm_90 x1 (compressed 3 of 5; sections .nv_fatbin)`."""
        by_kind: dict[str, Counter[str]] = {}
        compressed = total = 0
        for entry, n in self.entries:
            by_kind.setdefault(entry.kind, Counter())[entry.arch] += n
            total += n
            compressed += n if entry.compressed else 0
        parts = ["; ".join(f"{kind} " + ", ".join(f"{arch} x{n}" for arch, n in sorted(archs.items()))
                           for kind, archs in sorted(by_kind.items()))]
        sections = sorted({entry.section for entry, _ in self.entries})
        text = f"{parts[0]} ({compressed} of {total} compressed; in {', '.join(sections)})" if total else "no entries"
        return text + "".join(f"; not listable: {why}" for why in self.unreadable)


@dataclass
class _Scan:
    counts: Counter[EntryKind] = field(default_factory=Counter)
    unreadable: list[str] = field(default_factory=list)
    containers: int = 0


def read(path: Path) -> DeviceCode:
    """The device code of one file; a file that cannot be opened or mapped is not listable, never an error."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            if size < _CONTAINER.size:
                return DeviceCode()
            sections = _sections(handle)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                scan = _scan(data, sections)
    except (OSError, ValueError) as exc:
        return DeviceCode(unreadable=(f"{path.name} could not be read ({exc})",))
    return DeviceCode(tuple(sorted(scan.counts.items())), tuple(scan.unreadable), scan.containers)


def _sections(handle) -> list[tuple[int, int, str]]:  # type: ignore[no-untyped-def]
    """(file offset, size, name) of every ELF section with file contents; [] for a file that is not ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.construct import ConstructError
    from elftools.elf.elffile import ELFFile

    handle.seek(0)
    if handle.read(4) != b"\x7fELF":
        return []
    handle.seek(0)
    try:
        return [(s["sh_offset"], s["sh_size"], s.name) for s in ELFFile(handle).iter_sections()
                if s["sh_type"] != "SHT_NOBITS" and s["sh_size"]]
    except (ELFError, ConstructError, ValueError):
        return []


def _section_of(offset: int, sections: list[tuple[int, int, str]]) -> str:
    return next((name for start, size, name in sections if start <= offset < start + size), OUTSIDE)


def _scan(data: mmap.mmap, sections: list[tuple[int, int, str]]) -> _Scan:
    scan = _Scan()
    at = data.find(MAGIC)
    while at >= 0:
        magic, version, header, size = _CONTAINER.unpack_from(data, at) if at + 16 <= len(data) else (0, 0, 0, 0)
        if version != 1 or header != _CONTAINER.size:
            at = data.find(MAGIC, at + 1)  # the magic's bytes by chance (host code comparing with it): no container
            continue
        where = f"container at {at:#x} in {_section_of(at, sections)}"
        end = at + header + size
        if end > len(data):
            scan.unreadable.append(f"{where} claims {size} bytes past the end of the file")
            at = data.find(MAGIC, at + 1)
            continue
        problem = _read_entries(data, at + header, end, _section_of(at, sections), scan.counts)
        if problem:
            scan.unreadable.append(f"{where}: {problem}")
        scan.containers += 1
        at = data.find(MAGIC, max(end, at + 1))
    return scan


def _read_entries(data: mmap.mmap, start: int, end: int, section: str, counts: Counter[EntryKind]) -> str | None:
    """Count the entries between start and end; why they cannot be read, or None."""
    for offset, fields in _entries(data, start, end):
        if isinstance(fields, str):
            return f"entry at {offset:#x} {fields}"
        kind, _, _, _, _, _, _, arch, flags = fields
        suffix = "a" if flags & ARCH_SPECIFIC else "f" if flags & FAMILY_SPECIFIC else ""
        counts[EntryKind(KINDS.get(kind, f"kind {kind}"), f"sm_{arch}{suffix}", bool(flags & COMPRESSED),
                         section)] += 1
    return None


def _entries(data: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, tuple[int, ...] | str]]:
    offset = start
    while offset < end:
        if offset + _ENTRY.size > end:
            yield offset, "is cut off by the end of its container"
            return
        fields = _ENTRY.unpack_from(data, offset)
        header, payload = fields[2], fields[3]
        if header < _ENTRY.size or offset + header + payload > end:
            yield offset, f"has a header of {header} bytes and a payload of {payload} past its container"
            return
        yield offset, fields
        offset += header + payload
