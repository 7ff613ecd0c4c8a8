"""The official flavour's torchvision and torchaudio (`--with`, issue 32): the pytorch channel's packages of
PyTorch 2.1 to 2.5 as upstream's conda build made them (data/official_stack.toml, with sources); for a later
release, which the pytorch channel published no package of, the same shape with PyPI's pairing and wheel
requirements (data/stack_pairing.toml), said in a warning.

Upstream's: the build string `py<XY>_<cpu|cuXYZ>`; host and run name `pytorch ==<version>`, `pytorch-mutex 1.0
<cpu|cuda>` and, for a CUDA build, `pytorch-cuda <X.Y>`; run_constrained `cpuonly` (cpu) or `cpuonly <0` (CUDA);
the other run requirements those of the release's wheel. torchforge's own: host pins the exact pytorch file the
plan builds or the channel has (`--for`; upstream took whatever `pytorch ==<version>` its channel served), so the
package is built after it and against it; the arch list of a CUDA build is that pytorch's. A channel's pytorch
without pytorch-mutex (a repacked wheel) gets no mutex, pytorch-cuda or cpuonly pins: it is not of the pytorch
channel's shape. Pure: no files, no commands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from torchforge import __version__, platforms, stackpairing, versions
from torchforge.companionsource import CompanionSource
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel
from torchforge.errors import RefusedError, UsageError
from torchforge.compilecache import BUILD_VARIABLES, group_key, settings_material
from torchforge.flavours.base import JOBS_VARIABLE, PlannedRecipe, PytorchBuild
from torchforge.templates import RecipeFormat, environment
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
    """One torchvision or torchaudio package for one pytorch package: one the plan makes, or a channel's."""

    package: str
    version: str
    pytorch: PytorchBuild
    requires: tuple[str, ...]  # the wheel's Requires-Dist besides torch, as conda specs
    source_url: str
    needs: tuple[str, ...] = ()  # the recipe that makes its pytorch (none: a channel has it)
    # the pytorch channel's shape: its pytorch requires pytorch-mutex (and pytorch-cuda), which this pins too
    mutex: bool = True
    toolkit: bool = True  # a CUDA build pins pytorch-cuda X.Y (upstream's CONDA_CUDATOOLKIT_CONSTRAINT)
    source: CompanionSource | None = None  # --with-source: a local tree or archive instead of the release's
    warnings: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return self.pytorch.accel  # cpu, cu124

    @property
    def python(self) -> str:
        return self.pytorch.python

    @property
    def platform(self) -> str:
        return self.pytorch.subdir

    @property
    def build_string(self) -> str:
        return load().project[self.package].build_string.format(py=nodot(self.python), cu=self.tag)

    @property
    def id(self) -> str:
        return f"{self.package}-{self.version}-{self.tag}-py{nodot(self.python)}-{self.platform.replace('-', '_')}"

    @property
    def stem(self) -> str:
        return f"{self.package}-{self.version}-{self.build_string}"

    @property
    def settings(self) -> str:
        """What changed the binary: the exact pytorch file, its arch list, a local source's content."""
        source = {"source": self.source.identity} if self.source is not None else {}
        return json.dumps({"flavour": "official", "package": self.package, "pytorch": self.pytorch.stem,
                           "arch_list": self.pytorch.arch_list, **source}, sort_keys=True)

    @property
    def cuda(self) -> str | None:
        return self.pytorch.cuda


def release_for(pytorch: str) -> Release | None:
    """The pytorch channel's own pairing of a 2.1-2.5 release; None for a release it published no package of."""
    return next((release for release in load().release if release.pytorch == pytorch), None)


def _pypi_facts(package: str, pytorch: str) -> tuple[str, tuple[str, ...], str]:
    """(version, run requirements, warning) of a release the pytorch channel published no companion for: PyPI's
    pairing and wheel requirements (stackpairing), refused where neither table knows the release."""
    if versions.parse(pytorch) < versions.parse(load().release[0].pytorch):
        known = ", ".join(r.pytorch for r in load().release)
        raise RefusedError(f"--with has no facts for PyTorch {pytorch}'s torchvision and torchaudio in the official "
                           f"flavour ({WHERE} holds {known})", f"pick one of {known}, or leave --with out")
    row = stackpairing.companion_release(package, pytorch)  # type: ignore[arg-type]
    return row.version, row.run_requires, (
        f"the pytorch channel published no {package} for PyTorch {pytorch}: {package} {row.version} and its run "
        f"requirements are those of its PyPI wheel ({stackpairing.WHERE}: {row.source}), in the official shape")


def plan(package: str, pytorch: PytorchBuild, needs: tuple[str, ...] = (),
         source: CompanionSource | None = None) -> StackRecipe:
    """The `package` recipe for one pytorch package (refused where no table has facts, or for its platform). A
    channel's pytorch (no `needs`) is of the pytorch channel's shape only where it requires pytorch-mutex."""
    check_names((package,))
    if pytorch.subdir not in PLATFORMS:
        raise RefusedError(f"--with renders {package} for {', '.join(PLATFORMS)}, not {pytorch.subdir}",
                           "plan the linux pytorch, or leave --with out")
    release = release_for(pytorch.version)
    if release is not None:
        version, requires, warnings = getattr(release, package), getattr(release, f"{package}_requires"), ()
    else:
        version, requires, warning = _pypi_facts(package, pytorch.version)
        warnings = (warning,)
    names = {spec.split()[0] for spec in pytorch.depends}
    mutex, toolkit = (True, True) if needs else ("pytorch-mutex" in names, "pytorch-cuda" in names)
    return StackRecipe(package, version, pytorch, requires, load().project[package].source_url.format(version=version),
                       needs, mutex, toolkit, source, warnings)


def requirements(recipe: StackRecipe, fmt: RecipeFormat) -> dict[str, list[str]]:
    """host, run and run_constrained, upstream's pins with the exact pytorch file in host."""
    variant = "cuda" if recipe.cuda else "cpu"
    rattler = fmt is RecipeFormat.RATTLER_BUILD
    exact = "==" if rattler else ""  # conda-build reads `V BUILD` as exact
    pytorch = recipe.pytorch
    # rattler-build's recipe parser takes a dotted build string (py3.12_cuda12.4_...) in the bracket form only
    pinned = f'pytorch[version="=={pytorch.version}", build="{pytorch.build}"]' if rattler \
        else f"pytorch {pytorch.version} {pytorch.build}"
    # upstream's `pytorch-cuda=X.Y`
    toolkit = [f"pytorch-cuda {recipe.cuda}.*"] if recipe.cuda and recipe.toolkit else []
    mutex = [f"pytorch-mutex {exact}1.0 {variant}"] if recipe.mutex else []
    return {
        "host": [f"python {recipe.python}.*", "setuptools", *mutex, pinned, *toolkit],
        "run": [f"python {recipe.python}.*", *recipe.requires, *mutex, f"pytorch =={pytorch.version}", *toolkit],
        # cpuonly is the pytorch channel's switch between its cpu and CUDA packages, through pytorch-mutex
        "run_constrained": (["cpuonly <0"] if recipe.cuda else ["cpuonly"]) if recipe.mutex else [],
    }


def recipe_files(recipe: StackRecipe, fmt: RecipeFormat, local_source: str | None = None) -> dict[str, str]:
    """{file name: text} of the recipe folder (official layout: meta.yaml or recipe.yaml, and build.sh)."""
    fields = {
        "header": f"Rendered by torchforge {__version__} for {recipe.id}. Re-render instead of editing.",
        "warnings": [f"upstream's conda recipe at the {recipe.package} {recipe.version} tag could not be read "
                     f"({WHERE} [sources] not_read): the run requirements besides these pins are its wheel's",
                     *recipe.warnings],
        "name": recipe.package, "version": recipe.version, "build_string": recipe.build_string,
        "source": {"path": local_source} if local_source else {"url": recipe.source_url},
        "requirements": requirements(recipe, fmt), "cuda": recipe.cuda, "switch": CUDA_SWITCH[recipe.package],
        "arch_list": recipe.pytorch.arch_list or "", "module": recipe.package, "cache_env": BUILD_VARIABLES,
        "extra": {"torchforge_flavour": "official", "torchforge_settings": recipe.settings,
                  "pytorch": recipe.pytorch.stem},
    }
    jinja = environment()
    name = "meta.yaml" if fmt is RecipeFormat.CONDA_BUILD else "recipe.yaml"
    script = platforms.get(recipe.platform).script  # build.sh, bld.bat
    return {name: jinja.get_template(f"stack/{name}.j2").render(**fields, script_file=script),
            script: jinja.get_template(f"stack/{script}.j2").render(**fields)}


def planned_recipe(recipe: StackRecipe, fmt: RecipeFormat, channels: tuple[str, ...],
                   local_source: str | None = None) -> PlannedRecipe:
    """What the pipeline builds: after the recipe of its pytorch package (where the plan makes it), in that
    package's channels (the output channel, where the pinned pytorch file is, comes first through the pipeline);
    from `local_source` or --with-source's tree where one is given."""
    local = local_source or (recipe.source.path if recipe.source is not None else None)
    platform = recipe.platform.replace("-", "_")
    return PlannedRecipe(recipe.id, recipe.platform, (recipe.stem,), recipe.settings,
                         recipe_files(recipe, fmt, local), channels, recipe.cuda or "cpu", local,
                         kind=recipe.package,
                         needs=recipe.needs, python=recipe.python, script_env=(JOBS_VARIABLE,),
                         cache_script_env=BUILD_VARIABLES, cache_group=group_key(*settings_material(
                             f"{recipe.package}-{recipe.version}-{recipe.tag}-{platform}", recipe.settings)),
                         pythons=((recipe.stem, recipe.python),), arch_list=recipe.pytorch.arch_list if recipe.cuda else None)
