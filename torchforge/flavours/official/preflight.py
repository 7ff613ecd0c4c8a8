"""What the official flavour's variants need of the machine, in the neutral form the shared machine checks of
torchforge.preflight read (MachineNeeds): the CUDA libraries each CUDA's magma and pytorch recipes link, the files
the pytorch recipes bundle, the requirements each pytorch recipe must solve. `build` and `doctor` check them as
every flavour's (torchforge.sequence.machine_report).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchforge import channels as channel_data
from torchforge import data as tables
from torchforge.flavours.official.bundled import bundled_files
from torchforge.flavours.base import CudaUse, HostLibrary, MachineNeeds, RequirementSolve
from torchforge.flavours.official.recipe import pytorch_context
from torchforge.flavours.official.resolved import Status as VariantStatus
from torchforge.flavours.official.resolved import Variant


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
