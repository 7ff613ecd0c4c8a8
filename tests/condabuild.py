"""The real conda-build for tests: the machine's conda when `conda build --version` runs on PATH, otherwise
`.venv-conda` made from the upstream wheels in ../shared/vendor (tests/tool_venvs.py), behind a `conda` shim.

Every conda call gets an offline, isolated configuration: no channels from a user's condarc, conda-build's work
folders and a package cache of its own per test (offline, the solver treats cached packages as a channel, so a
shared cache leaks packages of earlier runs into later solves).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests import tool_venvs

HOW_TO_GET_ONE = (
    "no conda with conda-build on PATH and no conda wheels in ../shared/vendor: install conda-build into a conda "
    "(`conda install -n base conda-build`) and put that conda on PATH, or place conda-26.7.1, conda_build-26.7.1 and "
    "menuinst-2.5.2 wheels in ../shared/vendor (tests/tool_venvs.py then makes .venv-conda from them)"
)


@dataclass(frozen=True)
class CondaTool:
    path_prefix: str | None  # folder to put in front of PATH (the vendored shim); None: the machine's conda
    vendored: bool

    def env(self, scratch: Path) -> dict[str, str]:
        """Variables for conda and conda-build, with their work folders under `scratch`."""
        scratch.mkdir(parents=True, exist_ok=True)
        condarc = scratch / "condarc"
        lines = ["channels: []", "offline: true", "register_envs: false", "notify_outdated_conda: false"]
        if self.vendored:
            # ../shared/vendor/README.md: libmamba is not installable here, the classic solver fails in conda-build.
            lines.append("solver: rattler")
        condarc.write_text("\n".join(lines) + "\n")
        env = {
            "CONDARC": str(condarc),
            "CONDA_OFFLINE": "true",
            "CONDA_BLD_PATH": str(scratch / "conda-bld"),  # condarc's croot is ignored by conda-build
            "CONDA_PKGS_DIRS": str(scratch / "pkgs"),
        }
        if self.vendored:
            env["CONDA_SOLVER"] = "rattler"
        if self.path_prefix:
            env["PATH"] = self.path_prefix + os.pathsep + os.environ.get("PATH", "")
        return env


def machine_conda_build() -> bool:
    if shutil.which("conda") is None:
        return False
    try:
        return subprocess.run(["conda", "build", "--version"], capture_output=True, timeout=120).returncode == 0
    except OSError:
        return False


def find_conda_tool() -> CondaTool | None:
    """The conda-build to test with (creating .venv-conda on first use), or None where there is none."""
    if machine_conda_build():
        return CondaTool(None, vendored=False)
    if tool_venvs.vendored_conda_present():
        return CondaTool(str(tool_venvs.conda_shim_dir()), vendored=True)
    return None


def run_conda(tool: CondaTool, scratch: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["conda", *args], env={**os.environ, **tool.env(scratch)}, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
