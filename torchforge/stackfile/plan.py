"""The plan of a stack whose torch is repacked: the repacked packages as one recipe of the plan (made by the
repack, reused by name in the output channel once repacked), and the stack's extensions planned for its
pytorch, after it. `matrix`, `doctor`, `ci` and a dry run read it before anything is repacked."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from torchforge.binaries.plan import StackPlan
from torchforge.errors import UsageError
from torchforge.extensions.plan import with_extensions
from torchforge.flavours.base import Plan, PlannedRecipe, PytorchBuild, Request
from torchforge.stackfile.load import Stack
from torchforge.stackfile.requests import RepackRequest

REPACKED_ID = "repacked-pytorch"
PYTORCH = "pytorch"


def wheels_plan(stack: Stack, repack: RepackRequest, paths: Sequence[Path]) -> StackPlan:
    """The repack of `paths`, checked against what the stack file says of its torch."""
    from torchforge.binaries.stack import plan_wheels

    planned = plan_wheels(list(paths), repack.cuda_libs, repack.build_number)
    torch_file = stack.model.pytorch
    (torch,) = [p for p in planned.packages if p.name == PYTORCH] or [None]
    said = {"version": torch_file.version, "cuda": torch_file.cuda, "python": stack.model.python[0]}
    found = {"version": torch.version.split("+")[0] if torch else None, "cuda": planned.cuda or "cpu",
             "python": planned.python}
    for key, value in said.items():
        if found[key] != value:
            where = f"[pytorch] {key}" if key != "python" else "python"
            raise UsageError(f"{stack.path}: {where} is {value!r}, the torch wheel's is {found[key]!r}",
                             f"set {key} to {found[key]!r}, or give the wheels of {value}")
    return planned


def repacked_recipe(stack: Stack, planned: StackPlan, build_flags: tuple[str, ...]) -> PlannedRecipe:
    """The repacked packages as one recipe: pytorch first, per its Python; the repack makes them, not an engine."""
    stems = sorted((p.filename.removesuffix(".conda") for p in planned.packages),
                   key=lambda stem: stem.rsplit("-", 2)[0] != PYTORCH)
    cuda = planned.cuda or "cpu"
    # what the repack makes, for the compile cache's key of CI's job (no engine builds it: `build --stack` skips it)
    settings = json.dumps({"repacked": stems}, sort_keys=True)
    arch_list = stack.model.arch_list if cuda != "cpu" else None
    version, build = stems[0].rsplit("-", 2)[1:]
    runtime = next((s for s in planned.specs.values() if s.startswith(("nvidia-cuda-runtime", "cuda-cudart"))), None)
    pytorch = PytorchBuild(version, build, stack.model.platform, planned.python, planned.cuda, arch_list,
                           cuda_runtime=runtime, split_libtorch=False)
    return PlannedRecipe(REPACKED_ID, stack.model.platform, tuple(stems), settings, {}, stack.channels,
                         accel=cuda, kind="pytorch", python=planned.python, pythons=((stems[0], planned.python),),
                         arch_list=arch_list, pytorch=(pytorch,),
                         note=f"repacked from {len(planned.packages)} wheel(s) by `build --stack`",
                         build_flags=build_flags)


def repacked_plan(stack: Stack, request: Request, planned: StackPlan, recipe_format: str,
                  build_flags: tuple[str, ...] = ()) -> Plan:
    """The repacked recipe, then the extensions for its pytorch; with `build_flags` every recipe carries them (a
    CI job builds the whole stack with one `build --stack`)."""
    the_plan = with_extensions(Plan("repack", (repacked_recipe(stack, planned, build_flags),)), request,
                               recipe_format)
    return dataclasses.replace(with_build_flags(the_plan, build_flags),
                               warnings=(*planned.warnings, *the_plan.warnings))


def with_build_flags(the_plan: Plan, build_flags: tuple[str, ...]) -> Plan:
    """Every recipe of the plan built by one command (`build --stack FILE`: one CI job for the stack, so no recipe
    waits for another job)."""
    if not build_flags:
        return the_plan
    return dataclasses.replace(the_plan, recipes=tuple(dataclasses.replace(r, build_flags=build_flags, needs=())
                                                       for r in the_plan.recipes))
