"""Arch coverage of a package's CUDA device code: every ELF file that carries device code (a `.nv_fatbin`
section) must hold SASS for each arch of the requested list and PTX for the `+PTX` one, as `cuobjdump` lists
them. Upstream's own cu128 torchvision/torchaudio wheels once lacked sm_100/sm_120 and only cuobjdump showed it
(pytorch/test-infra#6273); the RPATH audit cannot see it.

cuobjdump comes from PATH or from NVIDIA's `nvidia-cuda-cuobjdump` wheel (torchforge's test extra), which puts it
in site-packages/nvidia/cuXY/bin.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from torchforge.elf import iter_tree, maybe_elf
from torchforge.errors import AuditFailedError, ToolMissingError, UsageError
from torchforge.proc import Command, Runner
from torchforge.safeextract import extract_conda

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_LISTED = re.compile(r"\.(sm_\d+[af]?)\.(cubin|ptx)\s*$")
FATBIN_SECTION = ".nv_fatbin"


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


def find_cuobjdump() -> Path:
    """cuobjdump on PATH, else the nvidia-cuda-cuobjdump wheel's."""
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    try:
        import nvidia  # type: ignore[import-not-found]  # the namespace package of NVIDIA's wheels
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []) if nvidia else []:
        for candidate in sorted(Path(root).glob("cu*/bin/cuobjdump"), reverse=True):
            return candidate
    raise ToolMissingError("cuobjdump was not found: the arch check of CUDA packages lists device code with it",
                           "pip install nvidia-cuda-cuobjdump (or put a CUDA toolkit's bin on PATH)")


def has_device_code(path: Path) -> bool:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as handle:
            return ELFFile(handle).get_section_by_name(FATBIN_SECTION) is not None
    except (ELFError, OSError):
        return False


def device_code(path: Path, runner: Runner, tool: Path) -> tuple[set[str], set[str]]:
    """(SASS archs, PTX archs) that cuobjdump lists in one file."""
    found: dict[str, set[str]] = {"cubin": set(), "ptx": set()}
    for flag in ("--list-elf", "--list-ptx"):
        output = runner.run(Command((str(tool), flag, str(path))), check=False).output
        for line in output.splitlines():
            listed = _LISTED.search(line)
            if listed:
                found[listed.group(2)].add(listed.group(1))
    return found["cubin"], found["ptx"]


def missing_in_tree(tree: Path, arch_list: str, runner: Runner) -> list[Missing]:
    """Every (file, arch) of the list that a file with device code under `tree` lacks."""
    want = wanted(arch_list)
    # cuobjdump is looked for only when a file has device code: a package without any needs no toolkit here
    libraries = sorted(p for p in iter_tree(tree) if maybe_elf(p) and has_device_code(p))
    tool = find_cuobjdump() if libraries else None
    problems: list[Missing] = []
    for path in libraries:
        sass, ptx = device_code(path, runner, tool)  # type: ignore[arg-type]
        name = path.relative_to(tree).as_posix()
        problems += [Missing(name, arch, "SASS") for arch in sorted(want.sass - sass)]
        problems += [Missing(name, arch, "PTX") for arch in sorted(want.ptx - ptx)]
    return problems


def check_package(artifact: Path, arch_list: str, runner: Runner) -> None:
    """AuditFailedError naming each file and arch a built package lacks (nothing when it has no device code)."""
    with tempfile.TemporaryDirectory(prefix="torchforge-arch-") as scratch:
        tree = Path(scratch) / "pkg"
        extract_conda(artifact, tree)
        problems = missing_in_tree(tree, arch_list, runner)
    if problems:
        raise AuditFailedError(f"{artifact.name} lacks device code for the arch list {arch_list}:\n  - "
                               + "\n  - ".join(map(str, problems)),
                               "build with TORCH_CUDA_ARCH_LIST covering every arch (a library built by its own "
                               "arch list, or a CUDA too old for an arch, leaves it out)")
