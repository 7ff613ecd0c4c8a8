"""What the user asks for: a selection of variants, expanded into one `Request` per package to build.

A variant is PyTorch version x accelerator (cpu or CUDA X.Y) x Python X.Y x platform x options. The string
forms (`pytorch-2.5.1-cu124-py312-linux_64`, `magma-cuda124-2.6.1-linux_64`) are made here and only here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from torchforge import data as tables
from torchforge import sourcestate
from torchforge.errors import UsageError
from torchforge.flavours.official.magmasource import MagmaSource
from torchforge.sharedflags import CPU, check_shared_flags
from torchforge.versions import nodot

_GCC_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHOLE_NUMBER = re.compile(r"^[1-9][0-9]*$")


@dataclass(frozen=True)
class Options:
    """Per-variant options that do not multiply the matrix."""

    arch_list: str | None = None
    build_number: int = 0
    debug: bool = False
    jetson: str | None = None
    extra_env: tuple[tuple[str, str], ...] = ()
    gcc: str | None = None
    source: str | None = None
    source_identity: str | None = None  # what a local --source holds (sourcestate.identity); else the spelling
    magma_source: MagmaSource | None = None
    patch_digests: tuple[str, ...] = ()  # sha256 of each --patch file (pytorch recipes), in order
    magma_patch_digests: tuple[str, ...] = ()  # sha256 of each --magma-patch file, in order


@dataclass(frozen=True)
class Request:
    """One pytorch package to build, as asked (not yet checked against the data)."""

    pytorch: str
    accel: str  # "cpu" or a CUDA "X.Y"
    python: str
    platform: str
    options: Options = field(default_factory=Options)

    @property
    def is_cuda(self) -> bool:
        return self.accel != CPU

    @property
    def accel_tag(self) -> str:
        return CPU if not self.is_cuda else f"cu{nodot(self.accel)}"

    @property
    def id(self) -> str:
        suffix = "-debug" if self.options.debug else ""
        jetson = f"-{self.options.jetson}" if self.options.jetson else ""
        return (
            f"pytorch-{self.pytorch}-{self.accel_tag}-py{nodot(self.python)}-"
            f"{self.platform.replace('-', '_')}{jetson}{suffix}"
        )


def magma_id(cuda: str, version: str, platform: str, earlier_build: int | None = None) -> str:
    """`earlier_build`: a build number older than the version's current one (its own recipe, e.g. -build0)."""
    build = f"-build{earlier_build}" if earlier_build is not None else ""
    return f"magma-cuda{nodot(cuda)}-{version}{build}-{platform.replace('-', '_')}"


def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    result = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise UsageError(f"--env expects NAME=VALUE, got {pair!r}", "for example --env USE_NCCL=0")
        if any(c in value for c in "\n\r\0"):
            raise UsageError(f"--env {name}: its value has a line break or NUL, which no build script can hold on one "
                             "line", "give the value on one line")
        if name == "MAX_JOBS" and not _WHOLE_NUMBER.match(value):
            raise UsageError(f"--env MAX_JOBS={value}: MAX_JOBS is the number of parallel compile jobs, a whole number "
                             "from 1", "for example --env MAX_JOBS=8, or leave it out (torchforge chooses from memory and cores)")
        result.append((name, value))
    return tuple(result)


@dataclass(frozen=True)
class Selection:
    """The matrix a command works on: every combination of the listed CUDA and Python versions."""

    pytorch: str
    accels: tuple[str, ...]
    pythons: tuple[str, ...]
    platform: str
    options: Options = field(default_factory=Options)

    @classmethod
    def from_flags(
        cls,
        pytorch: str | None,
        cuda: str | None,
        python: str | None,
        platform: str | None,
        options: Options,
    ) -> Selection:
        defaults = tables.load().pytorch.defaults
        flags = check_shared_flags(pytorch, cuda, python, platform, options.arch_list, options.build_number)
        for flag, value in (("--jetson", options.jetson), ("--source", options.source)):
            if value is not None and not value.strip(" ;,"):
                raise UsageError(f"{flag} is empty", f"give a value, or leave {flag} out")
        if options.gcc is not None and not _GCC_VERSION.match(options.gcc):
            raise UsageError(f"--gcc expects a GCC version such as 12 or 11.4, got {options.gcc!r}", "for example --gcc 12")
        options = replace(options, arch_list=flags.arch_list)
        pytorch = flags.pytorch or defaults.pytorch
        accels = flags.accels or defaults.cuda
        pythons = flags.pythons or defaults.python
        platform = flags.platform or defaults.platform
        if tables.load().platform(platform).windows:
            for name, value in options.extra_env:
                if '"' in value:
                    raise UsageError(f"--env {name}={value}: bld.bat cannot quote a double quote for cmd.exe "
                                     '(set "NAME=value" ends at it)', "give the value without the \" character")
        if options.source and options.source_identity is None:
            options = replace(options, source_identity=sourcestate.identity(options.source))
        return cls(pytorch, accels, pythons, platform, options)

    def requests(self) -> list[Request]:
        return [Request(self.pytorch, a, p, self.platform, self.options) for a in self.accels for p in self.pythons]
