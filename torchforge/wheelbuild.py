"""A plan's pip wheels (`torchforge build --format wheel`), seen from below the flavours: the plan's `wheel`
recipes name the source pip builds and the variables their build sets (shell forms, as the conda recipes write
them); here they become the pipeline's steps' values. The pip engine (torchforge/engines/pip_wheel.py) runs `pip
wheel` in the current interpreter through the compile cache, and the pipeline repairs the wheel (RPATH fix + audit,
manylinux tag, local version, RECORD) into `OUT/wheels/`.

The variables are evaluated for a build outside conda: `$PREFIX` is the current interpreter's environment
(`sys.prefix`, where a pip build finds its Python-side dependencies), `$CPU_COUNT` this machine's core count (as
conda-build sets it), `${VAR:-default}` keeps the caller's value of VAR where it is set; a later variable may refer
to an earlier one. What a flavour puts into them is the flavour's (torchforge/flavours/official/wheel.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchforge.flavours.base import JOBS_VARIABLE

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


def step_environment(variables: Sequence[tuple[str, str]], environ: Mapping[str, str], *,
                     jobs: str | None = None) -> dict[str, str]:
    """The values of a wheel recipe's variables in this interpreter and `environ` (see the module docstring);
    `jobs`: the build's MAX_JOBS (--jobs or preflight's), which wins over every other value of it."""
    scope: dict[str, str] = {"CPU_COUNT": str(os.cpu_count() or 1), **environ, "PREFIX": sys.prefix}
    if jobs:
        scope[JOBS_VARIABLE] = jobs
    env: dict[str, str] = {}
    for name, value in variables:
        env[name] = expand(value, scope)
        scope[name] = env[name]  # later values may refer to earlier ones (NCCL_ROOT_DIR=$CUDA_HOME)
    if jobs:
        env[JOBS_VARIABLE] = jobs
    return env


def existing_wheel(wheels_dir: Path, stem: str) -> Path | None:
    """A repaired wheel whose name starts with `stem` (name-version-pythontag-abitag) already in `wheels_dir`."""
    found = sorted(wheels_dir.glob(f"{stem}-manylinux*.whl"))
    return found[0] if found else None

