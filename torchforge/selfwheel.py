"""The wheel of the running torchforge, which `torchforge ci` commits beside the pipeline it writes.

Every job of that pipeline installs exactly this file from its checkout, so the jobs run the torchforge that
wrote their commands, never whatever an index serves under a name (the name `torchforge` on PyPI belongs to
another project). The wheel is `--wheel PATH` when given, else built by pip from this torchforge's own source
tree (a checkout, an editable install); an installed wheel has no source tree to build from.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import torchforge
from torchforge import __version__, fileops
from torchforge.errors import UsageError
from torchforge.proc import Command, Runner

# The distribution name torchforge is installed under (pyproject.toml [project] name); the module and the
# command stay `torchforge`.
_PACKAGE = "torchforge"
BUILD_TIMEOUT_S = 600


def distribution() -> str:
    """The distribution name of this torchforge: its source tree's pyproject.toml (what pip builds), else the
    installed distribution that provides the `torchforge` package."""
    root = source_tree()
    if root is not None:
        return str(tomllib.loads(fileops.read_utf8(root / "pyproject.toml"))["project"]["name"])
    names = metadata.packages_distributions().get(_PACKAGE, [])
    if not names:
        raise UsageError("torchforge is not installed as a distribution (no metadata for its package)",
                         "install it with pip (pip install -e CHECKOUT, or the wheel), or pass --wheel PATH")
    return names[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_name() -> str:
    """The file name of this torchforge's wheel (pure Python: py3-none-any)."""
    return f"{_normal(distribution())}-{__version__}-py3-none-any.whl"


def check(wheel: Path) -> Path:
    """`wheel` if it is this torchforge's wheel (its distribution and version), else UsageError."""
    want = wheel_name()
    if not wheel.is_file() or not wheel.name.endswith(".whl"):
        raise UsageError(f"--wheel {wheel} is not a wheel file", f"give the path of {want}")
    if wheel.name != want:
        raise UsageError(f"--wheel {wheel.name} is not the torchforge that writes this pipeline ({want})",
                         "build this torchforge's wheel (pip wheel --no-deps -w dist CHECKOUT) or run the torchforge "
                         "whose wheel it is")
    return wheel


def source_tree() -> Path | None:
    """The folder of pyproject.toml when the running torchforge is a source tree, else None."""
    root = Path(torchforge.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "recipe_templates").is_dir() else None


def build(runner: Runner, into: Path) -> Path:
    """Build this torchforge's wheel into `into` (pip, with build isolation: the backend comes from the index)."""
    root = source_tree()
    if root is None:
        raise UsageError("this torchforge was installed from a wheel, so there is no source tree to build the wheel "
                         "the CI jobs install", "pass that wheel with --wheel PATH")
    runner.run(Command((sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(into),
                        str(root))), timeout=BUILD_TIMEOUT_S)
    return check(into / wheel_name())


def place(wheel: Path, repository: Path, folder: str) -> str:
    """Copy `wheel` into `repository/folder` (atomically; other wheels of torchforge there are removed) and
    return its path relative to the repository, as the jobs name it."""
    target = repository / folder / wheel.name
    fileops.atomic_write(target, wheel.read_bytes())
    for old in (repository / folder).glob(f"{_normal(distribution())}-*.whl"):  # an older torchforge's wheel
        if old != target:
            old.unlink()
    return f"{folder}/{wheel.name}"
