"""The official flavour's plan in the neutral form (flavours/base.py): its RenderPlan (companion metapackages,
magma-cudaXYZ once per CUDA, pytorch per variant) as ordered `PlannedRecipe`s.

Order: the companions first (their recipes install no files and build in seconds), then magma, then pytorch,
whose variants that differ only in Python follow one another (one cache group: the later ones find the compile
cache warm); each pytorch recipe needs its magma.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from torchforge import channels as channel_data
from torchforge import companionsource, fileops
from torchforge.compilecache import group_key, location_key, patch_digests, python_dependent_env
from torchforge.engines import Engine
from torchforge.console import note
from torchforge.errors import UsageError
from torchforge.extensions.plan import with_extensions
from torchforge.flavours.base import MachineNeeds, MatrixView
from torchforge.flavours.base import Plan, PlannedRecipe, PytorchBuild, Request
from torchforge.flavours.official.magmasource import inspect as inspect_magma_source
from torchforge.patchfile import digests
from torchforge.pipeline import BuildSettings, Step, plan_steps
from torchforge.flavours.official.preflight import official_needs
from torchforge.flavours.official import stack as officialstack
from torchforge.flavours.official.wheel import wheel_plan
from torchforge.preflight import host_tools
from torchforge.preflight.table import load_table
from torchforge.flavours.official.recipe import RecipeContext, magma_context, pytorch_context
from torchforge.sourcestate import resolve_source
from torchforge.flavours.official.render import RenderPlan, companion_files, folder_files, plan
from torchforge.templates import RecipeFormat
from torchforge import data as tables
from torchforge.flavours.official.resolve import default_release
from torchforge.flavours.official.bundled import bundled_cudnn, bundled_files
from torchforge.flavours.official.resolved import MagmaPlan, Status, Variant
from torchforge.flavours.official.variant import Options, Selection, parse_env

NAME = "official"


def _channels(variant: Variant) -> tuple[str, ...]:
    """The data's channels of a variant's pytorch package."""
    request = variant.request
    return channel_data.for_pytorch(request.pytorch, request.python, request.accel, request.platform)


def _local_source(context: RecipeContext) -> str | None:
    """A local tree, or a local tarball (file:// URL, e.g. --magma-source): mounted into a container build."""
    location = context.source.location
    if context.source.kind == "path":
        return location
    if location.startswith("file://"):
        return str(fileops.path_of_file_url(location) or location.removeprefix("file://"))
    return None


def context_material(context: RecipeContext, patch_digests: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    """(label, material) of a pytorch or magma recipe for group_key.

    The Python version, the build string and the requirements (which carry Python pins) are left out; the
    source, the recipe's environment (arch list, CMake flags, Jetson and debug settings), the source edits,
    the contents of --patch files and the install command are in. MAX_JOBS is not: it changes no object.
    """
    material: dict[str, object] = {
        "kind": context.kind, "name": context.name, "version": context.version,
        "build_number": context.build_number, "platform": context.platform, "cuda": context.cuda,
        "source": [context.source.kind, location_key(context.source.location), context.source.rev,
                   context.source.sha256],
        "env": [list(pair) for pair in context.env if pair[0] not in python_dependent_env()],
        "source_edits": [repr(edit) for edit in context.source_edits],
        "patches": list(patch_digests),
        "install_command": context.install_command,
        "cmake_options": list(context.cmake_options), "gencode": list(context.gencode),
    }
    accel = f"cu{context.cuda.replace('.', '')}" if context.cuda else "cpu"
    return f"{context.name}-{context.version}-{accel}-{context.platform.replace('-', '_')}", material


def _from_context(kind: str, ident: str, stem: str, context: RecipeContext, channels: tuple[str, ...],
                  fmt: RecipeFormat, patches: tuple[Path, ...], settings: str, *, needs: tuple[str, ...] = (),
                  cudnn: str = "") -> PlannedRecipe:
    index_fields = (("features", " ".join(context.features)),) if context.features else ()
    return PlannedRecipe(
        ident, context.platform, (stem,), settings, folder_files(context, fmt, patches),
        channels, context.cuda or "cpu", _local_source(context), ((stem, index_fields),) if index_fields else (),
        kind=kind, needs=needs, python=context.python, script_env=context.script_env,
        cache_group=group_key(*context_material(context, patch_digests(patches))), cudnn=cudnn)


def _companions(render_plan: RenderPlan, fmt: RecipeFormat, rendered: bool = False) -> list[PlannedRecipe]:
    """pytorch-mutex, cpuonly, pytorch-cuda where the channels lack them. They get the pytorch packages' channels
    all the same: conda-build installs every package it built into a test environment, and pytorch-cuda's run
    requirements (cuda-cudart, libcublas ...) come from those channels."""
    channels = tuple(dict.fromkeys(url for variant in render_plan.variants for url in _channels(variant)))
    planned = []
    for companion in render_plan.companions:
        fields = (("track_features", " ".join(companion.track_features)),) if companion.track_features else ()
        planned.append(PlannedRecipe(
            companion.id, companion.subdir, (companion.filename_stem,), "", companion_files(companion, fmt), channels,
            index_fields=((companion.filename_stem, fields),) if fields else (), kind="companion", rendered=rendered))
    return planned


def _stack_recipes(render_plan: RenderPlan, request: Request) -> list[tuple[Variant, officialstack.StackRecipe]]:
    """--with: one torchvision / torchaudio recipe per pytorch variant (a variant the plan refuses has none), each
    with the variant it is built against."""
    officialstack.check_names(request.with_packages)
    sources = companionsource.sources(request.with_sources, request.with_packages)
    return [(variant, officialstack.plan(name, pytorch_build(variant), (variant.id,), sources.get(name)))
            for variant in render_plan.variants if variant.status is not Status.REFUSED
            for name in request.with_packages]


def _stack(pairs: list[tuple[Variant, officialstack.StackRecipe]], fmt: RecipeFormat,
           magma_source: str | None) -> list[PlannedRecipe]:
    """--with's recipes, each built after the recipe of its pytorch variant, in that variant's channels; a CI job
    builds one with its variant's command and `--with NAME` (which reuses that variant's packages)."""
    return [dataclasses.replace(officialstack.planned_recipe(recipe, fmt, _channels(variant)),
                                build_flags=(*_pytorch_flags(variant, magma_source), "--with", recipe.package,
                                             *companionsource.flags(recipe.source)))
            for variant, recipe in pairs]


def pytorch_build(variant: Variant) -> PytorchBuild:
    """The pytorch package a variant makes, with its resolved arch list (CUDA) for its companions and extensions."""
    request = variant.request
    cuda = request.accel if request.is_cuda else None
    return PytorchBuild(request.pytorch, variant.build_string or "", request.platform, request.python, cuda,
                        variant.arch_list if cuda else None)


def _copied_libraries(variant: Variant) -> tuple[str, ...]:
    """The libraries the variant's build copies from this machine into torch/lib (cuDNN, NCCL ...): the arch check
    of its package leaves them out, torchforge did not compile them."""
    request = variant.request
    cuda = request.accel if request.is_cuda and variant.jetson is None else None
    return tuple(file.name for file in bundled_files(tables.load(), request, cuda))


def _magma_flags(magma: MagmaPlan, variant: Variant, magma_source: str | None) -> tuple[str, ...]:
    """`torchforge build` of exactly this magma package: --pytorch picks the MAGMA release the PyTorch release was
    built with; --arch-list changes its gencode and build string, and the pytorch jobs need exactly this package."""
    request = variant.request
    return ("--magma-only", "--pytorch", request.pytorch, "--cuda", magma.cuda, "--platform", request.platform,
            *(("--arch-list", request.options.arch_list) if request.options.arch_list else ()),
            *(("--magma-source", magma_source) if magma_source else ()))


def _pytorch_flags(variant: Variant, magma_source: str | None) -> tuple[str, ...]:
    """`torchforge build` of exactly this variant: the selection flags that made it, one value each (a source
    path as given: relative to the repository root, a CI job reads it from its checkout)."""
    request = variant.request
    options = request.options
    return ("--pytorch", request.pytorch, "--cuda", request.accel, "--py", request.python,
            "--platform", request.platform,
            *(("--arch-list", options.arch_list) if options.arch_list else ()),
            *(("--build-number", str(options.build_number)) if options.build_number else ()),
            *(("--debug",) if options.debug else ()), *(("--jetson", options.jetson) if options.jetson else ()),
            *(arg for name, value in options.extra_env for arg in ("--env", f"{name}={value}")),
            *(("--source", options.source) if options.source else ()),
            *(("--magma-source", magma_source) if magma_source and variant.magma is not None else ()))


def plan_of(render_plan: RenderPlan, fmt: RecipeFormat, *, patches: tuple[Path, ...] = (),
            magma_patches: tuple[Path, ...] = (), magma_only: bool = False, magma_source: str | None = None,
            request: Request | None = None, render_companions: bool = False) -> Plan:
    """The official flavour's recipes of a (buildable) RenderPlan, in build order, --with's after pytorch's
    (`magma_source`: the --magma-source as given, which the recipes' build flags repeat; `render_companions`:
    --companions, `render` writes the companion recipes too), with each variant's and magma's warnings."""
    render_plan.require_buildable()
    recipes = [] if magma_only else _companions(render_plan, fmt, render_companions)
    pytorch_version = render_plan.variants[0].request.pytorch if render_plan.variants else ""
    for magma in render_plan.magma:
        context = magma_context(magma, tuple(p.name for p in magma_patches))
        first = next(v for v in render_plan.variants if v.magma is not None and v.magma.id == magma.id)
        recipes.append(dataclasses.replace(
            _from_context("magma", magma.id, magma.filename_stem, context,
                          channel_data.for_magma(magma.cuda, pytorch_version), fmt, magma_patches, magma.settings),
            build_flags=_magma_flags(magma, first, magma_source)))
    if not magma_only:
        groups: dict[str, list[tuple[Variant, RecipeContext]]] = {}
        digests = patch_digests(patches)
        for variant in render_plan.variants:
            context = pytorch_context(variant, tuple(p.name for p in patches))
            groups.setdefault(group_key(*context_material(context, digests)), []).append((variant, context))
        for variant, context in (pair for members in groups.values() for pair in members):
            built = pytorch_build(variant)
            recipes.append(dataclasses.replace(_from_context(
                "pytorch", variant.id, variant.filename_stem, context, _channels(variant), fmt, patches,
                variant.settings, needs=(variant.magma.id,) if variant.magma else (), cudnn=bundled_cudnn(variant)),
                pythons=((variant.filename_stem, variant.request.python),), pytorch=(built,),
                arch_list=built.arch_list, arch_exempt=_copied_libraries(variant) if built.cuda else (),
                build_flags=_pytorch_flags(variant, magma_source)))
    pairs = [] if magma_only or request is None else _stack_recipes(render_plan, request)
    stack = _stack(pairs, fmt, magma_source)
    # doctor's first row, as the official preflight words it (a refused variant never gets here: it is refused above)
    selection = f"{len(render_plan.variants)} variant(s), {len(render_plan.magma)} magma package(s)"
    with_row = (("--with", ", ".join(f"{s.stems[0]} (pytorch {json.loads(s.settings)['pytorch']})" for s in stack)),) \
        if stack else ()
    needs = official_needs(render_plan.variants, magma_only=magma_only)
    variants = () if magma_only else render_plan.variants  # --magma-only builds no pytorch
    warnings = (*(f"{v.id}: {message}" for v in variants for message in v.warnings),
                *(f"{m.id}: {message}" for m in render_plan.magma for message in m.warnings),
                *(f"{r.id}: {message}" for _, r in pairs for message in r.warnings))
    return Plan(NAME, (*recipes, *stack), warnings,
                needs=dataclasses.replace(needs, arch_checked=any(r.arch_list for r in (*recipes, *stack))),
                facts=(("selection", selection), *with_row), conda_forge_packages=False)


def official_steps(render_plan: RenderPlan, engine: Engine, settings: BuildSettings,
                   request: Request | None = None) -> list[Step]:
    """The official flavour's steps of a RenderPlan, with the patches and --magma-only of `settings` (and the
    companions and extensions of `request`: --with, for the plan's pytorch packages; --extension, for those or,
    where it has none, the output channel's)."""
    the_plan = plan_of(render_plan, engine.recipe_format, patches=settings.patches,
                       magma_patches=settings.magma_patches, magma_only=settings.magma_only, request=request)
    if request is not None:
        the_plan = with_extensions(the_plan, request, engine.recipe_format.value, channel=settings.out)
    return plan_steps(the_plan, settings)


def selection_of(request: Request) -> Selection:
    """The Selection of a request: the shared flags and the official flavour's own (--debug, --jetson, --env,
    --gcc, --magma-source, --magma-patch); without --pytorch, the release is chosen and the reason noted."""
    flags = dict(request.flavour_flags)
    magma_source = flags.get("--magma-source")
    if magma_source is not None and not str(magma_source).strip():  # '' would otherwise mean "the release tarball"
        raise UsageError("--magma-source is empty", "give a MAGMA tree, tarball or URL, or leave --magma-source out")
    options = Options(
        arch_list=request.arch_list,
        build_number=request.build_number,
        debug=bool(flags.get("--debug")),
        jetson=flags.get("--jetson"),  # type: ignore[arg-type]
        extra_env=parse_env(list(flags.get("--env") or ())),  # type: ignore[call-overload]
        gcc=flags.get("--gcc"),  # type: ignore[arg-type]
        source=request.source,
        magma_source=inspect_magma_source(str(magma_source)) if magma_source else None,
        patch_digests=digests(request.patches),
        magma_patch_digests=digests(tuple(flags.get("--magma-patch") or ())),  # type: ignore[call-overload]
    )
    selection = Selection.from_flags(request.pytorch, request.cuda, request.python, request.platform, options)
    if request.pytorch is None:
        # Say which release and why before anything else is printed.
        version, reason = default_release(selection)
        note(reason)
        selection = dataclasses.replace(selection, pytorch=version)
    return selection


class OfficialFlavour:
    """The pytorch channel's shape (up to 2.5, and torchforge's hybrid for 2.6+): companions, magma-cudaXYZ once
    per CUDA, pytorch per variant, each its own recipe folder."""

    name = NAME

    def build_refusal(self, request: Request) -> tuple[str, str] | None:
        return None  # a refused variant is refused by the plan itself (RenderPlan.require_buildable: exit 4)

    def matrix(self, request: Request) -> MatrixView:
        render_plan = plan(selection_of(request))
        stack = [recipe for _, recipe in _stack_recipes(render_plan, request)]
        return MatrixView(tuple(matrix_rows(render_plan) + stack_rows(stack)), "torchforge variants (flavour official)",
                          ("variant", "status", "build string", "magma package", "notes"),
                          (*(_variant_cells(v) for v in render_plan.variants), *(_stack_cells(r) for r in stack)),
                          bool(render_plan.refused))

    def plan(self, request: Request, recipe_format: str) -> Plan:
        _refuse_feedstock_patches(request)
        flags = dict(request.flavour_flags)
        magma_source, magma_only = flags.get("--magma-source"), bool(flags.get("--magma-only"))
        render_plan = plan(selection_of(request))
        # build.sh (and pip) take this machine's tools; the pytorch source is cloned unless --source names a local one
        clones = not magma_only and resolve_source(request.source, "", "").kind == "git"
        machine = {"sources": (request.source,) if request.source and not magma_only else (),
                   "host_tools": host_tools(load_table(), clones=clones)}
        if flags.get("--format wheel"):  # pip installs no requirement: nothing is solved from a channel
            needs = dataclasses.replace(official_needs(render_plan.variants), solves=(), **machine)
            return wheel_plan(NAME, render_plan, request, needs, magma_only)
        planned = plan_of(render_plan, RecipeFormat(recipe_format), patches=request.patches,
                          magma_patches=tuple(flags.get("--magma-patch") or ()),  # type: ignore[call-overload]
                          magma_only=magma_only, magma_source=str(magma_source) if magma_source else None,
                          request=request, render_companions=bool(flags.get("--companions")))
        return dataclasses.replace(planned, needs=dataclasses.replace(planned.needs, **machine))

    def plan_for(self, pytorch: PytorchBuild, request: Request, recipe_format: str) -> Plan:
        """A pytorch a channel has: no recipe of this flavour's own (its extensions come after, from the plan);
        --with's torchvision and torchaudio in the pytorch channel's shape, pinned to that file (with
        pytorch-mutex only where that pytorch requires it: officialstack)."""
        officialstack.check_names(request.with_packages)
        sources = companionsource.sources(request.with_sources, request.with_packages)
        fmt = RecipeFormat(recipe_format)
        channels = channel_data.for_pytorch(pytorch.version, pytorch.python, pytorch.cuda or "cpu", pytorch.subdir)
        stack = [officialstack.plan(name, pytorch, source=sources.get(name)) for name in request.with_packages]
        recipes = tuple(dataclasses.replace(
            officialstack.planned_recipe(recipe, fmt, channels), note=f"for {pytorch.stem}, of the channel",
            build_flags=(*pytorch.for_flags, "--flavour", NAME, "--with", recipe.package,
                         *companionsource.flags(recipe.source))) for recipe in stack)
        needs = MachineNeeds(cuda_versions=(pytorch.cuda,) if pytorch.cuda else (), platforms=(pytorch.subdir,),
                             arch_lists=(pytorch.arch_list,) if pytorch.arch_list else (), host_tools=(),
                             channels=tuple((pytorch.subdir, url) for url in channels) if stack else (),
                             toolkit_on_host=bool(pytorch.cuda and stack), arch_checked=bool(pytorch.cuda and stack))
        warnings = tuple(f"{recipe.id}: {message}" for recipe in stack for message in recipe.warnings)
        return Plan(NAME, recipes, warnings, needs=needs, given_pytorch=pytorch)


STATUS_STYLE = {Status.OFFICIAL: "green", Status.BUILDABLE: "yellow", Status.REFUSED: "red"}


def _variant_cells(variant: Variant) -> tuple[str, ...]:
    notes = "; ".join(variant.refusals) if variant.refusals else f"{len(variant.warnings)} warning(s)" if variant.warnings else ""
    return (variant.id, f"[{STATUS_STYLE[variant.status]}]{variant.status.value}[/]", variant.build_string or "-",
            f"{variant.magma.name}-{variant.magma.version}-{variant.magma.build_string}" if variant.magma else "-",
            notes)


def matrix_rows(render_plan: RenderPlan) -> list[dict[str, object]]:
    """`matrix --json` of the official flavour: magma, companions, then every variant with its status."""
    rows: list[dict[str, object]] = []
    for magma in render_plan.magma:
        rows.append({
            "id": magma.id, "package": magma.name, "status": magma.status.value, "version": magma.version,
            "build_string": magma.build_string, "cuda": magma.cuda, "gencode": list(magma.gencode),
            "warnings": list(magma.warnings),
        })
    for companion in render_plan.companions:
        rows.append({
            "id": companion.id, "package": companion.name, "version": companion.version,
            "status": (Status.OFFICIAL if companion.official else Status.BUILDABLE).value,
            "build_string": companion.build_string, "subdir": companion.subdir, "run": list(companion.run),
            "warnings": list(companion.warnings),
        })
    for variant in render_plan.variants:
        request = variant.request
        rows.append({
            "id": variant.id, "package": "pytorch", "status": variant.status.value, "version": request.pytorch,
            "build_string": variant.build_string, "cuda": request.accel, "python": request.python,
            "platform": request.platform, "arch_list": variant.arch_list, "cudnn": variant.cudnn,
            "magma": variant.magma.name if variant.magma else None, "jetson": variant.jetson,
            "refusals": list(variant.refusals), "warnings": list(variant.warnings),
        })
    return rows


def stack_rows(stack: list[officialstack.StackRecipe]) -> list[dict[str, object]]:
    """`matrix --json` rows of --with: each package file and the pytorch file it is built against."""
    return [{"id": r.id, "package": r.package, "status": Status.BUILDABLE.value, "version": r.version,
             "build_string": r.build_string, "file": r.stem, "pytorch": r.pytorch.stem,
             "cuda": r.pytorch.accel, "python": r.python, "platform": r.platform,
             "arch_list": r.pytorch.arch_list if r.cuda else None} for r in stack]


def _stack_cells(recipe: officialstack.StackRecipe) -> tuple[str, ...]:
    return (recipe.id, f"[{STATUS_STYLE[Status.BUILDABLE]}]{Status.BUILDABLE.value}[/]", recipe.build_string, "-",
            f"built against {recipe.pytorch.stem}")


FLAVOUR = OfficialFlavour()


def _refuse_feedstock_patches(request: Request) -> None:
    if request.feedstock_patches:
        raise UsageError("--feedstock-patches applies to --flavour conda-forge only",
                         "add --flavour conda-forge, or leave --feedstock-patches out")
