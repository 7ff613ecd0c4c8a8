"""`torchforge build --format wheel`: the plan of pip wheels. Each variant is one `wheel` step of the pipeline,
as a conda build is: the machine checks run first, the pip engine (torchforge/engines/pip_wheel.py) runs `pip
wheel` in the current interpreter through the compile cache, and the pipeline repairs the wheel (RPATH fix +
audit, manylinux tag, local version, RECORD) into `OUT/wheels/`.

The build environment is the variant's own (`Variant.env`, the one the conda recipe exports), evaluated for a
build outside conda:

- `$PREFIX` means the current interpreter's environment (`sys.prefix`): that is where a pip build finds its
  Python-side dependencies (numpy, pybind11, cmake from PyPI), so `CMAKE_PREFIX_PATH=$PREFIX` becomes
  `CMAKE_PREFIX_PATH=<sys.prefix>`;
- `$CPU_COUNT` is this machine's core count (conda-build sets it in recipes), `${VAR:-default}` keeps the
  caller's value of VAR when it is set (`CUDA_HOME`, `MAX_JOBS`);
- dropped, because they only describe a conda build: `PACKAGE_TYPE` (conda) and `CMAKE_LIBRARY_PATH`
  (the conda host prefix's lib/include, which a venv does not have);
- `PYTORCH_BUILD_VERSION=<version>+cpu|+cuXYZ` and `PYTORCH_BUILD_NUMBER=1`, as official wheels set them
  (official-builds.md §3.7), replace the conda package's `$PKG_VERSION` / `$PKG_BUILDNUM`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from torchforge.compilecache import BUILD_VARIABLES, group_key, settings_material
from torchforge.errors import UsageError
from torchforge.pipeline import WHEEL, Action, BuildSettings, Step
from torchforge.render import RenderPlan
from torchforge.resolved import Variant

# Only a conda build has a meaning for these (see the module docstring).
CONDA_ONLY = frozenset({"PACKAGE_TYPE", "CMAKE_LIBRARY_PATH"})
# Set from the wheel's own version rule instead of conda's PKG_VERSION / PKG_BUILDNUM.
VERSION_VARIABLES = frozenset({"PYTORCH_BUILD_VERSION", "PYTORCH_BUILD_NUMBER"})
_REFERENCE = re.compile(r"\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|\$(?P<plain>[A-Za-z_][A-Za-z0-9_]*)")


def expand(value: str, scope: Mapping[str, str]) -> str:
    """Shell-style `$VAR`, `${VAR}` and `${VAR:-default}` (the forms the recipes' env values use)."""

    def substitute(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        found = scope.get(name, "")
        if match["default"] is not None and not found:
            return expand(match["default"], scope)
        return found

    return _REFERENCE.sub(substitute, value)


def wheel_version(variant: Variant) -> str:
    """`X.Y.Z+cpu` / `X.Y.Z+cuXYZ`: the local version official wheels carry."""
    return f"{variant.request.pytorch}+{variant.request.accel_tag}"


def build_environment(variant: Variant, environ: Mapping[str, str], *, jobs: int | None = None) -> dict[str, str]:
    """The variables the wheel build adds to the environment (see the module docstring for the rules)."""
    scope: dict[str, str] = {"CPU_COUNT": str(os.cpu_count() or 1), **environ, "PREFIX": sys.prefix}
    if jobs:
        scope["MAX_JOBS"] = str(jobs)
    env: dict[str, str] = {}
    for name, value in variant.env:
        if name in CONDA_ONLY or name in VERSION_VARIABLES:
            continue
        env[name] = expand(value, scope)
        scope[name] = env[name]  # later values may refer to earlier ones (NCCL_ROOT_DIR=$CUDA_HOME)
    if jobs:
        env["MAX_JOBS"] = str(jobs)
    env["PYTORCH_BUILD_VERSION"] = wheel_version(variant)
    env["PYTORCH_BUILD_NUMBER"] = "1"
    return env


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


def check_wheel_request(render_plan: RenderPlan, source: str | None) -> None:
    """What --format wheel cannot build, refused before the machine checks: another Python than this one, a
    platform other than Linux, no --source."""
    _check_interpreter(render_plan.variants)
    _source(source)


def wheel_stem(variant: Variant) -> str:
    """The start of the repaired wheel's name: torch-VERSION+LOCAL-cpXY-cpXY (its platform tag follows)."""
    tag = f"cp{variant.request.python.replace('.', '')}"
    return f"torch-{wheel_version(variant)}-{tag}-{tag}"


def existing_wheel(wheels_dir: Path, variant: Variant) -> Path | None:
    """A repaired wheel of this variant already in `wheels_dir` (name torch, same version and Python)."""
    found = sorted(wheels_dir.glob(f"{wheel_stem(variant)}-manylinux*.whl"))
    return found[0] if found else None


def wheel_settings(settings: BuildSettings) -> BuildSettings:
    """A wheel plan's settings: the wheels (and their logs) go to OUT/wheels, the compile cache stays OUT's."""
    return dataclasses.replace(settings, out=settings.out / "wheels", cache_root=settings.compile_cache_root)


def plan_wheel_steps(render_plan: RenderPlan, settings: BuildSettings, source: str | None, *,
                     jobs: int | None = None) -> list[Step]:
    """One `wheel` step per variant, built by the pip engine in this interpreter and repaired into
    `settings.out` (see wheel_settings); a wheel already there (same torch version, local tag and Python) is
    reused unless --force. The variants of one release share a compile cache group as conda builds do."""
    render_plan.require_buildable()
    check_wheel_request(render_plan, source)
    where = _source(source)
    environ = {**os.environ, **settings.extra_env}  # preflight's MAX_JOBS among them
    steps: list[Step] = []
    for variant in render_plan.variants:
        existing = None if settings.force else existing_wheel(settings.out, variant)
        key = None
        if settings.caching and existing is None:
            key = group_key(*settings_material(f"wheel-{variant.id}", variant.settings))
        env = build_environment(variant, environ, jobs=jobs)
        steps.append(Step(WHEEL, variant.id, wheel_stem(variant), variant.request.platform, variant.request.python,
                          {}, BUILD_VARIABLES if key else (), Action.REUSE if existing else Action.BUILD,
                          f"{existing.name} already in {settings.out}" if existing else "",
                          accel=variant.request.accel, cache_key=key, source=where, env=tuple(env.items())))
    return steps
