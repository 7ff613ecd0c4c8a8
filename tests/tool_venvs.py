"""Private virtualenvs for external tools whose pins conflict with torchforge's own (and each other's).

anaconda-client pins click exactly and quetz-server needs an old fastapi, so each lives in its own venv
next to the repository (`.venv-anaconda`, `.venv-quetz`, gitignored). conda and conda-build are not on PyPI:
`.venv-conda` installs the upstream releases as wheels from ../shared/vendor (its README says how they run
offline) and gets a `conda` shim (`conda_shim_dir()`), since the `conda` script pip writes refuses to run.
They are created on first use and reused afterwards; a file lock makes the two pytest-xdist workers wait for
one creator instead of racing.
Run `python -m tests.tool_venvs` to create them ahead of a test run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT.parent / "shared" / "vendor"
CONDA_WHEELS = ("conda-26.7.1-py3-none-any.whl", "conda_build-26.7.1-py3-none-any.whl", "menuinst-2.5.2-py3-none-any.whl")

# Pins from ../shared/reference/tooling.md §4 and §5: the versions whose behaviour was checked.
TOOLS: dict[str, tuple[str, ...]] = {
    "anaconda": ("anaconda-client==1.16.0",),
    "quetz": ("quetz-server==0.10.4", "fastapi==0.104.1"),
    # ../shared/vendor/README.md: the rattler solver (libmamba cannot be installed here and the classic solver
    # fails inside conda-build 26.7.1), lief (conda-build's overlinking check needs it without declaring it),
    # conda-index (conda-build indexes its output folder with it), py-rattler-build (`conda render` imports it).
    # Versions: the ones checked with these wheels.
    "conda": (*(str(VENDOR / wheel) for wheel in CONDA_WHEELS),
              "conda-rattler-solver==0.2.0", "lief==1.0.0", "conda-index==0.13.0", "py-rattler-build==0.73.0"),
    # An extension's setup.py imports torch to say its metadata: the CPU torch wheel pip's config here offers
    # (torch 2.13.0+cpu, cp311), with the build tools the extension sdists name.
    "torchcpu": ("torch==2.13.0", "setuptools", "wheel", "packaging", "ninja"),
}
READY = ".torchforge-ready"
INSTALL_TIMEOUT_S = 900


def venv_dir(tool: str) -> Path:
    return ROOT / f".venv-{tool}"


def vendored_conda_present() -> bool:
    return all((VENDOR / wheel).is_file() for wheel in CONDA_WHEELS)


def conda_shim_dir() -> Path:
    """A folder with `conda` (`python -m conda`, which runs where pip's `conda` script refuses) and `conda-build`,
    for the front of PATH: `conda build ...` then works as on a machine with conda. Creates `.venv-conda` first."""
    bin_dir = ensure("conda")
    shim = bin_dir.parent / "shim"
    with FileLock(str(bin_dir.parent / ".shim.lock"), timeout=60):
        shim.mkdir(exist_ok=True)
        script = f'#!/bin/sh\nexec "{bin_dir / "python"}" -m conda "$@"\n'
        conda = shim / "conda"
        if not conda.is_file() or conda.read_text() != script:
            conda.write_text(script)
            conda.chmod(0o755)
        if not (shim / "conda-build").is_symlink():
            (shim / "conda-build").symlink_to(bin_dir / "conda-build")
    return shim


def ensure(tool: str) -> Path:
    """The venv for `tool`, created if missing. Returns its bin directory."""
    pins = TOOLS[tool]
    target = venv_dir(tool)
    target.mkdir(exist_ok=True)
    ready = target / READY
    # The lock lives inside the (gitignored) venv folder; `python -m venv` accepts an existing folder.
    with FileLock(str(target / ".create.lock"), timeout=INSTALL_TIMEOUT_S + 60):
        if ready.is_file() and ready.read_text() == "\n".join(pins):
            return target / "bin"
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=120)
        subprocess.run(
            [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        ready.write_text("\n".join(pins))
    return target / "bin"


if __name__ == "__main__":
    for name in sys.argv[1:] or list(TOOLS):
        if name == "conda" and not vendored_conda_present():
            print(name, f"skipped: no conda wheels in {VENDOR}")
            continue
        print(name, ensure(name))
