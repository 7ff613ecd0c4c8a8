"""torchforge.fatbin reads the device code of libraries the real nvcc 13.0 builds here: each entry's kind, arch,
arch-specific flag and compression, in whichever section it lies, checked against the -gencode each library was
built with and against the real cuobjdump's listing (where cuobjdump can read the library at all)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.nvcc_libraries import LIBRARIES, MOVED, gencode_code, nvcc_libraries  # noqa: F401 (fixture)
from tests.test_build import cuobjdump
from torchforge import fatbin

_LISTED = re.compile(r"\.(sm_\d+[af]?)\.(cubin|ptx)\s*$")


def cuobjdump_listing(library: Path) -> tuple[set[str], set[str]]:
    found: dict[str, set[str]] = {"cubin": set(), "ptx": set()}
    for flag in ("--list-elf", "--list-ptx"):
        listing = subprocess.run([cuobjdump(), flag, str(library)], capture_output=True, text=True).stdout
        for line in listing.splitlines():
            if listed := _LISTED.search(line):
                found[listed.group(2)].add(listed.group(1))
    return found["cubin"], found["ptx"]


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_each_library_holds_what_nvcc_was_asked_for_as_cuobjdump_lists_it(name: str, nvcc_libraries: Path) -> None:
    library = nvcc_libraries / f"lib{name}.so"
    code = fatbin.read(library)
    assert code.listable and not code.unreadable, code.summary()
    assert (code.sass, code.ptx) == cuobjdump_listing(library)
    sass, ptx = gencode_code(LIBRARIES[name])
    assert sass <= code.sass and ptx <= code.ptx, code.summary()
    if name != "arch90a":  # -arch=sm_90a also embeds compute_90 PTX (cuobjdump lists it too)
        assert (code.sass, code.ptx) == (sass, ptx), code.summary()
    assert {entry.section for entry, _ in code.entries} == {".nv_fatbin"}


def test_an_arch_specific_build_is_flagged_as_sm_90a(nvcc_libraries: Path) -> None:
    code = fatbin.read(nvcc_libraries / "libarch90a.so")
    assert code.sass == {"sm_90a"} and "sm_90" not in code.sass


def test_compression_is_read_from_each_entry(nvcc_libraries: Path) -> None:
    """-compress-all compresses every entry, -compress=false none; the section sizes (read by objdump) agree."""
    compressed = fatbin.read(nvcc_libraries / "libseveral_compressed.so")
    plain = fatbin.read(nvcc_libraries / "libseveral_plain.so")
    assert all(entry.compressed for entry, _ in compressed.entries)
    assert not any(entry.compressed for entry, _ in plain.entries)
    assert sum(n for _, n in compressed.entries) == sum(n for _, n in plain.entries) == 7
    assert section_size(nvcc_libraries / "libseveral_compressed.so") < section_size(nvcc_libraries / "libseveral_plain.so")


def section_size(library: Path, name: str = ".nv_fatbin") -> int:
    headers = subprocess.run(["objdump", "-h", str(library)], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[2], 16) for line in headers.splitlines() if line.split()[1:2] == [name])


def test_a_fatbin_outside_nv_fatbin_is_read_where_cuobjdump_sees_nothing(nvcc_libraries: Path) -> None:
    moved = nvcc_libraries / f"lib{MOVED}.so"
    assert section_size(moved, ".ldata") == section_size(nvcc_libraries / "libsass90.so")
    assert cuobjdump_listing(moved) == (set(), set())  # the blind spot the CUDA 13 libcufft falls into
    code = fatbin.read(moved)
    assert (code.sass, code.ptx) == ({"sm_90"}, set()) and code.count("cubin", "sm_90") == 2
    assert {entry.section for entry, _ in code.entries} == {".ldata"}


def test_a_truncated_fatbin_is_not_listable_and_reading_it_does_not_fail(nvcc_libraries: Path, tmp_path: Path) -> None:
    library = nvcc_libraries / "libseveral_plain.so"
    data = library.read_bytes()
    cut = tmp_path / "libcut.so"
    cut.write_bytes(data[: data.index(fatbin.MAGIC) + 200])  # the first container's first entry, cut
    code = fatbin.read(cut)
    assert code.present and not code.listable and not code.entries
    assert "past the end of the file" in code.unreadable[0], code.unreadable


def test_the_magic_by_chance_is_no_container_and_a_plain_library_has_no_device_code(tmp_path: Path) -> None:
    host = tmp_path / "host.c"
    host.write_text("unsigned magic(void) { return 0xBA55ED50u; }\n")  # the magic's bytes in host code
    subprocess.run(["gcc", "-shared", "-fPIC", str(host), "-o", str(tmp_path / "libhost.so")], check=True)
    assert fatbin.MAGIC in (tmp_path / "libhost.so").read_bytes()
    code = fatbin.read(tmp_path / "libhost.so")
    assert not code.present and not code.unreadable and code.summary() == "no entries"
    assert fatbin.read(tmp_path / "missing.so").unreadable  # cannot be opened: said, not raised


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_lto_ir_is_its_own_kind(tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float *x) { x[0] = 1; }\n")
    subprocess.run(["nvcc", "-c", "-rdc=true", "-gencode", "arch=compute_90,code=lto_90", str(source), "-o",
                    str(tmp_path / "k.o")], check=True, capture_output=True)
    code = fatbin.read(tmp_path / "k.o")
    assert {(entry.kind, entry.arch) for entry, _ in code.entries} == {("LTO-IR", "sm_90")}
    assert code.sass == code.ptx == set()
