"""Build engines behind one small interface. Engines describe the work (a Command); the pipeline runs it.

An engine never runs anything itself: `command()` returns the exact argv and environment, so `--dry-run`
prints what would run, and tests check conda-build's invocation without conda-build installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from torchforge.errors import ToolMissingError, UsageError
from torchforge.proc import Command
from torchforge.render import RecipeFormat


@dataclass(frozen=True)
class BuildJob:
    """One recipe folder to build into a staging folder."""

    recipe_dir: Path
    staging_dir: Path
    channels: tuple[str, ...]  # URLs, the local output channel first
    python: str | None
    env: Mapping[str, str]  # values for the recipe's script_env, taken from the caller's environment
    test: bool = True


class Engine(Protocol):
    name: str
    recipe_format: RecipeFormat

    def available(self) -> bool: ...

    def command(self, job: BuildJob) -> Command: ...


def find_artifact(staging_dir: Path, subdir: str, stem: str) -> Path | None:
    for suffix in (".conda", ".tar.bz2"):
        for candidate in (staging_dir / subdir / f"{stem}{suffix}", staging_dir / "noarch" / f"{stem}{suffix}"):
            if candidate.is_file():
                return candidate
    return None


def select_engine(name: str, *, require_available: bool = True) -> tuple[Engine, str]:
    """The engine for --engine NAME and a sentence saying which was chosen and why.

    A dry run may name an engine this machine lacks: it only prints the commands.
    """
    from torchforge.engines.conda_build import CondaBuildEngine, probe
    from torchforge.engines.rattler_build import RattlerBuildEngine

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


def script_env_values(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in names if name in environ}


def which(tool: str) -> str | None:
    return shutil.which(tool)
