"""`torchforge build --format wheel`: the pip path. Each variant is built with `pip wheel` in the current
interpreter, then repaired (RPATH fix + audit, manylinux tag, local version, RECORD) into `OUT/wheels/`.

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

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from torchforge import fileops
from torchforge.errors import BuildFailedError, ToolFailedError, UsageError
from torchforge.proc import Command, Runner
from torchforge.render import plan
from torchforge.resolve import Variant
from torchforge.rpath import Layout
from torchforge.variant import Selection
from torchforge.wheel import repair

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


def _source(selection: Selection) -> str:
    source = selection.options.source
    if not source:
        raise UsageError("--format wheel needs --source (a PyTorch checkout with its submodules)",
                         "pass --source PATH_TO_CHECKOUT (or a URL pip can build from)")
    return str(Path(source).resolve()) if os.path.isdir(source) else source


def existing_wheel(wheels_dir: Path, variant: Variant) -> Path | None:
    """A repaired wheel of this variant already in `wheels_dir` (name torch, same version and Python)."""
    tag = f"cp{variant.request.python.replace('.', '')}"
    found = sorted(wheels_dir.glob(f"torch-{wheel_version(variant)}-{tag}-{tag}*-manylinux*.whl"))
    return found[0] if found else None


def build_wheels(selection: Selection, out_dir: Path, runner: Runner, *, jobs: int | None = None,
                 force: bool = False, on_event: Callable[[str], None] | None = None) -> list[Path]:
    """Build, repair and publish one wheel per variant into `out_dir/wheels`; returns the wheel paths.

    A wheel already there (same torch version, local tag and Python) is reused unless `force`. A failed build
    leaves nothing in `out_dir/wheels` but its log.
    """
    render_plan = plan(selection)
    render_plan.require_buildable()
    _check_interpreter(render_plan.variants)
    source = _source(selection)
    wheels_dir = out_dir / "wheels"
    logs_dir = wheels_dir / "logs"
    say = on_event or (lambda _message: None)
    built: list[Path] = []
    for variant in render_plan.variants:
        existing = None if force else existing_wheel(wheels_dir, variant)
        if existing is not None:
            say(f"reuse {existing.name}: already in {wheels_dir}")
            built.append(existing)
            continue
        env = build_environment(variant, os.environ, jobs=jobs)
        log = logs_dir / f"{variant.id}.log"
        if runner.dry_run:
            runner.run(Command((sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation",
                                "-w", str(wheels_dir / f"{fileops.SCRATCH_PREFIX}staging-{variant.id}")), env=env))
            continue
        wheels_dir.mkdir(parents=True, exist_ok=True)
        logs_dir.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        # Staging inside OUT/wheels: the repaired wheel is renamed into place, never copied across devices;
        # a killed build's staging is removed by the next run.
        fileops.clean_stale(wheels_dir)
        with fileops.scratch(wheels_dir, f"staging-{variant.id}") as staging:
            say(f"build {variant.id} (pip wheel, {sys.executable}); log: {log}")
            try:
                runner.run(Command((sys.executable, "-m", "pip", "wheel", source, "--no-deps",
                                    "--no-build-isolation", "-w", str(staging)), env=env), log_file=log)
            except ToolFailedError as exc:
                raise BuildFailedError(f"{variant.id}: pip wheel failed\n{exc.tail}",
                                       f"read the log {log}; nothing was written to {wheels_dir}") from exc
            produced = sorted(staging.glob("*.whl"))
            if len(produced) != 1:
                raise BuildFailedError(
                    f"{variant.id}: pip wheel produced {len(produced)} wheels ({', '.join(p.name for p in produced)})",
                    f"--format wheel expects one wheel from the source; see {log}",
                )
            repaired = repair(produced[0], wheels_dir, runner, local=variant.request.accel_tag,
                              layout=Layout.WHEEL_BUNDLED)
            say(f"wrote {repaired}")
            built.append(repaired)
    return built
