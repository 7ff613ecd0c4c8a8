"""Private virtualenvs for external tools whose pins conflict with torchforge's own (and each other's).

anaconda-client pins click exactly and quetz-server needs an old fastapi, so each lives in its own venv
next to the repository (`.venv-anaconda`, `.venv-quetz`, gitignored). They are created on first use and
reused afterwards; a file lock makes the two pytest-xdist workers wait for one creator instead of racing.
Run `python -m tests.tool_venvs` to create them ahead of a test run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]

# Pins from ../shared/reference/tooling.md §4 and §5: the versions whose behaviour was checked.
TOOLS: dict[str, tuple[str, ...]] = {
    "anaconda": ("anaconda-client==1.16.0",),
    "quetz": ("quetz-server==0.10.4", "fastapi==0.104.1"),
    # The vendored conda + conda-build (../shared/vendor/README.md: the wheels, the rattler solver, lief); the
    # versions are the ones that built the compile-cache tests here.
    "conda": (*(str(w) for w in sorted((ROOT.parent / "shared" / "vendor").glob("*.whl"))),
              "conda-rattler-solver==0.2.0", "py-rattler-build==0.73.0", "lief==1.0.0", "conda-package-handling==2.6.0", "conda-index==0.13.0"),
}
READY = ".torchforge-ready"
INSTALL_TIMEOUT_S = 900


def venv_dir(tool: str) -> Path:
    return ROOT / f".venv-{tool}"


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
        print(name, ensure(name))
