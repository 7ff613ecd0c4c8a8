"""One wheel of a stack, read without unpacking it: which project (or NVIDIA component) it is, its version,
Python, CUDA build and requirements.

The CUDA build comes from `<top>/version.py` (`__version__ = '2.10.0+cu128'`): PyPI's copies of the default
CUDA build drop `+cu128` from the file name and METADATA (official-builds.md §3.7), the module keeps it.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from torchforge.binaries.catalog import catalog
from torchforge.errors import ArchiveError, UsageError
from torchforge.safeextract import check_zip
from torchforge.wheel import WheelName

_LOCAL = re.compile(r"""^__version__\s*=\s*['"][^'"+]+\+([A-Za-z0-9.]+)['"]""", re.MULTILINE)


@dataclass(frozen=True)
class StackWheel:
    path: Path
    name: WheelName
    project: str  # PEP 503 name from METADATA
    version: str  # public version (no local tag)
    python: str | None  # "3.12"; None for a py3-none wheel
    local: str | None  # "cpu", "cu128"; None for a project without CUDA builds
    requires: tuple[str, ...]
    license_files: tuple[str, ...]

    @property
    def is_component(self) -> bool:
        return catalog().component(self.project) is not None

    @property
    def cuda(self) -> str | None:
        """"12.8" for a cu128 build; None for CPU or a project without CUDA builds."""
        match = re.fullmatch(r"cu(\d+)(\d)", self.local or "")
        return f"{match[1]}.{match[2]}" if match else None


def _python(tag: str) -> str | None:
    match = re.fullmatch(r"cp(\d)(\d+)", tag)
    return f"{match[1]}.{match[2]}" if match else None


def read(path: Path, *, any_project: bool = False) -> StackWheel:
    """Read `path`; a wheel of a project torchforge does not repack is refused (exit 2), unless `any_project`
    (a requirement brought along: torchforge.closure)."""
    if path.is_dir():
        raise UsageError(f"{path} is a folder, not a wheel file",
                         f"pass the wheel files in it ({path}/*.whl), or let repack fetch them with --pytorch")
    if not path.is_file():
        raise UsageError(f"{path} does not exist", "pass wheel files, or let repack fetch them with --pytorch")
    name = WheelName.parse(path.name)
    try:
        with zipfile.ZipFile(path) as zf:
            check_zip(path, zf)  # its names become paths: refused here, before any plan or channel exists
            names = zf.namelist()
            dist = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
            if dist is None:
                raise ArchiveError(f"{path.name} has no .dist-info folder", "pass the wheel as downloaded")
            headers = HeaderParser().parsestr(zf.read(f"{dist}/METADATA").decode("utf-8"))
            project = canonicalize_name(headers.get("Name", ""))
            known = catalog().project(project)
            # cuda-toolkit: a metadata-only wheel whose extras pin torch 2.11+'s CUDA 13 components.
            if known is None and catalog().component(project) is None and project != "cuda-toolkit" and not any_project:
                raise _foreign(path, headers.get("Name", ""))
            local = None
            if known is not None and known.cuda_variant:
                local = _local_tag(zf, names, known.top, path)
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise ArchiveError.unreadable(path, exc) from exc
    if canonicalize_name(name.name) != project:
        raise UsageError(f"{path.name} is named for {name.name!r} but its METADATA says {headers.get('Name')!r}",
                         "pass the wheel under the name it was published with")
    licenses = tuple(n for n in names if n.startswith(f"{dist}/") and re.search(r"LICEN[CS]E|COPYING|NOTICE", n.split("/")[-1], re.I))
    return StackWheel(path, name, project, name.public_version, _python(name.python), local,
                      tuple(headers.get_all("Requires-Dist") or ()), licenses)


def _foreign(path: Path, project: str) -> UsageError:
    known = sorted(catalog().projects)
    return UsageError(f"{path.name} is a wheel of {project!r}, which torchforge does not repack",
                      f"repack takes wheels of {', '.join(known)} and the NVIDIA component wheels they require; "
                      "install other projects from conda-forge or with pip")


def _local_tag(zf: zipfile.ZipFile, names: list[str], top: str, path: Path) -> str:
    if f"{top}/version.py" not in names:
        raise ArchiveError(f"{path.name} has no {top}/version.py", "pass the official wheel as downloaded")
    match = _LOCAL.search(zf.read(f"{top}/version.py").decode("utf-8"))
    if not match:
        raise UsageError(f"{path.name}: {top}/version.py names no build (+cpu, +cu128 ...)",
                         "repack takes official wheels, whose version.py says which build they are")
    return match[1]
