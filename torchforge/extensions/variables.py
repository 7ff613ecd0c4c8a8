"""An extension's own build variables (`--extension-env NAME:KEY=VALUE`, a stack file's `[[extensions]] env`):
what a team sets for one package's setup.py (mamba-ssm 2.3.2.post1's MAMBA_FORCE_CXX11_ABI, setup.py:44;
torch-scatter 2.1.2's WITH_SYMBOLS, setup.py:29). They are written into that package's build script, and the build string's digest and the
recorded settings include them, so a package built with other variables is another package.

A variable torchforge itself sets or sizes is refused, with what to use instead: the arch list, the jobs, the
toolkit, the compile cache's route, pip's index and the proxies that keep the build off the network, and the
package's own switches of data/extensions.toml.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from packaging.utils import canonicalize_name

from torchforge.compilecache import ARCH_LIST_VARIABLE, BUILD_VARIABLES, KEEP_GENCODE_VARIABLE
from torchforge.errors import UsageError
from torchforge.extensions.metadata import switches

FLAG = "--extension-env"
FLAG_FORM = "NAME:KEY=VALUE, e.g. mamba-ssm:MAMBA_FORCE_CXX11_ABI=TRUE"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# (variable, what sets it instead)
_TORCHFORGE_SETS = {
    "MAX_JOBS": "--jobs (torchforge sizes the jobs from memory and cores)",
    "TORCH_CUDA_ARCH_LIST": "--arch-list, or arch_list in the stack file (written once for the whole stack)",
    "CUDA_HOME": "the CUDA_HOME of the environment torchforge runs in (the toolkit of the pytorch's CUDA)",
    "FORCE_ONLY_CPU": "the pytorch's CUDA (a CPU pytorch builds CPU only)",
    "PATH": "the build environment's own PATH",
    "LD_LIBRARY_PATH": "the build environment's own libraries",
    "LD_PRELOAD": "nothing: the build runs the engine's tools",
    ARCH_LIST_VARIABLE: "--arch-list",
    KEEP_GENCODE_VARIABLE: "the environment torchforge runs in",
    **dict.fromkeys(BUILD_VARIABLES, "the compile cache (--no-compile-cache to build without it)"),
}
_NETWORK = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy")
Variable = tuple[str, str, str]  # (the extension's name in conda's form, KEY, VALUE)


def check_key(name: str, key: str) -> None:
    """Refuses a KEY that is not a variable name or that torchforge sets for the build of `name`."""
    if not _KEY.match(key):
        raise UsageError(f"{FLAG} {name}:{key}: {key!r} is not an environment variable name",
                         "letters, digits and _, not starting with a digit")
    if key in _TORCHFORGE_SETS:
        raise UsageError(f"{FLAG} {name}:{key}: torchforge sets {key} for every extension build",
                         f"leave it out; use {_TORCHFORGE_SETS[key]}")
    if key.lower() in _NETWORK or key.upper().startswith("PIP_"):
        raise UsageError(f"{FLAG} {name}:{key}: the build runs with no network and pip without an index; {key} "
                         "would change that", "leave it out: an extension builds from its sdist alone "
                                              "(docs/extensions.md)")
    own = switches(name)
    if key in dict(own.build_env) or key in dict(own.cuda_env):
        raise UsageError(f"{FLAG} {name}:{key}: {key} is {name}'s own switch, which torchforge sets so that its "
                         "setup.py compiles instead of downloading a prebuilt binary (data/extensions.toml)",
                         "leave it out")


def parse_flag(text: str) -> Variable:
    """One `NAME:KEY=VALUE`, checked."""
    name, colon, assignment = text.partition(":")
    key, equals, value = assignment.partition("=")
    if not (colon and equals and name.strip() and key):
        raise UsageError(f"{FLAG} {text!r}: not NAME:KEY=VALUE", f"write it as {FLAG_FORM}")
    return checked(name.strip(), key, value)


def checked(name: str, key: str, value: str) -> Variable:
    """(name in conda's form, KEY, VALUE) once KEY and VALUE are fit for the build script."""
    conda_name = canonicalize_name(name)
    check_key(conda_name, key)
    if "\n" in value or "\0" in value:
        raise UsageError(f"{FLAG} {name}:{key}: the value holds a line break or NUL", "give a one-line value")
    return conda_name, key, value


def for_extension(variables: Iterable[Variable], name: str) -> tuple[tuple[str, str], ...]:
    """The (KEY, VALUE) pairs of one extension, sorted by KEY (the last of a KEY given twice wins)."""
    own = {key: value for extension, key, value in variables if extension == canonicalize_name(name)}
    return tuple(sorted(own.items()))


def check_all_used(variables: Iterable[Variable], names: Iterable[str]) -> None:
    """Every variable names an extension of the request: a typo in NAME must not build without it."""
    known = sorted({canonicalize_name(name) for name in names})
    for extension, key, _ in variables:
        if extension not in known:
            raise UsageError(f"{FLAG} {extension}:{key}: the request builds no extension named {extension}",
                             f"name one of: {', '.join(known)}" if known else "give --extension SPEC with it")


def as_flags(name: str, pairs: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The flags that give `pairs` to `name` again (a CI job's command)."""
    return tuple(part for key, value in pairs for part in (FLAG, f"{name}:{key}={value}"))
