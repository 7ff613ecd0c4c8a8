"""Choosing the build engine for `--engine`. Kept out of the package's __init__, which the engines import
for BuildJob: the registry importing the engines and the engines importing the registry would be a cycle."""

from __future__ import annotations

import sys

from torchforge.engines import Engine
from torchforge.engines.conda_build import CondaBuildEngine, probe
from torchforge.engines.pip_wheel import NAME as PIP_ENGINE, PipWheelEngine
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.errors import ToolMissingError, UsageError


def select_engine(name: str, *, require_available: bool = True) -> tuple[Engine, str]:
    """The engine for --engine NAME and a sentence saying which was chosen and why.

    A dry run may name an engine this machine lacks: it only prints the commands.
    """
    engines: dict[str, Engine] = {"conda-build": CondaBuildEngine(), "rattler-build": RattlerBuildEngine()}
    if name == "auto":
        # The same probe as `torchforge doctor`: `conda build --version` must run, not only `conda` be on PATH.
        found = probe()
        if found.usable:
            return engines["conda-build"], f"using conda-build {found.version} (`conda build --version` runs)"
        return engines["rattler-build"], f"using the embedded rattler-build engine ({found.reason})"
    if name not in engines:
        raise UsageError(f"unknown engine {name!r}", "use auto, conda-build or rattler-build")
    engine = engines[name]
    if require_available and not engine.available():
        why = f": {probe().reason}" if name == "conda-build" else ""
        raise ToolMissingError(
            f"the {name} engine is not available here{why}",
            "install conda-build into a conda base environment, or use --engine rattler-build (embedded)",
        )
    return engine, f"using {name} (--engine)"


def container_engine(engine: str) -> tuple[Engine, str]:
    """The engine inside the images: conda-build, which they carry, as the official builds used it there."""
    if engine == "rattler-build":
        raise UsageError("--container runs conda-build inside the build images; the embedded rattler-build engine lives "
                         "in torchforge's own Python, which the images do not have",
                         "drop --engine rattler-build (auto and conda-build both work with --container)")
    chosen, _ = select_engine("conda-build", require_available=False)
    return chosen, "using conda-build inside the build image (--container)"


def plan_engine(planned: str | None, chosen: tuple[Engine, str], *, container: bool, dry_run: bool) -> tuple[Engine, str]:
    """The engine a plan's recipes are built with: the one its plan names (pip, for a plan of pip wheels), else the
    conda engine `chosen` for --engine (with --container, the image's)."""
    if planned is None:
        return chosen
    if planned != PIP_ENGINE:
        raise UsageError(f"a plan names the engine {planned!r}, which torchforge does not have", "report this plan")
    if container:
        raise UsageError("--container applies to conda packages, not to --format wheel (pip builds the wheel in "
                         "this interpreter)", "leave it out, or build conda packages (--format conda)")
    pip = PipWheelEngine()
    if not dry_run and not pip.available():
        raise ToolMissingError(f"{sys.executable} has no pip to build wheels with", f"{sys.executable} -m ensurepip")
    return pip, f"using pip wheel with {sys.executable} (--format wheel)"
