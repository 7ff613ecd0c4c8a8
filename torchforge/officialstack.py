"""The official flavour's torchvision and torchaudio (`--with`, issue 32): the pytorch channel's packages of
PyTorch 2.1 to 2.5 as upstream's conda build made them (data/official_stack.toml, with sources).

Upstream's: the build string `py<XY>_<cpu|cuXYZ>`; host and run name `pytorch ==<version>`, `pytorch-mutex 1.0
<cpu|cuda>` and, for a CUDA build, `pytorch-cuda <X.Y>`; run_constrained `cpuonly` (cpu) or `cpuonly <0` (CUDA);
the other run requirements those of the release's wheel. torchforge's own: host pins the exact pytorch file the
plan builds (upstream took whatever `pytorch ==<version>` its channel served), so the package is built after it
and against it; the arch list of a CUDA build is the pytorch variant's. Pure: no files, no commands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from torchforge import __version__, platforms, versions
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel
from torchforge.errors import RefusedError, UsageError
from torchforge.compilecache import BUILD_VARIABLES, group_key, settings_material
from torchforge.flavours.base import JOBS_VARIABLE, PlannedRecipe
from torchforge.templates import RecipeFormat, environment
from torchforge.resolved import Variant
from torchforge.versions import nodot

WHERE = "torchforge/data/official_stack.toml"
COMPANIONS = ("torchvision", "torchaudio")
# The platforms the recipe is rendered for (build.sh, or bld.bat on Windows); upstream's were not osx-shaped
# (no pytorch-mutex there), which this recipe does not reproduce.
PLATFORMS = ("linux-64", "linux-aarch64", "win-64")
# The variables each project's setup.py reads to build its CUDA code (meta.yaml script_env names them).
CUDA_SWITCH = {"torchvision": "FORCE_CUDA", "torchaudio": "USE_CUDA"}


class Project(FrozenModel):
    build_string: str  # py{py}_{cu}
    source_url: str  # {version}


class Release(FrozenModel):
    pytorch: str
    torchvision: str
    torchaudio: str
    torchvision_requires: tuple[str, ...]
    torchaudio_requires: tuple[str, ...]
    torchvision_wheel: str
    torchaudio_wheel: str


class StackTable(FrozenModel):
    schema_: int = 1
    sources: dict[str, str]
    project: dict[str, Project]
    release: tuple[Release, ...]


@cache
def load() -> StackTable:
    return parse_table_as(StackTable, data_text("official_stack"), WHERE)


def check_names(names: tuple[str, ...]) -> None:
    unknown = [name for name in names if name not in COMPANIONS]
    if unknown:
        raise UsageError(f"--with names {', '.join(map(repr, unknown))}, which torchforge does not build",
                         f"--with takes {', '.join(COMPANIONS)} (comma-separated)")


@dataclass(frozen=True)
class StackRecipe:
    """One torchvision or torchaudio package for one pytorch variant of the plan."""

    package: str
    version: str
    pytorch: Variant
    requires: tuple[str, ...]  # the wheel's Requires-Dist besides torch, as conda specs
    source_url: str

    @property
    def tag(self) -> str:
        return self.pytorch.request.accel_tag  # cpu, cu124

    @property
    def python(self) -> str:
        return self.pytorch.request.python

    @property
    def build_string(self) -> str:
        return load().project[self.package].build_string.format(py=nodot(self.python), cu=self.tag)

    @property
    def id(self) -> str:
        request = self.pytorch.request
        return f"{self.package}-{self.version}-{self.tag}-py{nodot(self.python)}-{request.platform.replace('-', '_')}"

    @property
    def stem(self) -> str:
        return f"{self.package}-{self.version}-{self.build_string}"

    @property
    def settings(self) -> str:
        """What changed the binary: the exact pytorch file and its arch list."""
        return json.dumps({"flavour": "official", "package": self.package, "pytorch": self.pytorch.filename_stem,
                           "arch_list": self.pytorch.arch_list}, sort_keys=True)

    @property
    def cuda(self) -> str | None:
        return self.pytorch.request.accel if self.pytorch.request.is_cuda else None


def release_for(pytorch: str) -> Release:
    for release in load().release:
        if release.pytorch == pytorch:
            return release
    known = ", ".join(r.pytorch for r in load().release)
    newer = versions.parse(pytorch) > versions.parse(load().release[-1].pytorch)  # no official conda packages
    raise RefusedError(f"--with has no facts for PyTorch {pytorch}'s torchvision and torchaudio in the official "
                       f"flavour ({WHERE} holds {known})",
                       "use --flavour conda-forge, whose --with builds them for 2.6 and newer" if newer else
                       f"pick one of {known}, or leave --with out")


def plan(package: str, variant: Variant) -> StackRecipe:
    """The `package` recipe for one pytorch variant (refused where the table has no facts or platform)."""
    check_names((package,))
    request = variant.request
    if request.platform not in PLATFORMS:
        raise RefusedError(f"--with renders {package} for {', '.join(PLATFORMS)}, not {request.platform}",
                           "plan the linux pytorch, or leave --with out")
    release = release_for(request.pytorch)
    version = getattr(release, package)
    project = load().project[package]
    return StackRecipe(package, version, variant, getattr(release, f"{package}_requires"),
                       project.source_url.format(version=version))


def requirements(recipe: StackRecipe, fmt: RecipeFormat) -> dict[str, list[str]]:
    """host, run and run_constrained, upstream's pins with the exact pytorch file in host."""
    variant = "cuda" if recipe.cuda else "cpu"
    rattler = fmt is RecipeFormat.RATTLER_BUILD
    exact = "==" if rattler else ""  # conda-build reads `V BUILD` as exact
    pytorch = recipe.pytorch
    # rattler-build's recipe parser takes a dotted build string (py3.12_cuda12.4_...) in the bracket form only
    pinned = f'pytorch[version="=={pytorch.request.pytorch}", build="{pytorch.build_string}"]' if rattler \
        else f"pytorch {pytorch.request.pytorch} {pytorch.build_string}"
    toolkit = [f"pytorch-cuda {recipe.cuda}.*"] if recipe.cuda else []  # upstream's `pytorch-cuda=X.Y`
    mutex = f"pytorch-mutex {exact}1.0 {variant}"
    return {
        "host": [f"python {recipe.python}.*", "setuptools", mutex,
                 pinned, *toolkit],
        "run": [f"python {recipe.python}.*", *recipe.requires, mutex, f"pytorch =={pytorch.request.pytorch}", *toolkit],
        "run_constrained": ["cpuonly <0"] if recipe.cuda else ["cpuonly"],
    }


def recipe_files(recipe: StackRecipe, fmt: RecipeFormat, local_source: str | None = None) -> dict[str, str]:
    """{file name: text} of the recipe folder (official layout: meta.yaml or recipe.yaml, and build.sh)."""
    fields = {
        "header": f"Rendered by torchforge {__version__} for {recipe.id}. Re-render instead of editing.",
        "warnings": [f"upstream's conda recipe at the {recipe.package} {recipe.version} tag could not be read "
                     f"({WHERE} [sources] not_read): the run requirements besides these pins are its wheel's"],
        "name": recipe.package, "version": recipe.version, "build_string": recipe.build_string,
        "source": {"path": local_source} if local_source else {"url": recipe.source_url},
        "requirements": requirements(recipe, fmt), "cuda": recipe.cuda, "switch": CUDA_SWITCH[recipe.package],
        "arch_list": recipe.pytorch.arch_list or "", "module": recipe.package, "cache_env": BUILD_VARIABLES,
        "extra": {"torchforge_flavour": "official", "torchforge_settings": recipe.settings,
                  "pytorch": recipe.pytorch.filename_stem},
    }
    jinja = environment()
    name = "meta.yaml" if fmt is RecipeFormat.CONDA_BUILD else "recipe.yaml"
    script = platforms.get(recipe.pytorch.request.platform).script  # build.sh, bld.bat
    return {name: jinja.get_template(f"stack/{name}.j2").render(**fields, script_file=script),
            script: jinja.get_template(f"stack/{script}.j2").render(**fields)}


def planned_recipe(recipe: StackRecipe, fmt: RecipeFormat, channels: tuple[str, ...],
                   local_source: str | None = None) -> PlannedRecipe:
    """What the pipeline builds: after the recipe of its pytorch variant, in that variant's channels (the output
    channel, where the pinned pytorch file is, comes first through the pipeline)."""
    return PlannedRecipe(recipe.id, recipe.pytorch.request.platform, (recipe.stem,), recipe.settings,
                         recipe_files(recipe, fmt, local_source), channels, recipe.cuda or "cpu", local_source,
                         kind=recipe.package,
                         needs=(recipe.pytorch.id,), python=recipe.python, script_env=(JOBS_VARIABLE,),
                         cache_script_env=BUILD_VARIABLES, cache_group=group_key(*settings_material(
                             f"{recipe.package}-{recipe.version}-{recipe.tag}-{recipe.pytorch.request.platform.replace('-', '_')}",
                             recipe.settings)),
                         pythons=((recipe.stem, recipe.python),), arch_list=recipe.pytorch.arch_list if recipe.cuda else None)
