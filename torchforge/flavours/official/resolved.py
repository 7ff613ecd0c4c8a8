"""What the official flavour resolves a request to: a variant (official, buildable or refused, with its release,
CUDA, cuDNN, arch list and build string) and its magma-cudaXYZ plan, the checker that collects a request's
refusals and warnings, and the settings that change a binary (recorded in the package, hashed into a custom
build string).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from enum import Enum

from torchforge import platforms
from torchforge.datamodels import Data, Fix, JetPack, JetsonDevice
from torchforge.flavours.official.magmasource import MagmaSource
from torchforge.sharedflags import normal_arch_list
from torchforge.flavours.official.variant import Request


class Status(str, Enum):
    OFFICIAL = "official"
    BUILDABLE = "buildable"
    REFUSED = "refused"


@dataclass(frozen=True)
class AppliedFix:
    key: str
    fix: Fix


@dataclass(frozen=True)
class MagmaPlan:
    """One magma-cudaXYZ package: once per CUDA version, shared by every Python."""

    id: str
    name: str
    version: str
    build_number: int
    cuda: str
    cuda_full: str
    url: str
    sha256: str
    gencode: tuple[str, ...]
    cmake_options: tuple[str, ...]
    fixes: tuple[AppliedFix, ...]
    warnings: tuple[str, ...]
    source: MagmaSource | None = None  # --magma-source: a local tree or tarball, or a mirror of the release tarball
    published: bool = False  # upstream published this magma-cudaXYZ version (magma.toml [published])
    settings: str = "{}"  # JSON of the options that change this binary (gencode, source, patches); "{}": none
    ptx: tuple[str, ...] = ()  # archs that also get PTX: only when --arch-list asks (X.Y+PTX)
    earlier_build: bool = False  # an older build of the version than magma.toml's current one (magma_build)

    @property
    def host_spec(self) -> str:
        """The pytorch recipe's host requirement: the version, and the exact build where an earlier one was linked
        (an unpinned build would resolve to the current one, with fixes the official package did not have)."""
        return f"{self.name} =={self.version}" + (f" {self.build_string}" if self.earlier_build else "")

    @property
    def status(self) -> Status:
        return Status.OFFICIAL if self.published else Status.BUILDABLE

    @property
    def gencode_flags(self) -> str:
        """nvcc's -gencode list: SASS for every arch, PTX only where asked (official lists have none)."""
        sass = [f"-gencode arch=compute_{g},code=sm_{g}" for g in self.gencode]
        return " ".join([*sass, *(f"-gencode arch=compute_{g},code=compute_{g}" for g in self.ptx)])

    @property
    def upstream_patches(self) -> tuple[str, ...]:
        """The official patches whose changes this build makes (as torchforge's own source edits)."""
        return tuple(a.fix.upstream_patch for a in self.fixes if a.fix.upstream_patch)

    @property
    def build_string(self) -> str:
        # No requirements, so conda-build's default build string is the build number (official-builds §2.1);
        # a custom build carries the hash of its settings so it never takes an official package's name.
        custom = settings_hash(json.loads(self.settings))
        return f"tf{custom}_{self.build_number}" if custom else str(self.build_number)

    @property
    def filename_stem(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}"


@dataclass(frozen=True)
class Variant:
    request: Request
    status: Status
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    release_key: str | None = None
    cuda_full: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    arch_list: str | None = None
    build_string: str | None = None
    magma: MagmaPlan | None = None
    jetson: str | None = None
    fixes: tuple[AppliedFix, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())
    settings: str = "{}"  # JSON of every option that changes the binary ("{}": none); recorded in the package

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def filename_stem(self) -> str:
        return f"pytorch-{self.request.pytorch}-{self.build_string}"


def build_string(python: str, cuda: str | None, cudnn: str | None, number: int, platform: str,
                 *, debug: bool = False, custom: str | None = None, accel_part: bool = True) -> str:
    """The official build string (official-builds §1.3).

    CUDA: py3.8_cuda11.1_cudnn8.0.5_0 (cuDNN from the library file name: three parts on Linux, the DLL
    major on Windows). CPU: py3.11_cpu_0. For PyTorch <= 1.7 pass the three-part CUDA version
    (py3.8_cuda11.0.221_cudnn8.0.5_0); torchforge's data starts at 1.8. Debug builds are torchforge's own
    and carry `_debug` so they never collide with a release build. Any other custom build (`custom`: the short
    hash of its settings) carries `_tf<hash>` before the build number: it can never be taken for an official
    package, and two custom builds with different settings never share a name.
    """
    debug_part = ("_debug" if debug else "") + (f"_tf{custom}" if custom else "")
    if not accel_part:  # macOS: py3.10_0 (official-builds §1.3)
        return f"py{python}{debug_part}_{number}"
    if cuda is None:
        return f"py{python}_cpu{debug_part}_{number}"
    assert cudnn is not None
    return f"py{python}_cuda{cuda}_cudnn{platforms.get(platform).cudnn_tag(cudnn)}{debug_part}_{number}"


class Checker:
    """Collects refusals and warnings for one request while resolving it."""

    def __init__(self, data: Data, request: Request) -> None:
        self.data = data
        self.request = request
        self.refusals: list[str] = []
        self.warnings: list[str] = []
        self.not_official: list[str] = []

    def refuse(self, message: str) -> None:
        self.refusals.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)


# Variables torchforge itself sets or checks: from --env they are validated like the options they stand for.
_SWITCHES = ("USE_CUDA", "USE_MAGMA", "DEBUG")


_OPTION_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "DEBUG")  # --arch-list and --debug


UNCHANGED_BINARY = ("MAX_JOBS",)  # as --jobs: how many compilers run, not what they make


def apply_env_options(request: Request, check: Checker) -> Request:
    """--env TORCH_CUDA_ARCH_LIST / DEBUG act as --arch-list / --debug; USE_CUDA / USE_MAGMA must agree with the
    variant. Returns the request with the options the environment implies."""
    env = dict(request.options.extra_env)
    options = request.options
    for name in _SWITCHES:
        if name in env and env[name] not in ("0", "1"):
            check.refuse(f"--env {name}={env[name]}: torchforge reads {name} as 0 or 1")
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch is not None:
        if options.arch_list is not None and normal_arch_list(options.arch_list) != normal_arch_list(arch):
            check.refuse(f"--arch-list {options.arch_list!r} and --env TORCH_CUDA_ARCH_LIST={arch!r} disagree; give one")
        options = replace(options, arch_list=arch)
    if options.arch_list is not None:
        options = replace(options, arch_list=normal_arch_list(options.arch_list))
    if env.get("DEBUG") == "1":
        options = replace(options, debug=True)
    if env.get("USE_CUDA") == "0" and request.is_cuda:
        check.refuse(f"--env USE_CUDA=0 makes a CPU build of a CUDA {request.accel} variant; use --cuda cpu instead")
    if env.get("USE_CUDA") == "1" and not request.is_cuda:
        check.refuse("--env USE_CUDA=1 on a cpu variant; choose a CUDA version with --cuda X.Y instead")
    return replace(request, options=options)


def variant_settings(request: Request) -> dict[str, object]:
    """Every option of `request` that changes the binary; empty for a build with upstream's settings."""
    options = request.options
    settings: dict[str, object] = {}
    if options.arch_list:
        settings["arch_list"] = options.arch_list
    # Variables that stand for an option count once, as that option: both doors give the same package.
    env = {name: value for name, value in sorted(options.extra_env)
           if name not in _OPTION_VARIABLES + UNCHANGED_BINARY}
    if env:
        settings["env"] = env
    if options.patch_digests:
        settings["patches"] = list(options.patch_digests)
    if options.debug:
        settings["debug"] = True
    if options.source:
        # what a local source holds (its content or git state), not how its path was spelled
        settings["source"] = options.source_identity or options.source
    return settings


def settings_hash(settings: dict[str, object]) -> str | None:
    if not settings:
        return None
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


Jetson = tuple[str, JetsonDevice, JetPack]
