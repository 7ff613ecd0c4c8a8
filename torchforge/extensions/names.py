"""What an extension may be called, checked when it is planned (exit 2): a PEP 508 project name (which is also a
valid conda name once PEP 503 normalised), not one of the stack's own packages (torchforge/data/extensions.toml
[stack], and the companions of flavours.base.STACK_PACKAGES), and one SPEC per name and version: two sources of
one project (an index and a local file, a folder and a git revision) would plan two packages of one file name,
one log and one cache entry; which source is meant is the user's to say, so the second is refused rather than
kept apart by a digest of its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

from packaging.utils import canonicalize_name

from torchforge.data import data_text, parse_toml
from torchforge.errors import DataError, UsageError
from torchforge.flavours.base import STACK_PACKAGES

# PEP 508's name rule (https://packaging.python.org/en/latest/specifications/name-normalization/)
PEP_508_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


@cache
def _stack() -> tuple[frozenset[str], tuple[str, ...]]:
    where = "torchforge/data/extensions.toml"
    table = parse_toml(data_text("extensions"), where).get("stack", {})
    names, prefixes = table.get("names"), table.get("prefixes")  # type: ignore[union-attr]
    if not (isinstance(names, list) and isinstance(prefixes, list) and all(isinstance(n, str) for n in
                                                                            (*names, *prefixes))):
        raise DataError(f"{where}: [stack] names and prefixes are lists of package names", "fix the table")
    return frozenset(canonicalize_name(n) for n in (*names, *STACK_PACKAGES)), tuple(prefixes)


def check_name(spec: str, name: str) -> str:
    """`name` (as the SPEC or the sdist says it) in conda's form, or a usage error saying why it cannot be one."""
    if not PEP_508_NAME.match(name):
        raise UsageError(f"--extension {spec!r}: {name!r} is not a package name (PEP 508: letters, digits, and . _ - "
                         "inside)", "give an sdist whose PKG-INFO Name is a package name, e.g. torch-scatter")
    conda = canonicalize_name(name)
    names, prefixes = _stack()
    if conda in names or conda.startswith(tuple(prefixes)):
        raise UsageError(f"--extension {spec!r}: {conda} is one of the stack's own packages, not an extension",
                         "build pytorch with --pytorch/--cuda/--py and its companions with --with; --extension takes "
                         "packages built against it (torch-scatter, causal-conv1d, ...)")
    return conda


def check_one_source_each(planned: Iterable[tuple[str, str, str]]) -> None:
    """(SPEC, conda name, version) of each extension: two SPECs of one name and version are refused."""
    seen: dict[tuple[str, str], str] = {}
    for spec, name, version in planned:
        if (name, version) in seen:
            first = seen[(name, version)]
            raise UsageError(f"--extension {spec!r} and --extension {first!r} are both {name} {version}: one package "
                             "of one name and version per pytorch build",
                             f"keep the one source of {name} {version} you mean")
        seen[(name, version)] = spec
