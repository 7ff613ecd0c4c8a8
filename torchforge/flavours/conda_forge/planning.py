"""The conda-forge flavour as a plug-in: a `Request` in, the neutral `Plan` out (flavours/base.py).

The library half of what the CLI did for the flavour: read the shared flags, refuse the official flavour's own, plan one
recipe per CUDA (and cpu), put what they are built from into their settings, render each folder for the engine
and say what the machine checks need (its channel, the CUDA versions, the source).
"""

from __future__ import annotations

import dataclasses
import json

from torchforge import data as tables
from torchforge import companionsource, sourcestate
from torchforge.errors import UsageError
from torchforge.flavours import conda_forge
from torchforge.compilecache import BUILD_VARIABLES, group_key, settings_material
from torchforge.patchfile import digests
from torchforge.flavours.base import (JOBS_VARIABLE, OVERRIDE_CUDA, STACK_PACKAGES, MachineNeeds, MatrixView, Plan,
                                      PlannedRecipe, PytorchBuild, Request)
from torchforge.sourcestate import Source, resolve_source
from torchforge.templates import RecipeFormat, patch_files
from torchforge.sharedflags import check_build_number, check_shared_flags

NAME = "conda-forge"
WINDOWS_NOT_BUILT = (
    "torchforge does not build win-64 recipes of the conda-forge flavour (it builds on linux)",
    "render them with `torchforge render --flavour conda-forge --platform win-64 ...` and run "
    "`conda build FOLDER -c conda-forge --override-channels` on a Windows machine with Visual Studio")


def _refuse_official_flags(request: Request) -> None:
    given = [flag for flag, value in request.flavour_flags if value]
    if given:
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --flavour official only",
                         "leave it out with --flavour conda-forge, or use --flavour official")


def recipes(request: Request) -> tuple[conda_forge.CondaForgeRecipe, ...]:
    """The recipes a request asks for; a release up to 2.5 is told to use the official flavour, and a flag of
    the official flavour's (`request.flavour_flags`) is refused rather than ignored."""
    from torchforge.flavours import Flavour, check

    _refuse_official_flags(request)
    flags = check_shared_flags(request.pytorch, request.cuda, request.python, request.platform, request.arch_list,
                               request.build_number)
    if request.pytorch:
        check(Flavour.CONDA_FORGE, request.pytorch)
    planned = conda_forge.plan_selection(request.pytorch, request.cuda, request.python, request.platform,
                                         flags.arch_list, request.build_number)
    for recipe in planned:  # the engines read the package's number: the feedstock's and the offsets come on top
        check_build_number(request.build_number, offset=recipe.build_number - request.build_number,
                           why_offset=f"{recipe.id}: the feedstock's build number and conda-forge's CUDA and MKL "
                                      "offsets")
    return planned


def source_of(recipe: conda_forge.CondaForgeRecipe, request: Request) -> Source:
    where = resolve_source(request.source, tables.load().pytorch.defaults.source_url, f"v{recipe.version}")
    return dataclasses.replace(where, patches=tuple(p.name for p in request.patches))


def folder(recipe: conda_forge.CondaForgeRecipe, request: Request, fmt: RecipeFormat) -> dict[str, str | bytes]:
    files = conda_forge.recipe_files(recipe, source_of(recipe, request), feedstock_patches=request.feedstock_patches,
                                     recipe_format=fmt)
    return {**files, **patch_files(list(request.patches))}


def with_inputs(planned: tuple[conda_forge.CondaForgeRecipe, ...],
                request: Request) -> tuple[conda_forge.CondaForgeRecipe, ...]:
    """The recipes with what they are built from in their settings (and so in their build strings)."""
    identity = sourcestate.identity(request.source) if request.source else None
    return tuple(conda_forge.with_inputs(r, identity, digests(request.patches), request.feedstock_patches)
                 for r in planned)


def warnings(planned: tuple[conda_forge.CondaForgeRecipe, ...], feedstock_patches: bool) -> tuple[str, ...]:
    return tuple(f"{r.id}: {message}" for r in planned for message in r.warnings_for(feedstock_patches))


def needs(planned: tuple[conda_forge.CondaForgeRecipe, ...], request: Request) -> MachineNeeds:
    """What the machine must have: conda-forge's channel per platform, the source; the CUDA toolkit and the
    compilers are conda-forge's packages in the build environment (cuda-nvcc), not this machine's."""
    channel = conda_forge.load().flavour.channel
    return MachineNeeds(
        cuda_versions=tuple(dict.fromkeys(r.cuda for r in planned if r.cuda)),
        platforms=tuple(dict.fromkeys(r.platform for r in planned)),
        arch_lists=tuple(dict.fromkeys(r.arch_list for r in planned if r.arch_list)),
        sources=(request.source,) if request.source else (),
        channels=tuple(dict.fromkeys((r.platform, channel) for r in planned)),
        toolkit_on_host=False)


def facts(planned: tuple[conda_forge.CondaForgeRecipe, ...]) -> tuple[tuple[str, str], ...]:
    """The flavour's own rows of `doctor`: its recipes, its one channel, its magma, and Windows' build note."""
    table = conda_forge.load().flavour
    rows = [("flavour", f"conda-forge: {len(planned)} recipe(s), " + ", ".join(r.id for r in planned)),
            ("channel", f"{table.channel} (every requirement; no pytorch, nvidia or defaults channel, no companion "
                        "packages; the site config's replacements apply)"),
            ("magma", table.magma)]
    windows = [r for r in planned if r.platform == conda_forge.WINDOWS]
    if windows:  # torchforge renders them anywhere; conda-build builds them on Windows only
        rows.append((conda_forge.WINDOWS, "; ".join(
            f"{r.id}: {conda_forge.windows_build_note(dict(r.variant_config)['c_compiler'][0])}" for r in windows)))
    return tuple(rows)


# The engine that comes with torchforge: a CI job builds the same way whether its image has conda-build or not
# (`--engine auto` would take an image's conda-build, which reads the other recipe format).
BUILT_WITH = ("--engine", "rattler-build")


def build_flags(recipe: conda_forge.CondaForgeRecipe, request: Request) -> tuple[str, ...]:
    """`torchforge build` of exactly this recipe folder: its CUDA, all its Pythons, one engine run (the request's
    --arch-list, --build-number and --source as given)."""
    pythons = dict.fromkeys(p.python for p in recipe.planned_outputs() if p.python)
    return ("--pytorch", recipe.version, "--cuda", recipe.cuda or "cpu", "--py", ",".join(pythons),
            "--platform", recipe.platform, *BUILT_WITH,
            *(("--arch-list", request.arch_list) if request.arch_list else ()),
            *(("--build-number", str(request.build_number)) if request.build_number else ()),
            *(("--source", request.source) if request.source else ()))


def planned_recipe(recipe: conda_forge.CondaForgeRecipe, request: Request, fmt: RecipeFormat) -> PlannedRecipe:
    where = source_of(recipe, request)
    # Their run requirements name __cuda: the engine's test environment must solve on a build machine without a
    # driver (a CPU runner), as on conda-forge's CI; a value of the user's own is kept. The job count reaches
    # build.sh as MAX_JOBS. One build of several packages: its own cache group, which a rebuild of the same
    # settings finds warm.
    return PlannedRecipe(
        recipe.id, recipe.platform, tuple(p.stem for p in recipe.planned_outputs()), recipe.settings,
        folder(recipe, request, fmt), (conda_forge.load().flavour.channel,), recipe.cuda or "cpu",
        where.location if where.kind == "path" else None, recipe.index_fields(),
        script_env=(OVERRIDE_CUDA, JOBS_VARIABLE) if recipe.cuda else (JOBS_VARIABLE,),
        cache_script_env=BUILD_VARIABLES, cache_group=group_key(*settings_material(recipe.id, recipe.settings)),
        pythons=tuple((p.stem, p.python) for p in recipe.planned_outputs() if p.python),
        build_flags=build_flags(recipe, request), pytorch=pytorch_builds(recipe),
        arch_list=recipe.arch_list if recipe.cuda else None)


def pytorch_builds(recipe: conda_forge.CondaForgeRecipe) -> tuple[PytorchBuild, ...]:
    """The recipe's pytorch packages (one per Python), each with the recipe's arch list (CUDA)."""
    return tuple(PytorchBuild(o.version, o.build_string, o.subdir, o.python, recipe.cuda,
                              recipe.arch_list if recipe.cuda else None)
                 for o in recipe.planned_outputs() if o.name == "pytorch" and o.python)



def check_companions(names: tuple[str, ...]) -> None:
    """--with names only what this flavour builds after pytorch; an unknown name is a usage error."""
    unknown = [name for name in names if name not in STACK_PACKAGES]
    if unknown:
        raise UsageError(f"--with names {', '.join(map(repr, unknown))}, which torchforge does not build",
                         f"--with takes {', '.join(STACK_PACKAGES)} (comma-separated)")


def companion_recipes(planned: tuple[conda_forge.CondaForgeRecipe, ...], request: Request,
                      fmt: RecipeFormat) -> tuple[PlannedRecipe, ...]:
    """--with: one recipe per pytorch package of `planned` (with their inputs) and companion, pinned to that
    exact file and built after the recipe that makes it."""
    from torchforge.flavours.conda_forge import stack

    check_companions(request.with_packages)
    sources = companionsource.sources(request.with_sources, request.with_packages)
    channel = conda_forge.load().flavour.channel
    found: list[PlannedRecipe] = []
    for recipe in planned:
        for build in pytorch_builds(recipe):
            for name in request.with_packages:
                companion = stack.plan(name, build, source=sources.get(name))
                # one CI job per package and folder: the folder's build with --with NAME builds it for every Python
                found.append(dataclasses.replace(
                    stack.planned_recipe(companion, fmt, channel), kind=name, needs=(recipe.id,),
                    pythons=((companion.stem, build.python),),
                    build_flags=(*build_flags(recipe, request), "--with", name,
                                 *companionsource.flags(companion.source))))
    return tuple(found)


def companion_rows(planned: tuple[PlannedRecipe, ...]) -> list[dict[str, object]]:
    """`matrix --json` rows of the --with recipes."""
    return [{"id": p.id, "flavour": NAME, "platform": p.subdir, "cuda": p.accel, "arch_list": p.arch_list,
             "packages": list(p.stems), "pytorch": json.loads(p.settings)["pytorch"],
             "outputs": {p.kind: p.stems[0].rsplit("-", 1)[-1]}, "build_number": json.loads(p.settings)["build_number"],
             "pythons": [python for _, python in p.pythons],
             "magma": None, "channel": p.channels[0], "warnings": []} for p in planned]


def matrix_rows(request: Request) -> list[dict[str, object]]:
    """`matrix --json`: one row per recipe, every output's build string (Python as XY) and planned package."""
    channel = conda_forge.load().flavour.channel
    return [{
        "id": r.id, "flavour": NAME, "version": r.version, "platform": r.platform, "cuda": r.cuda or "cpu",
        "arch_list": r.arch_list, "blas": r.blas, "pythons": list(r.pythons), "build_number": r.build_number,
        "outputs": {o.name: o.build_string_with("XY") for o in r.outputs},
        "packages": [p.stem for p in r.planned_outputs()], "feedstock": r.feedstock_commit,
        "channel": channel, "magma": r.magma,
        "feedstock_patches": len(r.feedstock_patches), "warnings": list(r.warnings_for(False)),
    } for r in recipes(request)] + companion_rows(
        companion_recipes(with_inputs(recipes(request), request), request, RecipeFormat.RATTLER_BUILD))


def _recipe_cells(row: dict[str, object]) -> tuple[str, ...]:
    outputs = dict(row["outputs"])  # type: ignore[call-overload]
    warnings = list(row["warnings"])  # type: ignore[call-overload]
    return (str(row["id"]), ", ".join(f"{name} ({build})" for name, build in outputs.items()),
            str(row["build_number"]), ",".join(row["pythons"]),  # type: ignore[arg-type]
            str(row["magma"] or "-"), f"{len(warnings)} warning(s)")


class CondaForgeFlavour:
    """conda-forge's shape of a 2.6+ release: one recipe folder per CUDA (and cpu) with libtorch, pytorch per
    Python and the metapackage as outputs of one engine run."""

    name = NAME

    def build_refusal(self, request: Request) -> tuple[str, str] | None:
        return WINDOWS_NOT_BUILT if request.platform == conda_forge.WINDOWS else None

    def matrix(self, request: Request) -> MatrixView:
        rows = matrix_rows(request)
        channels = ", ".join(dict.fromkeys(str(row["channel"]) for row in rows))
        return MatrixView(tuple(rows), f"torchforge recipes, flavour {NAME} (channel {channels})",
                          ("recipe", "outputs", "build number", "pythons", f"magma ({NAME})", "notes"),
                          tuple(_recipe_cells(row) for row in rows))

    def plan(self, request: Request, recipe_format: str) -> Plan:
        planned = with_inputs(recipes(request), request)
        fmt = RecipeFormat(recipe_format)
        companions = companion_recipes(planned, request, fmt)
        machine = dataclasses.replace(needs(planned, request), arch_checked=any(r.cuda for r in planned))
        with_rows = (("--with", ", ".join(f"{c.stems[0]} (pytorch {json.loads(c.settings)['pytorch']})"
                                          for c in companions)),) if companions else ()
        return Plan(NAME, (*(planned_recipe(r, request, fmt) for r in planned), *companions),
                    warnings(planned, request.feedstock_patches), machine, (*facts(planned), *with_rows))


    def plan_for(self, pytorch: PytorchBuild, request: Request, recipe_format: str) -> Plan:
        """--with for a pytorch a channel has: conda-forge's companion recipes pinned to that file (where its
        libtorch is inside it, a repacked wheel, the pin stands for the feedstock's libtorch too: stack.py)."""
        from torchforge.flavours.conda_forge import stack

        check_companions(request.with_packages)
        sources = companionsource.sources(request.with_sources, request.with_packages)
        channel = conda_forge.load().flavour.channel
        companions = []
        for name in request.with_packages:
            companion = stack.plan(name, pytorch, source=sources.get(name))
            companions.append(dataclasses.replace(
                stack.planned_recipe(companion, RecipeFormat(recipe_format), channel), kind=name,
                pythons=((companion.stem, pytorch.python),), note=f"for {pytorch.stem}, of the channel",
                build_flags=(*BUILT_WITH, *pytorch.for_flags, "--flavour", NAME, "--with", name,
                             *companionsource.flags(companion.source))))
        needs = MachineNeeds(cuda_versions=(pytorch.cuda,) if pytorch.cuda else (), platforms=(pytorch.subdir,),
                             arch_lists=(pytorch.arch_list,) if pytorch.arch_list else (),
                             channels=((pytorch.subdir, channel),), toolkit_on_host=False,
                             arch_checked=bool(pytorch.cuda))
        return Plan(NAME, tuple(companions), needs=needs, given_pytorch=pytorch)


FLAVOUR = CondaForgeFlavour()
