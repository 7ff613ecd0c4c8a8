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

from torchforge.proc import Command
from torchforge.templates import RecipeFormat


@dataclass(frozen=True)
class BuildJob:
    """One recipe folder to build into a staging folder."""

    recipe_dir: Path
    staging_dir: Path
    channels: tuple[str, ...]  # URLs, the local output channel first
    python: str | None
    env: Mapping[str, str]  # values for the recipe's script_env, taken from the caller's environment
    test: bool = True
    # Where the engine keeps its work trees and prefixes, when the caller needs them at a known place (the
    # compile cache's base_dir); None: the engine's default.
    work_dir: Path | None = None
    # Every package file stem (name-version-build) the job writes: the engine makes sure the packages its test
    # installs are these builds, not same-named ones from a shared package cache (engines.package_cache).
    outputs: tuple[str, ...] = ()
    # What an engine without a recipe (pip wheel) builds from: a source folder or a URL; None for the others.
    source: str | None = None


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


def script_env_values(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in names if name in environ}


def which(tool: str) -> str | None:
    return shutil.which(tool)
