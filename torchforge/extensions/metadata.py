"""What an extension's sdist says of itself (name, version, run and build requirements), in conda's words.

pip prepares the metadata (`pip install --dry-run --report`) with `--no-build-isolation` in a Python where torch
is importable: extension setup.py files import torch at the top. The build requirements are the sdist's
pyproject.toml `[build-system] requires` (setuptools' own fallback, setuptools and wheel, where it has none).
torch is left out of both lists: the recipe pins the exact pytorch build instead. Names are mapped to conda's by
torchforge/data/pypi_to_conda.toml; markers are evaluated for linux-64 and the build's Python.
"""

from __future__ import annotations

import json
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import HeaderParser
from functools import cache
from pathlib import Path

from packaging.utils import canonicalize_name

from torchforge.binaries.catalog import pypi_to_conda
from torchforge.binaries.plan import active, conda_spec
from torchforge.data import data_text, parse_toml
from torchforge.errors import DataError, UsageError
from torchforge.proc import Command, Runner
from torchforge.safeextract import tar_members

# PEP 517's fallback for a source tree without [build-system] (setup.py only, as torch-scatter 2.1.2).
SETUPTOOLS_FALLBACK = ("setuptools", "wheel")
TORCH = "torch"


@dataclass(frozen=True)
class Switches:
    """torchforge/data/extensions.toml: a package's own variables for its build, for a CUDA build only, and
    for its metadata."""

    build_env: tuple[tuple[str, str], ...] = ()
    metadata_env: tuple[tuple[str, str], ...] = ()
    cuda_env: tuple[tuple[str, str], ...] = ()


@cache
def _switch_table() -> dict[str, Switches]:
    where = "torchforge/data/extensions.toml"
    packages = parse_toml(data_text("extensions"), where).get("packages", {})
    table = {}
    for name, entry in dict(packages).items():  # type: ignore[call-overload]
        envs = [entry.get(key, {}) for key in ("build_env", "metadata_env", "cuda_env")]
        if not all(isinstance(env, dict) and all(isinstance(v, str) for v in env.values()) for env in envs):
            raise DataError(f"{where}: [packages.{name}] build_env, metadata_env and cuda_env map variables to "
                            "strings",
                            "fix the table")
        table[canonicalize_name(name)] = Switches(*(tuple(sorted(env.items())) for env in envs))
    return table


def metadata_env() -> dict[str, str]:
    """Every package's metadata switches at once: pip may prepare an sdist before its name is known (a
    NAME==VERSION download), and another package's switch changes nothing."""
    return {k: v for entry in _switch_table().values() for k, v in entry.metadata_env}


def switches(name: str) -> Switches:
    """The package's switches; none for a package the table does not list."""
    return _switch_table().get(canonicalize_name(name), Switches())


@dataclass(frozen=True)
class SdistMetadata:
    name: str  # as the sdist spells it (PyPI's)
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines
    build_requires: tuple[str, ...]  # PEP 508 lines

    @property
    def conda_name(self) -> str:
        return canonicalize_name(self.name)


def read_metadata(archive: Path, python: str, runner: Runner, scratch: Path) -> SdistMetadata:
    """The sdist's metadata as pip prepares it, with the metadata switches set."""
    report = scratch / "pip-report.json"
    env = metadata_env()
    runner.run(Command((python, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps", "--ignore-installed",
                        "--no-build-isolation", "--no-index", "--report", str(report), str(archive)), env=env))
    installs = json.loads(report.read_text()).get("install", [])
    if len(installs) != 1:
        raise UsageError(f"{archive}: pip's report names {len(installs)} packages, not one", "give one sdist")
    meta = installs[0]["metadata"]
    return SdistMetadata(meta["name"], meta["version"], tuple(meta.get("requires_dist") or ()),
                         build_requirements(archive))


def _top_level_text(archive: Path, filename: str) -> str | None:
    """The sdist's top-level `filename` (NAME-VERSION/FILENAME), read through the archive rule."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            name = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(f"/{filename}")), None)
            return zf.read(name).decode() if name else None
    for tar, member in tar_members(archive):
        if member.isfile() and member.name.count("/") == 1 and member.name.endswith(f"/{filename}"):
            handle = tar.extractfile(member)
            return handle.read().decode() if handle else None
    return None


def _pyproject(archive: Path) -> dict[str, object] | None:
    text = _top_level_text(archive, "pyproject.toml")
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{archive}: its pyproject.toml cannot be read ({exc})", "fix the sdist") from exc


def sdist_identity(archive: Path) -> tuple[str, str]:
    """(name, version) a source archive says of itself without running anything: its PKG-INFO (every sdist has
    one), else the static [project] name and version of its pyproject.toml."""
    pkg_info = _top_level_text(archive, "PKG-INFO")
    if pkg_info is not None:
        headers = HeaderParser().parsestr(pkg_info)
        if headers["Name"] and headers["Version"]:
            return str(headers["Name"]), str(headers["Version"])
    project = (_pyproject(archive) or {}).get("project")
    if isinstance(project, dict) and isinstance(project.get("name"), str) and isinstance(project.get("version"), str):
        return project["name"], project["version"]
    raise UsageError(f"{archive.name}: no PKG-INFO and no static [project] name and version in pyproject.toml, so "
                     "the package cannot be named before it is built",
                     "give an sdist (`python -m build --sdist` writes its PKG-INFO), or NAME==VERSION from an index")


def build_requirements(archive: Path) -> tuple[str, ...]:
    pyproject = _pyproject(archive)
    system = (pyproject or {}).get("build-system")
    requires = system.get("requires") if isinstance(system, dict) else None
    return tuple(requires) if isinstance(requires, list) else SETUPTOOLS_FALLBACK


def to_conda(requires: Iterable[str], python: str, *, drop: bool) -> tuple[str, ...]:
    """conda specs of the requirements active on linux-64 with `python`, torch left out; `drop` also leaves out
    pypi_to_conda.toml's [drop] names (run requirements: setuptools is a build tool there)."""
    mapping = pypi_to_conda()
    specs = []
    for req in active(requires, python):
        name = canonicalize_name(req.name)
        if name == TORCH or (drop and name in mapping.drop):
            continue
        specs.append(f"{mapping.names.get(name, name)} {conda_spec(req.specifier, release_prefix=False)}".strip())
    return tuple(dict.fromkeys(specs))
