"""torchforge/data/binaries.toml: the projects `repack` turns into conda packages and the NVIDIA component
wheels they require (conda-forge names, library folders), loaded once and validated."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict

from torchforge.data import data_text, parse_toml
from torchforge.errors import DataError

WHERE = "torchforge/data/binaries.toml"


class Project(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    conda: str
    top: str
    cuda_variant: bool
    lib_dir: str = ""
    libraries: tuple[str, ...] = ()


class Component(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    conda_forge: str
    lib_dir: str
    libraries: tuple[str, ...]
    # Libraries of the host that some of the wheel's plugins link and the wheel does not carry (rdma-core, MPI).
    host_libraries: tuple[str, ...] = ()


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    meta: dict[str, str]
    schema_: int = 1
    projects: dict[str, Project]
    components: dict[str, Component]
    toolkit_extras: dict[str, str]

    def project(self, name: str) -> Project | None:
        return self.projects.get(canonicalize_name(name))

    def component(self, name: str) -> Component | None:
        return self.components.get(canonicalize_name(name))

    def libraries_of(self, conda_name: str) -> tuple[str, ...]:
        """File-name prefixes of the libraries the conda package `conda_name` brings: a project's under its conda
        name, a component's under its conda-forge name and under its PyPI name (wheels mode)."""
        found: list[str] = []
        for project in self.projects.values():
            if project.conda == conda_name:
                found.extend(project.libraries)
        for name, component in self.components.items():
            if conda_name in (name, component.conda_forge):
                found.extend(component.libraries)
        return tuple(dict.fromkeys(found))

    def host_library(self, file_rel: str, needed: str) -> bool:
        """`needed` is a host library NVIDIA's wheel expects next to the file `file_rel` (a path ending in the
        component's lib_dir and file name)."""
        folder = file_rel.rsplit("/", 1)[0] if "/" in file_rel else ""
        return any(needed.startswith(c.host_libraries) for c in self.components.values()
                   if c.host_libraries and c.lib_dir and (folder == c.lib_dir or folder.endswith("/" + c.lib_dir)))

    def provided_dirs(self, depends: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """site-packages folders (→ library name prefixes) that the conda packages in `depends` install:
        a project's lib_dir under its conda name, a component's under its PyPI name (the name its repacked
        package has in `--cuda-libs wheels` mode)."""
        found: dict[str, list[str]] = {}
        for project in self.projects.values():
            if project.lib_dir and project.conda in depends:
                found.setdefault(project.lib_dir, []).extend(project.libraries)
        for name, component in self.components.items():
            if component.lib_dir and name in depends:
                found.setdefault(component.lib_dir, []).extend(component.libraries)
        return {folder: tuple(dict.fromkeys(libs)) for folder, libs in found.items()}


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    raw = parse_toml(data_text("binaries"), WHERE)
    try:
        loaded = Catalog.model_validate(raw)
    except ValueError as exc:
        raise DataError(f"{WHERE} is malformed: {exc}", "fix the table") from exc
    for name in [*loaded.projects, *loaded.components, *loaded.toolkit_extras.values()]:
        if name != canonicalize_name(name):
            raise DataError(f"{WHERE}: {name!r} is not a normalised PyPI name", f"write {canonicalize_name(name)!r}")
    missing = sorted(set(loaded.toolkit_extras.values()) - set(loaded.components))
    if missing:
        raise DataError(f"{WHERE}: toolkit extras name unknown components {missing}", "add them under [components]")
    return loaded


@lru_cache(maxsize=1)
def outside_libraries() -> dict[str, str]:
    """torchforge/data/sonames.toml: SONAME -> the conda spec of the package that provides it, for libraries a
    repacked package links from outside the stack."""
    where = "torchforge/data/sonames.toml"
    libraries = parse_toml(data_text("sonames"), where).get("libraries")
    if not isinstance(libraries, dict) or not all(isinstance(v, str) and v.strip() for v in libraries.values()):
        raise DataError(f"{where}: [libraries] must map each SONAME to a conda spec", "fix the table")
    return {str(k): str(v) for k, v in libraries.items()}


@dataclass(frozen=True)
class Mapping:
    """torchforge/data/pypi_to_conda.toml: PyPI names whose conda name differs, and requirements dropped."""

    names: dict[str, str]
    drop: frozenset[str]


@lru_cache(maxsize=1)
def pypi_to_conda() -> Mapping:
    data = tomllib.loads(data_text("pypi_to_conda"))
    return Mapping(
        names={canonicalize_name(k): v for k, v in data["names"].items()},
        drop=frozenset(canonicalize_name(n) for n in data["drop"]["names"]),
    )
