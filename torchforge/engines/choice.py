"""Choosing the build engine for `--engine`. Kept out of the package's __init__, which the engines import
for BuildJob: the registry importing the engines and the engines importing the registry would be a cycle."""

from __future__ import annotations

from torchforge.engines import Engine
from torchforge.engines.conda_build import CondaBuildEngine
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.errors import ToolMissingError, UsageError


def select_engine(name: str, *, require_available: bool = True) -> tuple[Engine, str]:
    """The engine for --engine NAME and a sentence saying which was chosen and why.

    A dry run may name an engine this machine lacks: it only prints the commands.
    """
    engines: dict[str, Engine] = {"conda-build": CondaBuildEngine(), "rattler-build": RattlerBuildEngine()}
    if name == "auto":
        if engines["conda-build"].available():
            return engines["conda-build"], "using conda-build (`conda build` is on PATH)"
        return engines["rattler-build"], "using the embedded rattler-build engine (no `conda` with conda-build on PATH)"
    if name not in engines:
        raise UsageError(f"unknown engine {name!r}", "use auto, conda-build or rattler-build")
    engine = engines[name]
    if require_available and not engine.available():
        raise ToolMissingError(
            f"the {name} engine is not available here",
            "install conda-build into a conda base environment, or use --engine rattler-build (embedded)",
        )
    return engine, f"using {name} (--engine)"
