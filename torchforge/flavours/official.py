"""The official flavour's plan in the neutral form (flavours/base.py): its RenderPlan (companion metapackages,
magma-cudaXYZ once per CUDA, pytorch per variant) as ordered `PlannedRecipe`s.

Order: the companions first (their recipes install no files and build in seconds), then magma, then pytorch,
whose variants that differ only in Python follow one another (one cache group: the later ones find the compile
cache warm); each pytorch recipe needs its magma.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchforge import channels as channel_data
from torchforge import fileops
from torchforge.compilecache import group_key, patch_digests
from torchforge.engines import Engine
from torchforge.console import note
from torchforge.errors import UsageError
from torchforge.flavours.base import MachineNeeds, Plan, PlannedRecipe, Request
from torchforge.magmasource import inspect as inspect_magma_source
from torchforge.patchfile import digests
from torchforge.pipeline import BuildSettings, Step, plan_steps
from torchforge.recipe import RecipeContext, magma_context, pytorch_context
from torchforge.render import RecipeFormat, RenderPlan, companion_files, patch_files, plan, render_files
from torchforge.resolve import Status, Variant, bundled_cudnn, default_release
from torchforge.variant import Options, Selection, parse_env

NAME = "official"


def _local_source(context: RecipeContext) -> str | None:
    """A local tree, or a local tarball (file:// URL, e.g. --magma-source): mounted into a container build."""
    location = context.source.location
    if context.source.kind == "path":
        return location
    if location.startswith("file://"):
        return str(fileops.path_of_file_url(location) or location.removeprefix("file://"))
    return None


def _from_context(kind: str, ident: str, stem: str, context: RecipeContext, channels: tuple[str, ...],
                  fmt: RecipeFormat, patches: tuple[Path, ...], settings: str, *, needs: tuple[str, ...] = (),
                  cudnn: str = "") -> PlannedRecipe:
    index_fields = (("features", " ".join(context.features)),) if context.features else ()
    return PlannedRecipe(
        ident, context.platform, (stem,), settings, {**render_files(context, fmt), **patch_files(list(patches))},
        channels, context.cuda or "cpu", _local_source(context), ((stem, index_fields),) if index_fields else (),
        kind=kind, needs=needs, python=context.python, script_env=context.script_env,
        cache_group=group_key(context, patch_digests(patches)), cudnn=cudnn)


def _companions(render_plan: RenderPlan, fmt: RecipeFormat) -> list[PlannedRecipe]:
    """pytorch-mutex, cpuonly, pytorch-cuda where the channels lack them. They get the pytorch packages' channels
    all the same: conda-build installs every package it built into a test environment, and pytorch-cuda's run
    requirements (cuda-cudart, libcublas ...) come from those channels."""
    channels = tuple(dict.fromkeys(url for variant in render_plan.variants for url in channel_data.for_variant(variant)))
    planned = []
    for companion in render_plan.companions:
        fields = (("track_features", " ".join(companion.track_features)),) if companion.track_features else ()
        planned.append(PlannedRecipe(
            companion.id, companion.subdir, (companion.filename_stem,), "", companion_files(companion, fmt), channels,
            index_fields=((companion.filename_stem, fields),) if fields else (), kind="companion"))
    return planned


def plan_of(render_plan: RenderPlan, fmt: RecipeFormat, *, patches: tuple[Path, ...] = (),
            magma_patches: tuple[Path, ...] = (), magma_only: bool = False) -> Plan:
    """The official flavour's recipes of a (buildable) RenderPlan, in build order."""
    render_plan.require_buildable()
    recipes = [] if magma_only else _companions(render_plan, fmt)
    pytorch_version = render_plan.variants[0].request.pytorch if render_plan.variants else ""
    for magma in render_plan.magma:
        context = magma_context(magma, tuple(p.name for p in magma_patches))
        recipes.append(_from_context("magma", magma.id, magma.filename_stem, context,
                                     channel_data.for_magma(magma, pytorch_version), fmt, magma_patches, magma.settings))
    if not magma_only:
        groups: dict[str, list[tuple[Variant, RecipeContext]]] = {}
        digests = patch_digests(patches)
        for variant in render_plan.variants:
            context = pytorch_context(variant, tuple(p.name for p in patches))
            groups.setdefault(group_key(context, digests), []).append((variant, context))
        for variant, context in (pair for members in groups.values() for pair in members):
            recipes.append(_from_context(
                "pytorch", variant.id, variant.filename_stem, context, channel_data.for_variant(variant), fmt, patches,
                variant.settings, needs=(variant.magma.id,) if variant.magma else (), cudnn=bundled_cudnn(variant)))
    needs = MachineNeeds(
        cuda_versions=tuple(dict.fromkeys(v.request.accel for v in render_plan.variants if v.request.is_cuda)),
        platforms=tuple(dict.fromkeys(v.request.platform for v in render_plan.variants)))
    return Plan(NAME, tuple(recipes), needs=needs)


def official_steps(render_plan: RenderPlan, engine: Engine, settings: BuildSettings) -> list[Step]:
    """The official flavour's steps of a RenderPlan, with the patches and --magma-only of `settings`."""
    return plan_steps(plan_of(render_plan, engine.recipe_format, patches=settings.patches,
                              magma_patches=settings.magma_patches, magma_only=settings.magma_only), settings)


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

    def matrix(self, request: Request) -> list[dict[str, object]]:
        return matrix_rows(plan(selection_of(request)))

    def plan(self, request: Request, recipe_format: str) -> Plan:
        flags = dict(request.flavour_flags)
        return plan_of(plan(selection_of(request)), RecipeFormat(recipe_format), patches=request.patches,
                       magma_patches=tuple(flags.get("--magma-patch") or ()),  # type: ignore[call-overload]
                       magma_only=bool(flags.get("--magma-only")))


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


FLAVOUR = OfficialFlavour()
