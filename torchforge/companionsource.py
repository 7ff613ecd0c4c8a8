"""--with-source NAME=PATH: a local source tree or archive of a companion (torchvision, torchaudio) that its recipe
builds instead of the release's archive (a patched checkout, a machine that reaches no GitHub).

The path is checked when the command line is read: a folder must hold a `setup.py` or `pyproject.toml` (the
projects build with setuptools), an archive must pass the extraction rule (safeextract), so nothing is packed or
planned from a wrong path. What it holds is part of the companion's settings (sourcestate.identity): another tree
is another package, the same tree is reused however its path is spelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchforge import sourcestate
from torchforge.errors import UsageError
from torchforge.safeextract import check_archive, is_archive

FLAG_FORM = "NAME=PATH, e.g. torchvision=../vision (a source tree with setup.py, or its .tar.gz)"
BUILD_FILES = ("setup.py", "pyproject.toml")


@dataclass(frozen=True)
class CompanionSource:
    name: str
    given: str  # as typed (a CI job repeats it: relative to the checkout)
    path: str  # absolute, what the recipe's `source: path:` names
    identity: str  # sourcestate.identity of what it holds


def parse_flag(text: str) -> tuple[str, str]:
    """(NAME, PATH) of one --with-source, the path checked; a usage error (2) says what would work."""
    name, sep, given = text.partition("=")
    name, given = name.strip(), given.strip()
    if not sep or not name or not given:
        raise UsageError(f"--with-source {text!r} is not NAME=PATH", f"write it as {FLAG_FORM}")
    path = Path(given).expanduser()
    if path.is_dir():
        if not any((path / file).is_file() for file in BUILD_FILES):
            raise UsageError(f"--with-source {name}={given}: the folder holds no {' or '.join(BUILD_FILES)}",
                             f"name the root of {name}'s source tree (where its setup.py is)")
    elif path.is_file():
        if not is_archive(path):
            raise UsageError(f"--with-source {name}={given} is neither a folder nor a source archive",
                             "give the source tree, or its .tar.gz / .zip")
        check_archive(path)
    else:
        raise UsageError(f"--with-source {name}={given}: no such file or folder", f"give {FLAG_FORM}")
    return name, given


def sources(values: tuple[tuple[str, str], ...], with_packages: tuple[str, ...]) -> dict[str, CompanionSource]:
    """{companion: its source} of a request, each naming a companion --with builds, once."""
    found: dict[str, CompanionSource] = {}
    for name, given in values:
        if name not in with_packages:
            raise UsageError(f"--with-source {name}=... names a package --with does not build",
                             f"add --with {name}, or leave that --with-source out")
        if name in found:
            raise UsageError(f"--with-source names {name} twice", "give one source for each companion")
        path = str(Path(given).expanduser().resolve())
        found[name] = CompanionSource(name, given, path, sourcestate.identity(path))
    return found


def flags(source: CompanionSource | None) -> tuple[str, ...]:
    """The --with-source of a companion's own build command (a CI job's), as it was given."""
    return ("--with-source", f"{source.name}={source.given}") if source is not None else ()
