"""Arch coverage of a package's CUDA device code: every ELF file that carries device code (a `.nv_fatbin`
section) must hold SASS for each arch of the requested list and PTX for the `+PTX` one, as `cuobjdump` lists
them. Upstream's own cu128 torchvision/torchaudio wheels once lacked sm_100/sm_120 and only cuobjdump showed it
(pytorch/test-infra#6273); the RPATH audit cannot see it.

cuobjdump comes from PATH or from NVIDIA's `nvidia-cuda-cuobjdump` wheel (torchforge's test extra), which puts it
in site-packages/nvidia/cuXY/bin.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from torchforge import fatbin
from torchforge.elf import iter_tree, maybe_elf
from torchforge.errors import AuditFailedError, UsageError

_COPY_CHUNK = 8 * 1024 * 1024
_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


@dataclass(frozen=True)
class Wanted:
    sass: frozenset[str]  # sm_90 ...
    ptx: frozenset[str]


@dataclass(frozen=True)
class Missing:
    file: str  # relative to the package root
    arch: str  # sm_100
    kind: str  # "SASS" or "PTX"

    def __str__(self) -> str:
        return f"{self.file}: no {self.kind} for {self.arch}"


def wanted(arch_list: str) -> Wanted:
    """`8.0;9.0+PTX` (TORCH_CUDA_ARCH_LIST's words) -> SASS for sm_80 and sm_90, PTX for sm_90."""
    sass, ptx = set(), set()
    for item in filter(None, (part.strip() for part in re.split(r"[;\s]+", arch_list))):
        found = _ARCH.match(item)
        if found is None:
            raise UsageError(f"arch list entry {item!r} is not X.Y, X.Ya or X.Y+PTX",
                             "write the arch list as TORCH_CUDA_ARCH_LIST does, e.g. 8.0;9.0+PTX")
        arch = f"sm_{found.group(1)}{found.group(2)}{found.group(3)}"
        sass.add(arch)
        if found.group(4):
            ptx.add(arch)
    return Wanted(frozenset(sass), frozenset(ptx))


def has_device_code(path: Path) -> bool:
    """Any fatbin container in the file, in whichever section (torchforge.fatbin)."""
    return fatbin.read(path).present


def device_code(path: Path) -> tuple[set[str], set[str]]:
    """(SASS archs, PTX archs) of every fatbin entry in one file, `sm_90a` for an arch-specific one."""
    code = fatbin.read(path)
    return code.sass, code.ptx


def tree_device_code(tree: Path) -> dict[str, fatbin.DeviceCode]:
    """Relative path -> device code of every ELF file under an unpacked package `tree` that has any (info/ left
    out, a file whose fatbins cannot be read at all too: information, not a verdict)."""
    found = {}
    for path in sorted(p for p in iter_tree(tree) if maybe_elf(p)):
        name = path.relative_to(tree).as_posix()
        if not name.startswith("info/") and (code := fatbin.read(path)).entries:
            found[name] = code
    return found


def package_device_code(archive: Path, include: Callable[[str], bool] = lambda name: True) -> dict[str, fatbin.DeviceCode]:
    """`tree_device_code` of a .conda or .tar.bz2 (`include`: which member paths to read), read member by member:
    one regular ELF file at a time is copied out, no link is ever made, so reading device code needs no judgement
    of the archive's links (installing it does, and refuses one pointing outside). The one reader of a package
    file's device code: the build's arch check and constraint, the lock's arches, a channel pytorch's arch list."""
    from conda_package_streaming import package_streaming as streaming

    found = {}
    with tempfile.TemporaryDirectory(prefix="torchforge-device-code-") as scratch, archive.open("rb") as handle:
        copy = Path(scratch) / "member"
        for tar, member in streaming.stream_conda_component(str(archive), handle, streaming.CondaComponent.pkg):
            if not member.isfile() or member.name.startswith("info/") or not include(member.name):
                continue
            source = tar.extractfile(member)
            head = source.read(4) if source else b""
            if head != b"\x7fELF" or source is None:
                continue
            with copy.open("wb") as out:
                out.write(head)
                shutil.copyfileobj(source, out, _COPY_CHUNK)
            if (code := fatbin.read(copy)).entries:
                found[member.name] = code
    return found


def missing(codes: Mapping[str, fatbin.DeviceCode], arch_list: str, exempt: tuple[str, ...] = ()) -> list[Missing]:
    """Every (file, arch) of the list that a file with device code lacks (`exempt`: globs of file names left out,
    libraries the build copied in rather than compiled)."""
    want = wanted(arch_list)
    problems: list[Missing] = []
    for name, code in sorted(codes.items()):
        if any(fnmatch.fnmatch(PurePosixPath(name).name, glob) for glob in exempt):
            continue
        problems += [Missing(name, arch, "SASS") for arch in sorted(want.sass - code.sass)]
        problems += [Missing(name, arch, "PTX") for arch in sorted(want.ptx - code.ptx)]
    return problems


def missing_in_tree(tree: Path, arch_list: str, exempt: tuple[str, ...] = ()) -> list[Missing]:
    """`missing` of an unpacked package tree."""
    return missing(tree_device_code(tree), arch_list, exempt)


def check_package(artifact: Path, arch_list: str, exempt: tuple[str, ...] = (),
                  codes: Mapping[str, fatbin.DeviceCode] | None = None) -> None:
    """AuditFailedError naming each file and arch a built package lacks (nothing when it has no device code);
    `codes`: the package's device code where the caller has read it already."""
    problems = missing(package_device_code(artifact) if codes is None else codes, arch_list, exempt)
    if problems:
        raise AuditFailedError(f"{artifact.name} lacks device code for the arch list {arch_list}:\n  - "
                               + "\n  - ".join(map(str, problems)),
                               "build with TORCH_CUDA_ARCH_LIST covering every arch (a library built by its own "
                               "arch list, or a CUDA too old for an arch, leaves it out)")
