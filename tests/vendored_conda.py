"""The vendored conda-build (../shared/vendor, installed into `.venv-conda` as its README says) on PATH.

conda's own `conda` script refuses to run from a plain venv, so a two-line shim runs `python -m conda`;
the rattler solver, offline mode and an empty condarc keep it away from any network or user setting.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VENV_CONDA = Path(__file__).resolve().parent.parent / ".venv-conda"


def available() -> bool:
    """conda-build is on PATH, or `.venv-conda` exists or can be created from ../shared/vendor (tool_venvs)."""
    from tests.tool_venvs import ensure
    from torchforge.engines.conda_build import CondaBuildEngine

    if CondaBuildEngine().available():
        return True
    if not (VENV_CONDA / "bin" / "conda-build").is_file() and any((VENV_CONDA.parent.parent / "shared" / "vendor").glob("*.whl")):
        ensure("conda")
    return (VENV_CONDA / "bin" / "conda-build").is_file()


@contextmanager
def on_path(tmp: Path) -> Iterator[None]:
    """conda and conda-build on PATH for the duration (nothing changes when they already are)."""
    from torchforge.engines.conda_build import CondaBuildEngine

    if CondaBuildEngine().available():
        yield
        return
    shim = tmp / "conda-shim"
    shim.mkdir()
    (shim / "conda").write_text(f'#!/bin/sh\nexec "{VENV_CONDA / "bin" / "python"}" -m conda "$@"\n')
    (shim / "conda").chmod(0o755)
    (shim / "conda-build").symlink_to(VENV_CONDA / "bin" / "conda-build")
    (tmp / "condarc").write_text("channels: []\noffline: true\nsolver: rattler\n")
    saved = dict(os.environ)
    os.environ.update({"PATH": f"{shim}:{os.environ['PATH']}", "CONDA_SOLVER": "rattler", "CONDA_OFFLINE": "true",
                       "CONDARC": str(tmp / "condarc"), "CONDA_PKGS_DIRS": str(tmp / "conda-pkgs")})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
