"""The official flavour's plan of pip wheels (`torchforge build --format wheel`): one `wheel` recipe per variant,
built by the pip engine in this interpreter (torchforge.wheelbuild says how its variables are evaluated).

The build environment is the variant's own (`Variant.env`, the one the conda recipe exports), less what only
describes a conda build (`PACKAGE_TYPE`, and `CMAKE_LIBRARY_PATH`: the conda host prefix's lib/include, which a
venv does not have); `PYTORCH_BUILD_VERSION=<version>+cpu|+cuXYZ` and `PYTORCH_BUILD_NUMBER=1`, as official wheels
set them (official-builds.md §3.7), replace the conda package's `$PKG_VERSION` / `$PKG_BUILDNUM`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from torchforge.compilecache import BUILD_VARIABLES, group_key, settings_material
from torchforge.engines.pip_wheel import NAME as PIP_ENGINE
from torchforge.errors import UsageError
from torchforge.flavours.base import MachineNeeds, Plan, PlannedRecipe, Request
from torchforge.flavours.official.render import RenderPlan
from torchforge.flavours.official.resolved import Variant
from torchforge.wheelbuild import step_environment

WHEEL = "wheel"  # the recipes' kind (torchforge.pipeline.WHEEL): repaired into the output folder, not a channel
# Only a conda build has a meaning for these (see the module docstring).
CONDA_ONLY = frozenset({"PACKAGE_TYPE", "CMAKE_LIBRARY_PATH"})
# Set from the wheel's own version rule instead of conda's PKG_VERSION / PKG_BUILDNUM.
VERSION_VARIABLES = frozenset({"PYTORCH_BUILD_VERSION", "PYTORCH_BUILD_NUMBER"})


def wheel_version(variant: Variant) -> str:
    """`X.Y.Z+cpu` / `X.Y.Z+cuXYZ`: the local version official wheels carry."""
    return f"{variant.request.pytorch}+{variant.request.accel_tag}"


def wheel_stem(variant: Variant) -> str:
    """The start of the repaired wheel's name: torch-VERSION+LOCAL-cpXY-cpXY (its platform tag follows)."""
    tag = f"cp{variant.request.python.replace('.', '')}"
    return f"torch-{wheel_version(variant)}-{tag}-{tag}"


def wheel_variables(variant: Variant) -> tuple[tuple[str, str], ...]:
    """The variables a variant's wheel build sets, in the shell forms of its recipe (see the module docstring)."""
    kept = tuple((name, value) for name, value in variant.env if name not in CONDA_ONLY | VERSION_VARIABLES)
    return (*kept, ("PYTORCH_BUILD_VERSION", wheel_version(variant)), ("PYTORCH_BUILD_NUMBER", "1"))


def build_environment(variant: Variant, environ: Mapping[str, str], *, jobs: int | None = None) -> dict[str, str]:
    """The variables the variant's wheel build adds to `environ` in this interpreter (`jobs`: its MAX_JOBS)."""
    return step_environment(wheel_variables(variant), environ, jobs=str(jobs) if jobs else None)


def _check_interpreter(variants: tuple[Variant, ...]) -> None:
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    wrong = [v.id for v in variants if v.request.python != current]
    if wrong:
        raise UsageError(
            f"--format wheel builds with the current interpreter (Python {current}); "
            f"{len(wrong)} variant(s) ask for another Python: {', '.join(wrong)}",
            f"select --py {current}, or run torchforge with the Python you want the wheel for",
        )
    foreign = [v.id for v in variants if not v.request.platform.startswith("linux")]
    if foreign:
        raise UsageError(f"--format wheel builds Linux wheels only: {', '.join(foreign)}",
                         "select a linux-* --platform, or build conda packages for that platform")


def _source(source: str | None) -> str:
    if not source:
        raise UsageError("--format wheel needs --source (a PyTorch checkout with its submodules)",
                         "pass --source PATH_TO_CHECKOUT (or a URL pip can build from)")
    return str(Path(source).resolve()) if os.path.isdir(source) else source


def _refuse_conda_only(request: Request, magma_only: bool) -> None:
    """What only a conda build has, refused rather than ignored."""
    if request.with_packages:
        raise UsageError("--with builds conda packages, not --format wheel", "leave --with out, or use --format conda")
    if request.extensions:
        raise UsageError("--extension builds conda packages, not --format wheel",
                         "leave --extension out, or build conda packages (--format conda)")
    if magma_only:
        raise UsageError("--magma-only applies to conda packages, not to --format wheel (pip builds the wheel in "
                         "this interpreter)", "leave it out, or build conda packages (--format conda)")


def wheel_plan(flavour: str, render_plan: RenderPlan, request: Request, needs: MachineNeeds,
               magma_only: bool = False) -> Plan:
    """The plan of one pip wheel per (buildable) variant, for the pip engine; a request it cannot build (another
    Python than this one, a platform other than Linux, no --source, a conda-only flag) is refused first. The
    variants of one release share a compile cache group, as conda builds do; pip installs no requirement, so
    nothing is solved from a channel."""
    _refuse_conda_only(request, magma_only)
    render_plan.require_buildable()
    _check_interpreter(render_plan.variants)
    where = _source(request.source)
    recipes = tuple(PlannedRecipe(
        variant.id, variant.request.platform, (wheel_stem(variant),), variant.settings, {}, (),
        variant.request.accel, kind=WHEEL, python=variant.request.python, cache_script_env=BUILD_VARIABLES,
        cache_group=group_key(*settings_material(f"wheel-{variant.id}", variant.settings)), source=where,
        build_env=wheel_variables(variant)) for variant in render_plan.variants)
    warnings = tuple(f"{v.id}: {message}" for v in render_plan.variants for message in v.warnings)
    return Plan(flavour, recipes, warnings, needs=needs, engine=PIP_ENGINE,
                facts=(("selection", f"{len(render_plan.variants)} variant(s), {len(render_plan.magma)} magma "
                                     "package(s)"),))
