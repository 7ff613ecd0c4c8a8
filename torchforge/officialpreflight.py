"""The official flavour's preflight: the shared machine checks of torchforge.preflight, read from its variants
(the selection's refusals, the CUDA libraries each CUDA's magma and pytorch recipes link, the files the pytorch
recipes bundle, the cuDNN each build image must carry) and run in the order its build prints them.

`run_preflight(plan_or_selection, engine=..., source=..., jobs=..., runner=...)` returns a `PreflightReport`; it
never raises for a failed check (the caller prints the whole table first, then `report.raise_if_failed()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchforge import channelcheck
from torchforge import channels as channel_data
from torchforge import data as tables
from torchforge.config import SiteConfig
from torchforge.containers import ContainerSettings
from torchforge.flavours.base import CudaUse, HostLibrary, MachineNeeds, RequirementSolve
from torchforge.preflight import (
    check_arch_check, check_bundled, check_cuda_libraries, check_disk, check_driver, check_engine,
    check_host_compiler, check_jobs, check_nvcc, check_out, check_platform, check_source, check_tools, host_tools)
from torchforge.preflight.images import check_images, suggest_images
from torchforge.preflight.report import Context, Level, Machine, PreflightReport, probe_machine
from torchforge.preflight.table import load_table
from torchforge.proc import Runner
from torchforge.recipe import pytorch_context
from torchforge.render import RenderPlan, plan
from torchforge.resolved import Status as VariantStatus
from torchforge.bundled import bundled_cudnn, bundled_files
from torchforge.resolved import Variant
from torchforge.sourcestate import resolve_source
from torchforge.variant import Selection


def official_needs(variants: Sequence[Variant], *, magma_only: bool = False) -> MachineNeeds:
    """What the official flavour's variants need of the machine (the neutral form the shared checks read): the
    CUDA libraries each CUDA's magma and pytorch recipes link, and the files the pytorch recipes bundle."""
    cudas = tuple(dict.fromkeys(v.request.accel for v in variants if v.request.is_cuda))
    uses = []
    for cuda in cudas:
        of_cuda = [v for v in variants if v.request.accel == cuda]
        kinds = ("magma",) * any(v.magma for v in of_cuda) + ("pytorch",) * (not magma_only)
        uses.append(CudaUse(cuda, kinds, next((v.cudnn for v in of_cuda if v.cudnn), "")))
    data = tables.load()
    bundled = [] if magma_only else [
        HostLibrary(variant.id, file.name, file.dir_var, file.dir_default) for variant in variants
        if variant.status is not VariantStatus.REFUSED and data.platform(variant.request.platform).family == "linux"
        for file in bundled_files(data, variant.request, variant.request.accel
                                  if variant.request.is_cuda and variant.jetson is None else None)
        if not file.optional]
    return MachineNeeds(cuda_versions=cudas, platforms=tuple(dict.fromkeys(v.request.platform for v in variants)),
                        cuda_uses=tuple(uses), host_libraries=tuple(bundled),
                        solves=() if magma_only else tuple(_solve_of(v) for v in variants
                                                           if v.status is not VariantStatus.REFUSED),
                        builds_a_source=not magma_only,
                        env_max_jobs=dict(variants[0].request.options.extra_env).get("MAX_JOBS") if variants else None)


def _solve_of(variant: Variant) -> RequirementSolve:
    """A pytorch recipe's requirements; magma-cudaXYZ is built by the plan itself before it, not looked for."""
    context = pytorch_context(variant)
    planned = variant.magma.name if variant.magma is not None else None
    request = variant.request
    channels = channel_data.for_pytorch(request.pytorch, request.python, request.accel, request.platform)
    return RequirementSolve(variant.id, request.platform, channels,
                            tuple(s for s in context.build_requirements if s.split()[0] != planned),
                            tuple(s for s in context.host_requirements if s.split()[0] != planned))


def _check_variants(ctx: Context, variants: tuple[Variant, ...]) -> None:
    refused = [v for v in variants if v.status is VariantStatus.REFUSED]
    if refused:
        reasons = "; ".join(f"{v.id}: {r}" for v in refused for r in v.refusals)
        ctx.add("selection", Level.FAIL, f"{len(refused)} of {len(variants)} variant(s) refused: {reasons}",
                "change the selection as each reason says (`torchforge matrix` shows every variant)")
    else:
        magma = len({v.magma.id for v in variants if v.magma is not None})
        ctx.add("selection", Level.OK, f"{len(variants)} variant(s), {magma} magma package(s)")


def _check_container(ctx: Context, variants: tuple[Variant, ...], container: ContainerSettings,
                     magma_only: bool) -> None:
    # The cuDNN each variant bundles must be the image's (or one its derivation adds): its build string names it.
    targets = [(v.request.accel, "" if magma_only or v.status is VariantStatus.REFUSED else bundled_cudnn(v))
               for v in variants]
    check_images(ctx, container, targets)


def _variants(selection_or_variants: Selection | RenderPlan | Sequence[Variant]) -> tuple[Variant, ...]:
    if isinstance(selection_or_variants, Selection):
        return plan(selection_or_variants).variants
    if isinstance(selection_or_variants, RenderPlan):
        return selection_or_variants.variants
    return tuple(selection_or_variants)


def run_plan_checks(
    selection_or_variants: Selection | RenderPlan | Sequence[Variant],
    *,
    source: str | None,
    out: Path,
    machine: Machine | None = None,
    magma_only: bool = False,
) -> PreflightReport:
    """The checks that need no tool of this machine, only its platform and the paths given: what a dry run can
    already refuse (a platform this host cannot build, an --out that cannot be written, an unusable --source)."""
    variants = _variants(selection_or_variants)
    ctx = Context(Runner(dry_run=True), machine or probe_machine(), official_needs(variants))
    check_platform(ctx)
    check_out(ctx, out)
    if not magma_only:
        check_source(ctx, source)
    return PreflightReport(tuple(ctx.checks), 0, "")


def run_preflight(
    selection_or_variants: Selection | RenderPlan | Sequence[Variant],
    *,
    engine: str,
    source: str | None,
    jobs: int | None,
    runner: Runner,
    out: Path | None = None,
    machine: Machine | None = None,
    site: SiteConfig | None = None,
    extra_channels: tuple[str, ...] = (),
    container: ContainerSettings | None = None,
    check_channels: bool = False,
    magma_only: bool = False,
    arch_checked: bool = False,
) -> PreflightReport:
    """Run every check and return them all; `report.raise_if_failed()` turns failures into a PreflightError.

    `out` is the output channel folder (its file system gets the disk check; default: the current folder).
    `machine` overrides the probed cores/memory/platform (tests, or planning for another machine).
    `check_channels`: also check that each channel answers and the requirements solve (network; doctor and build).
    `container`: the builds run in images, so their toolkit and compiler are checked there, not here.
    `magma_only`: only the magma-cudaXYZ packages will be built (no cuDNN, no bundled libraries, no channels).
    `arch_checked`: CUDA packages whose libraries the arch check lists after the build (their device code is read after the build).
    """
    table = load_table()
    variants = _variants(selection_or_variants)
    ctx = Context(runner, machine or probe_machine(), official_needs(variants, magma_only=magma_only))
    _check_variants(ctx, variants)
    check_platform(ctx)
    if container is not None:
        # The toolkit, cuDNN, NCCL and host compiler are the image's, not this machine's.
        resolved = "conda-build"
        _check_container(ctx, variants, container, magma_only)
    else:
        resolved = check_engine(ctx, engine)
        check_nvcc(ctx)
        check_host_compiler(ctx)
        check_cuda_libraries(ctx, table)
        suggest_images(ctx, site)
    check_tools(ctx, table, host_tools(table, clones=not magma_only and resolve_source(source, "", "").kind == "git"))
    check_out(ctx, out or Path.cwd())
    check_disk(ctx, out or Path.cwd(), table)
    max_jobs = check_jobs(ctx, jobs, table)
    if not magma_only:  # the pytorch source, the libraries its recipe bundles and its requirements' channels
        check_source(ctx, source)
        if container is None:  # in a container the bundled libraries are the image's (its cuDNN: _check_container)
            check_bundled(ctx)
    check_driver(ctx)
    if arch_checked:
        check_arch_check(ctx)
    if check_channels and not magma_only:  # a magma recipe has no requirements (official-builds.md §2)
        site = site or SiteConfig()
        for finding in channelcheck.check(ctx.needs.solves, out=out or Path.cwd(), extra=extra_channels,
                                          site=site.channels):
            ctx.add(finding.name, Level(finding.status), finding.detail, finding.fix)
    return PreflightReport(tuple(ctx.checks), max_jobs, resolved)
