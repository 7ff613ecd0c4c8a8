"""What an extension's sdist says of itself (name, version, run and build requirements), in conda's words.

The metadata is read as the sdist states it where it does (PKG-INFO of Metadata-Version 2.2 or later without a
dynamic Requires-Dist, or a static pyproject.toml [project]): nothing of the sdist runs. Otherwise pip prepares it
(`pip install --dry-run --report`) with `--no-build-isolation` in a Python where torch is importable (extension
setup.py files import torch at the top), isolated: no network, no writes outside a scratch folder. The build requirements are the sdist's
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
from packaging.version import InvalidVersion, Version

from torchforge.binaries.catalog import pypi_to_conda
from torchforge.binaries.plan import active, conda_spec
from torchforge.data import data_text, parse_toml
from torchforge.errors import DataError, ToolFailedError, UsageError
from torchforge.isolation import isolated
from torchforge.proc import Command, Runner
from torchforge.safeextract import tar_members

# PEP 517's fallback for a source tree without [build-system] (setup.py only, as torch-scatter 2.1.2).
SETUPTOOLS_FALLBACK = ("setuptools", "wheel")
TORCH = "torch"
STATIC_METADATA_VERSION = Version("2.2")  # PEP 643: sdist metadata fields not marked Dynamic are final
TAIL = 12  # pip's last lines in a failed metadata step's message


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
    """The sdist's metadata: as it states it (static_metadata: nothing of the sdist runs), else as pip prepares
    it with the metadata switches set, isolated (torchforge/isolation.py: no network, `scratch` its only writable
    folder), since that runs the sdist's own setup.py."""
    static = static_metadata(archive)
    if static is not None:
        return static
    work = scratch / "metadata"
    work.mkdir(parents=True, exist_ok=True)  # isolated or not, pip writes its report there
    report = work / "pip-report.json"
    command = Command((python, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps", "--ignore-installed",
                       "--no-build-isolation", "--no-index", "--report", str(report), str(archive)),
                      env=metadata_env())
    what = f"{archive.name}'s setup.py (pip reading its metadata)"
    try:
        runner.run(isolated(command, [work], what))
    except ToolFailedError as exc:
        last = "\n".join(exc.tail.strip().splitlines()[-TAIL:])
        raise ToolFailedError(f"{archive.name}: pip could not read its metadata (it runs the sdist's setup.py); "
                              f"pip's last lines:\n{last}",
                              "fix the sdist, or give one whose PKG-INFO states its requirements "
                              "(Metadata-Version 2.2 or later, Requires-Dist not dynamic)", tail=exc.tail) from exc
    installs = json.loads(report.read_text()).get("install", [])
    if len(installs) != 1:
        raise UsageError(f"{archive}: pip's report names {len(installs)} packages, not one", "give one sdist")
    meta = installs[0]["metadata"]
    return SdistMetadata(meta["name"], meta["version"], tuple(meta.get("requires_dist") or ()),
                         build_requirements(archive))


def static_metadata(archive: Path) -> SdistMetadata | None:
    """Name, version and requirements where the sdist states them, so none of its code runs: a PKG-INFO of
    Metadata-Version 2.2 or later (PEP 643: a field not marked `Dynamic` is final) without a dynamic
    Requires-Dist, else a pyproject.toml `[project]` whose name, version and dependencies are not dynamic (PEP 621).
    None where the sdist leaves them to its build."""
    pkg_info = _top_level_text(archive, "PKG-INFO")
    if pkg_info is not None:
        headers = HeaderParser().parsestr(pkg_info)
        dynamic = {str(field).strip().lower() for field in headers.get_all("Dynamic") or ()}
        try:
            stated = Version(str(headers["Metadata-Version"] or "0")) >= STATIC_METADATA_VERSION
        except InvalidVersion:
            stated = False
        if stated and headers["Name"] and headers["Version"] and "requires-dist" not in dynamic:
            return SdistMetadata(str(headers["Name"]), str(headers["Version"]),
                                 tuple(str(r) for r in headers.get_all("Requires-Dist") or ()),
                                 build_requirements(archive))
    project = (_pyproject(archive) or {}).get("project")
    if not isinstance(project, dict):
        return None
    name, version, dependencies = project.get("name"), project.get("version"), project.get("dependencies", [])
    dynamic_fields = project.get("dynamic", [])
    if (isinstance(name, str) and isinstance(version, str) and isinstance(dependencies, list)
            and isinstance(dynamic_fields, list) and "dependencies" not in dynamic_fields):
        return SdistMetadata(name, version, tuple(str(d) for d in dependencies), build_requirements(archive))
    return None


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
    pypi_to_conda.toml's [drop] names (run requirements; none today: a dist-info's requirement is kept, since
    `pip check` reads it)."""
    mapping = pypi_to_conda()
    specs = []
    for req in active(requires, python):
        name = canonicalize_name(req.name)
        if name == TORCH or (drop and name in mapping.drop):
            continue
        specs.append(f"{mapping.names.get(name, name)} {conda_spec(req.specifier, release_prefix=False)}".strip())
    return tuple(dict.fromkeys(specs))


def standin_requirements(archive: Path | None, python: str, cuda: bool) -> tuple[tuple[str, ...], bool]:
    """What an extension's recipe installs besides python and pytorch (its build requirements, pip, ninja for
    CUDA, its run requirements), in conda names, for a stand-in channel, read without running anything; and
    whether its run requirements are known (the sdist states them: static_metadata). `archive` None: a
    NAME==VERSION not downloaded, setuptools' fallback build requirements only."""
    static = static_metadata(archive) if archive is not None else None
    build = static.build_requires if static else build_requirements(archive) if archive else SETUPTOOLS_FALLBACK
    run = to_conda(static.requires, python, drop=True) if static else ()
    specs = (*to_conda(build, python, drop=False), "pip", *(("ninja",) if cuda else ()), *run)
    return tuple(dict.fromkeys(specs)), static is not None
