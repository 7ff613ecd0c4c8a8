"""What `standin-channel --extension SPEC` adds: the packages each extension's recipe installs (its build
requirements, pip, ninja for CUDA, its stated run requirements), read without running its setup.py.

They are stand-ins (empty packages) like the others, with one exception: `wheel`. The stand-in python runs this
machine's interpreter and imports its setuptools; setuptools before 70.1 builds no wheel without the `wheel`
project (pip then fails with "invalid command 'bdist_wheel'"). Where that interpreter can build wheels neither
way, the `wheel` of the channel is the real project, its files taken from the wheel pip gives for it (pip's own
configuration: PyPI, or an index or folder it names, as for `repack --pytorch`), so that the build can run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from torchforge import closure
from torchforge.errors import ToolMissingError
from torchforge.extensions.metadata import standin_requirements
from torchforge.extensions.names import check_one_source_each
from torchforge.extensions.plan import planned_source
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.proc import Runner
from torchforge.safeextract import check_zip
from torchforge.standin import Stub, base_python

# The project that gives setuptools before 70.1 its bdist_wheel command, and how the stand-in python is asked
# whether it has one (setuptools 70.1+ carries it as setuptools.command.bdist_wheel).
WHEEL = "wheel"
SETUPTOOLS = "setuptools"
BUILDS_WHEELS = ("import importlib.util as u, sys; "
                 "sys.exit(0 if u.find_spec('wheel') or u.find_spec('setuptools.command.bdist_wheel') else 1)")


@dataclass(frozen=True)
class ExtensionStandIns:
    specs: tuple[str, ...]  # stand-ins to make
    real: tuple[Stub, ...]  # packages with their real files, in place of the stand-ins of their names
    warnings: tuple[str, ...]


def extension_standins(texts: tuple[str, ...], python: str, cuda: bool) -> ExtensionStandIns:
    """The stand-ins of each --extension SPEC's recipe for Python `python` (X.Y), refused as `build` refuses the
    SPEC (a stack package, two SPECs of one name and version); the real `wheel` where the build needs it."""
    sources = [(text, planned_source(parse_spec(text), Runner())) for text in texts]
    check_one_source_each((text, source.name, source.version) for text, source in sources)
    found: list[str] = []
    warnings: list[str] = []
    for text, source in sources:
        with tempfile.TemporaryDirectory(prefix="torchforge-standin-") as tmp:
            archive = None if source.spec.kind == "index" else fetch(source.spec, Path(tmp), sys.executable, Runner())
            needs, stated = standin_requirements(archive, python, cuda)
        if not stated:
            warnings.append(f"--extension {text}: its run requirements are its setup.py's to say (not run here): add "
                            "their stand-ins by hand if the build's solve names one")
        found += needs
    real = (real_wheel(python),) if WHEEL in (s.split()[0] for s in found) and not builds_wheels(python) else ()
    if found:
        warnings.append("the stand-ins of an extension's build tools (setuptools, pip) are empty: its build uses "
                        "those of this machine's Python, which the stand-in python sees"
                        + (f"; its `wheel` is the real {real[0].version} (this machine's setuptools builds no "
                           "wheel without it)" if real else ""))
    return ExtensionStandIns(tuple(dict.fromkeys(found)), real, tuple(warnings))


def real_setuptools(specs: list[str], python: str, source: closure.WheelSource) -> tuple[Stub, ...]:
    """A companion's recipe installs setuptools and pip and builds a wheel, as conda-forge's setuptools (70.1+)
    does by itself; the stand-in python runs this machine's interpreter, whose setuptools may be older (no
    bdist_wheel, and `pip check` then finds a torch that requires a newer one). There the `setuptools` of the
    channel is the real project in a version of the recipe's spec, from the wheel pip gives for it (`source`: the
    --wheels folders alone, else pip's index), so that the pair does what the package it stands in for does. ()
    where no recipe needs it or this machine's builds wheels."""
    setuptools = [spec for spec in specs if spec.split()[0] == SETUPTOOLS]
    if not setuptools or builds_wheels(python):
        return ()
    requirement = closure.pip_spec(setuptools[0]) or SETUPTOOLS
    return (_real_project(requirement, python, source, f"the stand-in python's setuptools builds no wheel, and "
                          f"pip gave no {requirement}", "setuptools 70.1+", "-U setuptools"),)


def builds_wheels(python: str) -> bool:
    """Whether the interpreter the stand-in python of `python` runs has a bdist_wheel (the `wheel` project, or
    setuptools 70.1+), as the stand-in sees it (isolated: no user site-packages, as in a venv, and not the
    folder it runs in)."""
    try:
        executable = base_python(python)
    except FileNotFoundError as exc:
        raise ToolMissingError(f"cannot make the stand-in python: {exc}",
                               "ask for a Python this machine has (--py X.Y with pythonX.Y on PATH)") from None
    return subprocess.run([str(executable), "-I", "-c", BUILDS_WHEELS], capture_output=True).returncode == 0


def real_wheel(python: str) -> Stub:
    """The `wheel` project as a package of the stand-in channel: the files of the wheel pip gives for it, under
    lib/pythonX.Y/site-packages, where the stand-in python of X.Y imports from."""
    return _real_project(WHEEL, python, closure.default_source(()), "the stand-in python's setuptools builds no "
                         "wheel without the `wheel` project, and pip gave none", "wheel", "wheel")


def _real_project(requirement: str, python: str, source: closure.WheelSource, missing: str, what: str,
                  pip_args: str) -> Stub:
    """The wheel pip gives for `requirement` as a package of the stand-in channel, or what to do without one."""
    got = closure.fetch_wheel(requirement, python, source, Runner())
    if isinstance(got, str):
        raise ToolMissingError(f"{missing} ({got})",
                               f"install {what} into this machine's Python {python} (python{python} -m pip install "
                               f"{pip_args}), or point pip at an index or folder that has it (pip config set "
                               "global.find-links DIR)")
    return wheel_stub(got, python)


def wheel_stub(wheel: Path, python: str) -> Stub:
    """A pure-Python wheel's files as a package (no scripts: only what `import` reads)."""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    site = f"lib/python{python}/site-packages"
    with zipfile.ZipFile(wheel) as archive:
        check_zip(wheel, archive)  # its names become paths in the package
        files = {f"{site}/{member}": archive.read(member) for member in archive.namelist()
                 if not member.endswith("/") and ".data/" not in member}
    return Stub(str(canonicalize_name(name)), str(version), files=files)
