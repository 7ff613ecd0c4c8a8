"""The extensions of a request (`--extension SPEC`) as recipes of the request's own plan (issue 33): one per SPEC
and pytorch package of the plan (built or reused), pinned to that package's file (version and build string) and
built after its recipe; where the plan has no pytorch (--magma-only), for the one pytorch of the output channel.

Planning stays cheap, so that `build --dry-run` and `matrix` show them: the name and version come from the SPEC
(NAME==VERSION) or from the archive's PKG-INFO or pyproject.toml (a local sdist, a folder, a git revision). The
sdist download (pip), its requirements (pip, where torch of the pytorch's release is importable: a venv kept in
the user cache) and so the recipe files are resolved when the recipe is first read: when it is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from torchforge.errors import UsageError
from torchforge.extensions.names import check_name, check_one_source_each
from torchforge.extensions.metadata import read_metadata, sdist_identity, static_metadata
from torchforge.extensions.recipe import (KIND, ExtensionInputs, PytorchBuild, extension_recipe,
                                          planned_recipe, settings_of, stem_of)
from torchforge.extensions.sdist import SPEC_HINT, SdistSpec, fetch, parse_spec
from torchforge.extensions.variables import as_flags, check_all_used, for_extension
from torchforge.fileops import atomic_write, sha256_file
from torchforge.havepytorch import in_channel
from torchforge.flavours.base import MachineNeeds, MatrixView, Plan, PlannedRecipe, Request
from torchforge.proc import Command, Runner

# What a setup.py imports while pip reads its metadata, besides torch (the packages' build-system requirements).
METADATA_TOOLS = ("setuptools", "wheel", "packaging", "ninja")
READY = ".torchforge-ready"
RESOLVED_LATER = ("sdist and requirements resolved when it is built (as the sdist states them, else by pip with "
                  "torch {version} importable, isolated)")


def cache_root() -> Path:
    """Where the metadata venvs and downloaded sdists are kept: the user cache ($XDG_CACHE_HOME or ~/.cache)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "torchforge" / "extensions"


def metadata_python(root: Path, torch_version: str, runner: Runner) -> str:
    """A venv under `root` where torch `torch_version` (pip's choice: the CPU wheel where pip's configuration
    offers it) and the usual build tools are importable, created once; its python."""
    venv = root / f"metadata-torch-{torch_version}"
    python = venv / "bin" / "python"
    wanted = "\n".join((f"torch=={torch_version}", *METADATA_TOOLS))
    ready = venv / READY
    if ready.is_file() and ready.read_text() == wanted:
        return str(python)
    runner.run(Command((sys.executable, "-m", "venv", "--clear", str(venv))))
    runner.run(Command((str(python), "-m", "pip", "install", "--quiet", *wanted.split("\n"))))
    atomic_write(ready, wanted)
    return str(python)


@dataclass(frozen=True)
class PlannedSource:
    """What the plan knows of a SPEC before anything is downloaded or run."""

    spec: SdistSpec
    name: str  # conda's form (PEP 503)
    version: str  # normalised (PEP 440)
    sdist: str  # its identity in the settings: NAME==VERSION (an index) or sha256:HEX of the archive


def _planned(text: str, request: Request) -> PlannedSource:
    """A SPEC's planned source: the one the request carries (a stack file's loader planned it), else planned now."""
    for spec, name, version, sdist in request.planned_extensions:
        if spec == text:
            return PlannedSource(parse_spec(text), name, version, sdist)
    return planned_source(parse_spec(text), Runner())


def _normalised(spec: SdistSpec, name: str, version: str) -> tuple[str, str]:
    try:
        return check_name(spec.text, name), str(Version(version))
    except InvalidVersion as exc:
        raise UsageError(f"--extension {spec.text!r}: {version!r} is not a version (PEP 440)", SPEC_HINT) from exc


def planned_source(spec: SdistSpec, runner: Runner) -> PlannedSource:
    """NAME==VERSION is read as it is; a local archive, folder or git revision is packed (a temporary copy) and
    named by its PKG-INFO or pyproject.toml, and identified by its sha256."""
    if spec.kind == "index":
        name, _, version = spec.location.partition("==")
        return PlannedSource(spec, *_normalised(spec, name, version), spec.location)
    with tempfile.TemporaryDirectory(prefix="torchforge-extension-") as tmp:
        archive = fetch(spec, Path(tmp), sys.executable, runner)  # nothing downloaded or run: not an index SPEC
        return PlannedSource(spec, *_normalised(spec, *sdist_identity(archive)), f"sha256:{sha256_file(archive)}")


@dataclass(frozen=True)
class DeferredRecipe(Mapping[str, "str | bytes"]):
    """An extension's recipe folder, resolved when first read (the pipeline writes it just before the build):
    the sdist fetched, its metadata read with pip, the files rendered. A dry run or `matrix` never reads it."""

    source: PlannedSource
    pytorch: PytorchBuild
    arch_list: str
    channels: tuple[str, ...]
    recipe_format: str
    variables: tuple[tuple[str, str], ...] = ()  # the package's own build variables

    def __getitem__(self, key: str) -> str | bytes:
        return _resolved(self)[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_resolved(self))

    def __len__(self) -> int:
        return len(_resolved(self))


@cache
def _resolved(recipe: DeferredRecipe) -> dict[str, str | bytes]:
    return dict(extension_recipe(_inputs(recipe), recipe.recipe_format).files)


def run_requirements(recipe: PlannedRecipe) -> tuple[str, ...] | None:
    """The run requirements an extension's package will record (its sdist fetched and its metadata read, once, as
    its build reads them); None for a recipe that is not an extension's."""
    if not isinstance(recipe.files, DeferredRecipe):
        return None
    return _inputs(recipe.files).requirements(recipe.files.recipe_format)["run"]


@cache
def _inputs(recipe: DeferredRecipe) -> ExtensionInputs:
    source, runner, root = recipe.source, Runner(), cache_root()
    index = source.spec.kind == "index"
    # one folder per SPEC and planned source: a git tag that moved since gets a fresh clone, not the old one
    work = root / "sources" / hashlib.sha256(f"{source.spec.text}\n{source.sdist}".encode()).hexdigest()[:16]
    archive = fetch(source.spec, work, sys.executable, runner)
    if not index and f"sha256:{sha256_file(archive)}" != source.sdist:
        raise UsageError(f"--extension {source.spec.text!r}: the source changed after it was planned",
                         "run the command again")
    # the torch venv only where pip must run the setup.py (it imports torch); not for a sdist that states it
    meta = static_metadata(archive) or read_metadata(archive, metadata_python(root, recipe.pytorch.version, runner),
                                                     runner, work)
    if _normalised(source.spec, meta.name, meta.version) != (source.name, source.version):
        raise UsageError(f"--extension {source.spec.text!r}: the sdist says it is {meta.name} {meta.version}",
                         f"give {meta.name}=={meta.version}")
    return ExtensionInputs(archive, dataclasses.replace(meta, version=source.version), recipe.pytorch,
                           recipe.arch_list, recipe.channels, sdist=source.sdist, variables=recipe.variables)


def _targets(the_plan: Plan, channel: Path | None,
             request_arch_list: str | None) -> tuple[tuple[PlannedRecipe | None, PytorchBuild], ...]:
    """The pytorch packages extensions are built for: the plan's (its recipes' and the one given with --for); where
    it has none (--magma-only), the output channel's one."""
    planned = the_plan.pytorch_builds()
    if planned:
        return planned
    if channel is None:
        raise UsageError("--extension: the request plans no pytorch package to build an extension for",
                         "ask for a pytorch build (--pytorch, --cuda, --py) with it, or name one with --for SPEC")
    subdir = the_plan.recipes[0].subdir if the_plan.recipes else "linux-64"
    return ((None, in_channel(channel, subdir, request_arch_list)),)


def arch_list_for(pytorch: PytorchBuild, request: Request) -> str:
    """The arch list an extension is built for: its pytorch's, resolved on the plan, unless --arch-list overrides
    it; never empty for CUDA (the arch check of its libraries always runs)."""
    if not pytorch.cuda:
        return ""
    chosen = request.arch_list or pytorch.arch_list or ""
    if not chosen:
        raise UsageError(f"--extension: pytorch {pytorch.version} {pytorch.build} has no arch list on the plan",
                         "give --arch-list, e.g. '8.0;9.0'")
    return chosen


def with_extensions(the_plan: Plan, request: Request, recipe_format: str, channel: Path | None = None) -> Plan:
    """The plan with one recipe per --extension SPEC and pytorch package after its recipes (`channel`: the output
    channel, whose pytorch is used where the plan has none)."""
    if not request.extensions:
        check_all_used(request.extension_env, ())
        return the_plan
    sources = [(text, _planned(text, request)) for text in request.extensions]
    check_one_source_each((text, source.name, source.version) for text, source in sources)
    check_all_used(request.extension_env, (source.name for _, source in sources))
    extensions = []
    for maker, pytorch in _targets(the_plan, channel, request.arch_list):
        arch_list = arch_list_for(pytorch, request)
        # a pytorch given with --for: the output channel and --channel, where it is, come first through the pipeline
        channels = maker.channels if maker else () if the_plan.given_pytorch else \
            (channel.resolve().as_uri(),) if channel else ()
        for text, source in sources:
            variables = for_extension(request.extension_env, source.name)
            stem = stem_of(source.name, source.version, pytorch, arch_list, variables=variables)
            files = DeferredRecipe(source, pytorch, arch_list, channels, recipe_format, variables)
            # a CI job builds it with the command of its pytorch's job and this --extension (which reuses that
            # job's packages), and tests it per Python
            flags = ("--extension", text, *as_flags(source.name, variables))
            extensions.append(dataclasses.replace(
                planned_recipe(stem, settings_of(source.name, source.version, source.sdist, pytorch, arch_list,
                                                 variables), pytorch, arch_list, channels, files,
                               (maker.id,) if maker else ()),
                note=f"for pytorch {pytorch.version} {pytorch.build}"
                     + (f", after recipe {maker.id}; " if maker else f" ({pytorch.stem}, of the channel); ")
                     + RESOLVED_LATER.format(version=pytorch.version),
                pythons=((stem, pytorch.python),),
                build_flags=(*maker.build_flags, *flags) if maker and maker.build_flags else
                (*pytorch.for_flags, *flags) if the_plan.given_pytorch == pytorch else ()))
    return dataclasses.replace(the_plan, recipes=(*the_plan.recipes, *extensions),
                               needs=_machine_needs(the_plan.needs, extensions, the_plan.recipes))


def _machine_needs(needs: MachineNeeds, extensions: list[PlannedRecipe],
                   others: tuple[PlannedRecipe, ...]) -> MachineNeeds:
    """A CUDA extension compiles with this machine's toolkit ($CUDA_HOME, its pytorch's CUDA) and compilers,
    whatever the flavour's own recipes use; its libraries are arch-checked. Where no other recipe has a recipe
    folder (a repack, a pytorch of a channel), the plan compiles extensions alone: their measured disk figure."""
    if extensions and not any(recipe.files for recipe in others):
        needs = dataclasses.replace(needs, extensions_only=True)
    cuda = tuple(e.accel for e in extensions if e.accel != "cpu")
    if not cuda:
        return needs
    return dataclasses.replace(needs, toolkit_on_host=True, cuda_versions=tuple(dict.fromkeys((*needs.cuda_versions,
                               *cuda))), arch_checked=needs.arch_checked or any(e.arch_list for e in extensions))


def matrix_rows(the_plan: Plan) -> list[dict[str, object]]:
    """`matrix --json` rows of a plan's extension recipes."""
    rows: list[dict[str, object]] = []
    for recipe in (r for r in the_plan.recipes if r.kind == KIND):
        settings = json.loads(recipe.settings)
        rows.append({"id": recipe.id, "kind": KIND, "package": settings["extension"], "version": settings["version"],
                     "build_string": recipe.stems[0].rsplit("-", 1)[-1], "subdir": recipe.subdir,
                     "python": recipe.python, "cuda": recipe.accel, "arch_list": settings["arch_list"],
                     "pytorch": settings["pytorch"], "sdist": settings["sdist"], "needs": list(recipe.needs),
                     "variables": settings.get("variables", {})})
    return rows


def matrix_cells(rows: list[dict[str, object]], columns: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The table cells of those rows under a flavour's `columns` (the first two: the recipe and what it makes), each
    value under the column of its name (conda-forge's "build number" and "pythons", the official "build string")."""
    def cells(row: dict[str, object]) -> tuple[str, ...]:
        build = str(row["build_string"])
        named = {"build string": build, "build number": build.rsplit("_", 1)[-1], "pythons": str(row["python"]),
                 "notes": f"for pytorch {row['pytorch']}; after {', '.join(map(str, row['needs'])) or 'the channel'}"}
        return (str(row["id"]), f"{KIND} {row['package']}", *(named.get(column, "") for column in columns[2:]))
    return tuple(cells(row) for row in rows)


def with_extension_rows(view: MatrixView, the_plan: Plan) -> MatrixView:
    """`matrix` of a request with --extension: the flavour's rows, then one per extension recipe of its plan."""
    rows = matrix_rows(the_plan)
    return dataclasses.replace(view, rows=(*view.rows, *rows), cells=(*view.cells, *matrix_cells(rows, view.columns)))
