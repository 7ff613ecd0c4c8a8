"""Classify each requested variant (official / buildable / refused) and resolve everything a recipe needs.

Every rule reads the data tables; each refusal says what is wrong and what would work, each warning says
why a buildable variant is not an official one. Nothing here writes files or runs commands.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from enum import Enum

from torchforge import data as tables
from torchforge import platforms, sourcestate, versions
from torchforge.data import (BuildEnvEntry, BundleRule, CudaBuild, Data, Fix, JetPack, JetsonDevice, PlatformFacts, Release,
                             Toolkit, WindowsArchive)
from torchforge.magmasource import MagmaSource
from torchforge.sharedflags import normal_arch_list, nvcc_refusal, unknown_release
from torchforge.variant import Options, Request, Selection, magma_id
from torchforge.versions import arch_key, minor, nodot


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


def _nearest_release_value(data: Data, release_key: str, cuda: str, attr: str) -> tuple[str, str] | None:
    """The value of `attr` for `cuda` from the release closest to `release_key` that has one."""
    target = versions.parse(release_key)
    candidates = []
    for key, release in data.pytorch.releases.items():
        build = release.cuda.get(cuda)
        value = getattr(build, attr) if build else None
        if value:
            distance = abs((versions.parse(key).major - target.major) * 100 + versions.parse(key).minor - target.minor)
            candidates.append((distance, -versions.parse(key).minor, key, value))
    if not candidates:
        return None
    _, _, key, value = min(candidates)
    return key, value


def _fix_applies(fix: Fix, package: str, *, pytorch: str | None, cuda: str | None, magma: str | None,
                 jetson: str | None) -> bool:
    if fix.package != package:
        return False
    if fix.pytorch and (pytorch is None or not versions.matches(pytorch, fix.pytorch)):
        return False
    if fix.cuda and (cuda is None or not versions.matches(cuda, fix.cuda)):
        return False
    if fix.magma and (magma is None or not versions.matches(magma, fix.magma)):
        return False
    if fix.jetson_devices is not None and jetson not in fix.jetson_devices:
        return False
    return True


def _applicable_fixes(data: Data, package: str, **conditions: str | None) -> tuple[AppliedFix, ...]:
    return tuple(
        AppliedFix(key, fix) for key, fix in data.fixes.fixes.items()
        if _fix_applies(fix, package, **conditions)  # type: ignore[arg-type]
    )


def _gencode_from_arch_list(arch_list: str) -> tuple[str, ...]:
    """'8.0;9.0+PTX' -> ('80', '90'): the SASS targets (official-builds §2.3: the official lists carry no PTX)."""
    return tuple(dict.fromkeys(a.split("+")[0].replace(".", "") for a in arch_list.split(";") if a))


def _ptx_from_arch_list(arch_list: str | None) -> tuple[str, ...]:
    """'8.0;9.0+PTX' -> ('90',): PTX only where the user asks for it."""
    return tuple(a.split("+")[0].replace(".", "") for a in (arch_list or "").split(";") if a.endswith("+PTX"))


def _cmake_options(data: Data, version: str, gencode: tuple[str, ...], ptx: tuple[str, ...],
                   fixes: tuple[AppliedFix, ...]) -> tuple[str, ...]:
    """The package's cmake options, then its MAGMA generation's way of taking the gencode list, then fixes'."""
    style = data.magma.cmake_styles[data.magma.versions[version].cmake_style]
    values = {
        "{gencode_flags}": "$CUDA_ARCH_LIST",
        "{sm_targets}": " ".join(f"sm_{g}" for g in gencode),
        "{cuda_architectures}": ";".join([*(f"{g}-real" for g in gencode), *(f"{g}-virtual" for g in ptx)]),
    }
    options = []
    for option in style.cmake_options:
        for placeholder, value in values.items():
            option = option.replace(placeholder, value)
        options.append(option)
    return (*data.magma.package.cmake_options, *options, *(o for a in fixes for o in a.fix.cmake_options))


def plan_magma(data: Data, cuda: str, version: str, platform: str, arch_list: str | None = None,
               source: MagmaSource | None = None, patch_digests: tuple[str, ...] = (),
               build_number: int | None = None) -> MagmaPlan:
    """`build_number`: an earlier published build of `version` (magma.toml earlier_builds) instead of the current."""
    warnings: list[str] = []
    magma_version = data.magma.versions[version]
    earlier = magma_version.earlier_builds.get(str(build_number)) if build_number is not None else None
    gencode = _gencode_from_arch_list(arch_list) if arch_list else data.magma.gencode.get(cuda)
    if gencode is None:
        lower = [c for c in data.magma.gencode if versions.parse(c) < versions.parse(cuda)]
        source_cuda = max(lower, key=versions.parse) if lower else min(data.magma.gencode, key=versions.parse)
        accepted = data.arch_set(cuda)
        gencode = tuple(
            g for g in data.magma.gencode[source_cuda]
            if accepted is None or f"{g[:-1]}.{g[-1]}" in accepted
        )
        warnings.append(
            f"no official magma gencode list for CUDA {cuda}: using CUDA {source_cuda}'s, limited to what nvcc {cuda} accepts"
        )
    if not magma_version.build_number_known:
        warnings.append(f"no official magma-cudaXYZ {version} package is known: build number "
                        f"{magma_version.build_number} is conda's default, not an upstream one")
    if magma_version.cmake_style == "gpu-target":
        warnings.append(f"MAGMA {version}: the official cmakelists.patch is not reproduced for this version (no {version} "
                        "tree to check it against); its own GPU_TARGET table decides which arches get code")
    if source is not None and source.kind == "tarball" and source.sha256 != magma_version.sha256:
        warnings.append(f"--magma-source {source.location} is not the MAGMA {version} release tarball (sha256 "
                        f"{source.sha256}, the release's is {magma_version.sha256}): the recipe pins the local file")
    custom: dict[str, object] = {}
    if arch_list:
        custom["gencode"] = [*gencode, *(f"{g}+PTX" for g in _ptx_from_arch_list(arch_list))]
    if source is not None and _custom_source(source, magma_version.sha256):
        custom["source"] = f"sha256:{source.sha256}" if source.sha256 else (source.state or source.location)
    if patch_digests:
        custom["patches"] = list(patch_digests)
    if custom:
        warnings.append(f"not official: custom {', '.join(custom)}")
    published = cuda in data.magma.published.get(version, ())
    if not published:
        warnings.append(f"not official: {data.magma.package.name_prefix}{nodot(cuda)} {version} was never published upstream")
    fixes = _applicable_fixes(data, "magma", pytorch=None, cuda=cuda, magma=version, jetson=None)
    if earlier is not None:
        fixes = tuple(a for a in fixes if a.key not in earlier.without)
        warnings.append(f"MAGMA {version} build {build_number}, the build this PyTorch linked: without "
                        f"{', '.join(earlier.without)} of build {magma_version.build_number} ({earlier.source})")
    for applied in fixes:
        if applied.fix.manual_patch:
            warnings.append(
                f"{applied.key}: {applied.fix.reason}; add {', '.join(applied.fix.manual_patch)} with --magma-patch"
            )
    return MagmaPlan(
        id=magma_id(cuda, version, platform, build_number if earlier else None),
        name=f"{data.magma.package.name_prefix}{nodot(cuda)}",
        version=version,
        build_number=build_number if earlier is not None and build_number is not None else magma_version.build_number,
        cuda=cuda,
        cuda_full=data.cuda.toolkits[cuda].full_version,
        url=data.magma.package.url.format(version=version),
        sha256=magma_version.sha256,
        gencode=gencode,
        ptx=_ptx_from_arch_list(arch_list),
        cmake_options=_cmake_options(data, version, gencode, _ptx_from_arch_list(arch_list), fixes),
        fixes=fixes,
        warnings=tuple(warnings),
        source=source,
        published=published and not custom,
        settings=json.dumps(custom, sort_keys=True),
        earlier_build=earlier is not None,
    )


def _custom_source(source: MagmaSource, release_sha256: str) -> bool:
    """A source that may differ from the release tarball: a tree, or a local tarball with another checksum (a
    mirror URL is pinned to the release's checksum, so it builds the same package)."""
    return source.kind == "tree" or (source.kind == "tarball" and source.sha256 != release_sha256)


def _magma_accepts(data: Data, magma: str, release_key: str) -> bool:
    spec = data.magma.versions[magma].pytorch
    return spec is None or versions.matches(release_key, spec)


def _choose_magma(data: Data, release_key: str, release: Release, cuda: str, source: MagmaSource | None,
                  check: _Checker) -> str | None:
    """The MAGMA of the official build, else the first preferred one this PyTorch accepts; a local
    --magma-source's own version wins when this PyTorch accepts it (a tree is never labelled another version)."""
    build = release.cuda.get(cuda)
    chosen = (build.magma if build else None) or release.magma
    if chosen is None:
        accepted = [v for v in data.magma.preferred if _magma_accepts(data, v, release_key)]
        if not accepted:
            check.refuse(f"no MAGMA in torchforge's data is accepted by PyTorch {release_key}")
            return None
        chosen = accepted[0]
        check.warn(f"the sources name no MAGMA for PyTorch {release_key}: using MAGMA {chosen}, the first of "
                   f"magma.toml's preferred versions ({', '.join(data.magma.preferred)}) that its source accepts")
    if source is None or source.version is None or source.version == chosen:
        return chosen
    where = f"--magma-source {source.location} is MAGMA {source.version} (its {'tree' if source.kind == 'tree' else 'tarball'}'s include/magma_types.h)"
    if source.version not in data.magma.versions:
        check.refuse(f"{where}, which torchforge's data does not know; known: {', '.join(data.magma.versions)}")
        return None
    if not _magma_accepts(data, source.version, release_key):
        check.refuse(f"{where}, but PyTorch {release_key}'s source rejects MAGMA {source.version} "
                     f"(it needs PyTorch {data.magma.versions[source.version].pytorch}); pass a MAGMA {chosen} source, or choose a "
                     f"--pytorch release that accepts MAGMA {source.version}")
        return None
    check.not_official.append(f"MAGMA {source.version} from --magma-source instead of {chosen}")
    return source.version


def _linked_magma_build(release: Release, cuda: str, magma_version: str, check: _Checker) -> int | None:
    """The earlier magma build the official package linked (pytorch.toml magma_build), when that MAGMA is built."""
    build = release.cuda.get(cuda)
    if build is None or build.magma_build is None or magma_version != (build.magma or release.magma):
        return None
    if build.magma_evidence:
        check.warn(f"MAGMA {magma_version} build {build.magma_build} is inferred: {build.magma_evidence}")
    return build.magma_build


def _no_build(release_key: str, release: Release, cuda: str) -> str:
    """Why the release has no CUDA table for `cuda`: upstream built none, or (cuda_incomplete) the sources
    torchforge could read do not say whether it did."""
    if release.cuda_incomplete and cuda not in release.cuda:
        return (f"whether PyTorch {release_key} had an upstream CUDA {cuda} build, and with which cuDNN and NCCL, "
                f"is not known: {release.cuda_incomplete}")
    return f"no official PyTorch {release_key} build for CUDA {cuda}"


def newest_cuda_major(release: Release) -> int | None:
    """The newest CUDA major the release was built with upstream: its sources predate any newer one."""
    majors = [versions.parse(c).major for c in release.cuda]
    return max(majors) if majors else None


def _python_hint(data: Data, python: str) -> str:
    supporting = [
        k for k, r in data.pytorch.releases.items()
        if versions.parse(r.python[0]) <= versions.parse(python) <= versions.parse(r.python[1])
    ]
    if not supporting:
        return "no PyTorch release in torchforge's data supports that Python"
    return f"PyTorch {supporting[0]} to {supporting[-1]} support Python {python}"


class _Checker:
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


def _jetson_device(data: Data, request: Request, check: _Checker) -> tuple[str, JetsonDevice, JetPack] | None:
    key = request.options.jetson
    if key is None and request.platform == "linux-aarch64" and request.options.arch_list:
        tegra = {a: d for a, d in data.jetson.tegra_arch.items()
                 if a in [x.split("+")[0] for x in request.options.arch_list.split(";")]}
        if tegra:
            key = next(iter(tegra.values()))
            check.warn(f"arch {next(iter(tegra))} is Tegra-only: using the Jetson profile '{key}'")
    if key is None:
        return None
    if key not in data.jetson.devices:
        check.refuse(f"unknown Jetson profile {key!r}; known: {', '.join(data.jetson.devices)}")
        return None
    if request.platform != "linux-aarch64":
        check.refuse(f"the Jetson profile {key!r} targets linux-aarch64, not {request.platform}; add --platform linux-aarch64")
        return None
    device = data.jetson.devices[key]
    return key, device, data.jetson.jetpacks[device.jetpack]


# Variables torchforge itself sets or checks: from --env they are validated like the options they stand for.
_SWITCHES = ("USE_CUDA", "USE_MAGMA", "DEBUG")
_OPTION_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "DEBUG")  # --arch-list and --debug
_UNCHANGED_BINARY = ("MAX_JOBS",)  # as --jobs: how many compilers run, not what they make

def _apply_env_options(request: Request, check: _Checker) -> Request:
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
           if name not in _OPTION_VARIABLES + _UNCHANGED_BINARY}
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


def describe_settings(settings: dict[str, object]) -> str:
    """The recorded settings of a package for a message: 'arch list 8.0;9.0, env USE_NCCL=0, source git tree ...'."""
    if not settings:
        return "upstream's settings"
    parts = []
    for key, value in sorted(settings.items()):
        if value == "":  # e.g. the arch list of a cpu build: nothing to say
            continue
        if key == "env" and isinstance(value, dict):
            value = " ".join(f"{name}={text}" for name, text in value.items())
        elif key == "source":
            value = sourcestate.describe(str(value))
        elif isinstance(value, list):
            value = ";".join(str(v)[:12] for v in value)
        parts.append(f"{key.replace('_', ' ')} {value}" if value is not True else key)
    return ", ".join(parts)


def settings_hash(settings: dict[str, object]) -> str | None:
    if not settings:
        return None
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


Jetson = tuple[str, JetsonDevice, JetPack]


@dataclass(frozen=True)
class _Subject:
    """What the rules of `classify` read: one request, its release's facts, its toolkit and its platform."""

    data: Data
    request: Request
    release_key: str
    release: Release
    cuda: str | None
    toolkit: Toolkit | None
    here: platforms.Platform
    jetson: Jetson | None = None

    @property
    def facts(self) -> PlatformFacts:
        return self.here.facts

    @property
    def build(self) -> CudaBuild | None:
        return self.release.cuda.get(self.cuda) if self.cuda else None


def classify(request: Request, data: Data | None = None) -> Variant:
    """The variant of one request: refused (with every reason), buildable or official, by a fixed order of rules."""
    data = data or tables.load()
    check = _Checker(data, request)
    request = _apply_env_options(request, check)
    subject = _subject(data, request, check)
    if subject is None:
        return Variant(request, Status.REFUSED, tuple(check.refusals), release_key=minor(request.pytorch))
    _rule_python(subject, check)
    _rule_cuda_major(subject, check)
    _rule_cuda_on_platform(subject, check)
    subject = replace(subject, jetson=_jetson_device(data, request, check))
    _rule_jetson(subject, check)
    arch_list = _resolve_arch_list(data, request, subject.release_key, subject.release, subject.cuda, subject.jetson,
                                   check)
    cudnn, nccl = _cudnn_and_nccl(subject, check)
    _rule_host_compiler(subject, check)
    _rule_official(subject, check)
    fixes = _applicable_fixes(data, "pytorch", pytorch=request.pytorch, cuda=subject.cuda, magma=None,
                              jetson=subject.jetson[0] if subject.jetson else None)
    for applied in fixes:
        check.warn(f"applying fix {applied.key}: {applied.fix.reason}")
    magma = _magma_of(subject, check)
    return _variant(subject, check, arch_list, cudnn, nccl, fixes, magma)


def _subject(data: Data, request: Request, check: _Checker) -> _Subject | None:
    """The release and toolkit of the request; None (with the refusals) where either is unknown."""
    release_key = minor(request.pytorch)
    release: Release | None = data.pytorch.releases.get(release_key)
    why_not = unknown_release(request.pytorch, data)
    if why_not:
        check.refuse(why_not)
    if release is None:
        jetson_limit = _jetson_limit_hint(data, request)
        if jetson_limit:
            check.refuse(jetson_limit)
    cuda = request.accel if request.is_cuda else None
    toolkit = data.cuda.toolkits.get(cuda) if cuda else None
    if cuda and toolkit is None:
        check.refuse(f"CUDA {cuda} is not a known toolkit; known: {', '.join(data.cuda.toolkits)}, or cpu")
    if release is None or (cuda and toolkit is None):
        return None
    return _Subject(data, request, release_key, release, cuda, toolkit, platforms.get(request.platform))


def _rule_python(s: _Subject, check: _Checker) -> None:
    """The release's Python range (the platform's own where it has one)."""
    request, release = s.request, s.release
    py_range = s.here.python_range(release, request.pytorch)
    low, high = (versions.parse(v) for v in py_range)
    if request.python in release.conda_experimental:
        check.warn(f"Python {request.python} was experimental for PyTorch {s.release_key} (conda packages were published)")
    elif request.python in release.python_experimental:
        check.not_official.append(f"Python {request.python} was experimental for PyTorch {s.release_key}")
    elif not low <= versions.parse(request.python) <= high:
        where = f" on {request.platform}" if py_range == release.python_win and s.facts.windows else ""
        who = request.pytorch if py_range != release.python and where == "" else s.release_key
        check.refuse(
            f"PyTorch {who} supports Python {py_range[0]} to {py_range[1]}{where}, not {request.python}; "
            f"{_python_hint(s.data, request.python)}"
        )


def _rule_cuda_major(s: _Subject, check: _Checker) -> None:
    """A CUDA major newer than every build of the release: its sources predate that toolkit."""
    newest_major = newest_cuda_major(s.release)
    if s.cuda and newest_major is not None and versions.parse(s.cuda).major > newest_major:
        newest = max(s.release.cuda, key=versions.parse)
        check.refuse(
            f"PyTorch {s.release_key}'s sources predate CUDA {versions.parse(s.cuda).major} (its newest upstream build is "
            f"CUDA {newest}); choose CUDA {newest} or older, or a newer PyTorch"
        )


def _rule_cuda_on_platform(s: _Subject, check: _Checker) -> None:
    """The platform builds CUDA at all, and the CUDA is not below the release's floor."""
    if s.cuda and not s.facts.cuda:
        check.refuse(f"{s.request.platform} builds have no CUDA (PyTorch on macOS is CPU, with MPS on Apple silicon); "
                     f"use --cuda cpu")
    if s.cuda and s.release.min_cuda and versions.parse(s.cuda) < versions.parse(s.release.min_cuda):
        check.refuse(f"PyTorch {s.release_key} requires CUDA {s.release.min_cuda} or newer (its CMake refuses CUDA {s.cuda})")


def _rule_jetson(s: _Subject, check: _Checker) -> None:
    """A Jetson profile: its JetPack's CUDA, Python and newest PyTorch."""
    if not s.jetson:
        return
    _, device, jetpack = s.jetson
    if s.cuda is None:
        check.refuse(f"{device.name} profiles build CUDA; pass --cuda {jetpack.cuda[0]}")
    elif s.cuda not in jetpack.cuda:
        check.refuse(f"{device.name} (JetPack {device.jetpack}) runs CUDA {', '.join(jetpack.cuda)}, not {s.cuda}")
    if s.request.python not in jetpack.python:
        message = f"{device.name} (JetPack {device.jetpack}) ships Python {', '.join(jetpack.python)}"
        if jetpack.python_strict:
            check.refuse(f"{message}; no other CPython exists there, so --py {jetpack.python[0]} is required")
        else:
            check.warn(f"{message}; Python {s.request.python} must be installed separately")
    if jetpack.max_pytorch and versions.parse(s.release_key) > versions.parse(jetpack.max_pytorch):
        check.refuse(
            f"{device.name} (JetPack {device.jetpack}) can run PyTorch {jetpack.max_pytorch} at most "
            f"(newer releases need a newer Python or CUDA than JetPack {device.jetpack} has); use --pytorch {jetpack.max_pytorch}.x"
        )
    check.not_official.append(f"{device.name} builds are not published as conda packages")


def _cudnn_and_nccl(s: _Subject, check: _Checker) -> tuple[str | None, str | None]:
    """The cuDNN and NCCL of a CUDA variant: the JetPack's, the official build's (a patch release's own), or the
    nearest release's cuDNN with a warning; refused where none is known."""
    cuda, release, build = s.cuda, s.release, s.build
    if not cuda:
        return None, None
    cudnn = nccl = None
    if s.jetson:
        cudnn = s.jetson[2].cudnn
    elif build and build.cudnn:
        cudnn, nccl = build.cudnn, build.nccl
        patch_cudnn = release.patch.get(s.request.pytorch)
        if patch_cudnn and cuda in patch_cudnn.cudnn:
            cudnn = patch_cudnn.cudnn[cuda]
    else:
        nearest = _nearest_release_value(s.data, s.release_key, cuda, "cudnn")
        if nearest:
            cudnn = nearest[1]
            check.warn(f"{_no_build(s.release_key, release, cuda)}: using cuDNN {cudnn} as PyTorch {nearest[0]} did")
    if cudnn is None:
        check.refuse(f"no cuDNN version is known for CUDA {cuda}; choose a CUDA listed for PyTorch {s.release_key}: "
                     f"{', '.join(release.cuda) or 'cpu only'}")
    elif not s.jetson and versions.parse(cudnn) >= versions.parse("8.3"):
        rule = bundle_rule(s.data, s.request, cuda)
        if rule is None or not any(lib.dir == "cudnn" for lib in rule.libs):
            check.warn(f"cuDNN {cudnn} cannot be linked statically and no bundling rule covers PyTorch "
                       f"{s.request.pytorch} with CUDA {cuda} on {s.request.platform}: libcudnn must come from "
                       f"the environment, and the RPATH audit fails the package without it")
    return cudnn, nccl


def _rule_host_compiler(s: _Subject, check: _Checker) -> None:
    """--gcc against nvcc's newest host compiler and the release's C++ standard."""
    gcc, toolkit, release = s.request.options.gcc, s.toolkit, s.release
    if not gcc:
        return
    if toolkit and toolkit.max_gcc is not None and versions.parse(gcc).major > toolkit.max_gcc:
        check.refuse(
            f"nvcc {s.cuda} accepts GCC {toolkit.max_gcc} at most, not {gcc} (crt/host_config.h); install gcc-{toolkit.max_gcc} "
            f"and point CC/CXX at it, or choose a newer CUDA (-allow-unsupported-compiler exists but is unsupported)"
        )
    if release.min_gcc and versions.parse(gcc) < versions.parse(release.min_gcc):
        check.refuse(f"PyTorch {s.release_key} is C++{release.cxx_standard} and needs GCC {release.min_gcc} or newer, not {gcc}")
    elif release.min_gcc is None and release.cxx_standard >= 20:
        known = [(k, r.min_gcc) for k, r in s.data.pytorch.releases.items() if r.min_gcc]
        hint = "; ".join(f"PyTorch {k} needs GCC {v}" for k, v in known[-1:])
        check.warn(f"the sources read give no minimum GCC for PyTorch {s.release_key} (C++{release.cxx_standard}"
                   f"{'; ' + hint if hint else ''}): GCC {gcc} is checked against nvcc only")


def _rule_official(s: _Subject, check: _Checker) -> None:
    """Why the variant is not one the pytorch channel published (none: it is official)."""
    request, release, release_key, platform, build = s.request, s.release, s.release_key, s.request.platform, s.build
    patch_facts = release.patch.get(request.pytorch)
    if patch_facts and patch_facts.conda_official is False:
        check.not_official.append(f"PyTorch {request.pytorch}'s conda packages are not in torchforge's official table")
    elif not release.conda_official:
        check.not_official.append(f"PyTorch {release_key} was never published as a conda package (2.5 was the last)")
    if s.cuda and not (build and build.conda):
        check.not_official.append(f"PyTorch {release_key} had no official conda build for CUDA {s.cuda}")
    elif build and build.conda_platforms is not None and platform not in build.conda_platforms:
        check.not_official.append(
            f"PyTorch {release_key}'s official CUDA {s.cuda} conda packages were built for {', '.join(build.conda_platforms)} only")
    if not s.facts.conda_official(release_key):
        shipped = [p for p in tables.PLATFORMS if s.data.platform(p).conda_official(release_key)]
        check.not_official.append(
            f"official conda packages of PyTorch {release_key} exist for {', '.join(shipped)} only, not {platform}")
    options = request.options
    for given, reason in ((options.arch_list, "custom arch list"), (options.debug, "debug build"),
                          (options.extra_env, "extra build environment"), (options.patch_digests, "extra patches"),
                          (options.source, "source other than upstream's tag")):
        if given:
            check.not_official.append(reason)
    if s.toolkit and s.toolkit.arch_set is None:
        check.warn(f"the nvcc arch window of CUDA {s.cuda} is not in torchforge's data: arch values are not checked")


def _magma_of(s: _Subject, check: _Checker) -> MagmaPlan | None:
    """MAGMA, once per CUDA version, Linux x86_64 only (USE_MAGMA=0 leaves it out, =1 asks for it)."""
    request, cuda, platform, jetson = s.request, s.cuda, s.request.platform, s.jetson
    use_magma = dict(request.options.extra_env).get("USE_MAGMA")
    if use_magma == "0":
        if cuda and s.facts.magma and not jetson:
            check.warn("USE_MAGMA=0: built without MAGMA (no magma-cuda package; GPU linear algebra falls back)")
    elif use_magma == "1" and cuda and (not s.facts.magma or jetson):
        check.refuse(f"--env USE_MAGMA=1: torchforge has no magma-cuda package for {platform}"
                     f"{' Jetson builds' if jetson else ''}; drop it")
    elif cuda and s.facts.magma and not jetson:
        magma_version = _choose_magma(s.data, s.release_key, s.release, cuda, request.options.magma_source, check)
        if magma_version is not None:
            return plan_magma(s.data, cuda, magma_version, platform, request.options.arch_list,
                              request.options.magma_source, request.options.magma_patch_digests,
                              _linked_magma_build(s.release, cuda, magma_version, check))
    elif cuda and platform == "linux-aarch64" and not jetson:
        check.warn("no magma-cuda package for aarch64 (upstream builds aarch64 CUDA with USE_MAGMA=0)")
    return None


def _variant(s: _Subject, check: _Checker, arch_list: str | None, cudnn: str | None, nccl: str | None,
             fixes: tuple[AppliedFix, ...], magma: MagmaPlan | None) -> Variant:
    """The verdict: refused with every reason, else buildable (why not official) or official, and its build facts."""
    request, release, toolkit, cuda = s.request, s.release, s.toolkit, s.cuda
    status = Status.REFUSED if check.refusals else (Status.BUILDABLE if check.not_official else Status.OFFICIAL)
    warnings = [*(f"not official: {reason}" for reason in check.not_official), *check.warnings]
    if status is Status.REFUSED:
        return Variant(request, status, tuple(check.refusals), tuple(warnings), release_key=s.release_key)
    return Variant(
        request=request,
        status=status,
        warnings=tuple(warnings),
        release_key=s.release_key,
        cuda_full=toolkit.full_version if toolkit else None,
        cudnn=cudnn,
        nccl=nccl,
        arch_list=arch_list,
        build_string=build_string(request.python, s.here.cuda_tag(release, toolkit, cuda), cudnn,
                                  request.options.build_number, request.platform, debug=request.options.debug,
                                  custom=settings_hash(variant_settings(request)),
                                  accel_part=s.facts.build_string == "accel"),
        magma=magma,
        jetson=s.jetson[0] if s.jetson else None,
        fixes=fixes,
        env=_build_env(s.data, request, release, cuda, cudnn, arch_list, s.jetson, fixes),
        settings=json.dumps(variant_settings(request), sort_keys=True),
    )


def _jetson_limit_hint(data: Data, request: Request) -> str | None:
    """For a release outside the data on a Jetson profile: the newest release that device and JetPack can build."""
    key = request.options.jetson
    device = data.jetson.devices.get(key) if key else None
    if device is None:
        return None
    jetpack = data.jetson.jetpacks[device.jetpack]
    if jetpack.max_pytorch is None:
        return None
    return (f"{device.name} (JetPack {device.jetpack}: CUDA {', '.join(jetpack.cuda)}, Python "
            f"{', '.join(jetpack.python)}) can build PyTorch {jetpack.max_pytorch} at most; use --pytorch "
            f"{_newest_patch(data, jetpack.max_pytorch)}")


def _patches(data: Data, release_key: str) -> tuple[str, ...]:
    """The patch releases of X.Y; X.Y.0 alone where the sources list none."""
    return data.pytorch.patch_releases.get(release_key) or (f"{release_key}.0",)


def _newest_patch(data: Data, release_key: str) -> str:
    return max(_patches(data, release_key), key=versions.parse)


def _check_arch(data: Data, cuda: str, arch: str, release_key: str, release: Release, check: _Checker) -> None:
    base = arch.split("+")[0]
    outside = nvcc_refusal(cuda, arch, data)
    if outside:
        check.refuse(outside)
    if release.max_arch and arch_key(base) > arch_key(release.max_arch):
        check.warn(f"PyTorch {release_key}'s arch parser stops at {release.max_arch}; {base} may be rejected at configure time")


def _arch_example(data: Data, cuda: str) -> str:
    """An --arch-list example that nvcc `cuda` accepts (the newest two numeric arches of its window)."""
    accepted = data.arch_set(cuda)
    if accepted is None:
        return ""
    numeric = sorted((a for a in accepted if not a[-1].isalpha()), key=arch_key)
    return f", e.g. '{';'.join(numeric[-2:])}'"


def _resolve_arch_list(data: Data, request: Request, release_key: str, release: Release, cuda: str | None,
                       jetson: tuple[str, JetsonDevice, JetPack] | None, check: _Checker) -> str | None:
    if cuda is None:
        if request.options.arch_list:
            check.warn("--arch-list has no effect on a cpu build")
        return None
    if request.options.arch_list:
        arch_list = request.options.arch_list
    elif jetson:
        arch_list = jetson[1].arch
    else:
        build = release.cuda.get(cuda)
        arch_list = None
        if build:
            arch_list = platforms.get(request.platform).conda_arch(build) or build.wheel_arch
        if arch_list is None:
            nearest = (_nearest_release_value(data, release_key, cuda, "conda_arch")
                       or _nearest_release_value(data, release_key, cuda, "wheel_arch"))
            if nearest is None:
                check.refuse(f"no arch list is known for CUDA {cuda}; pass one with --arch-list{_arch_example(data, cuda)}")
                return None
            parts = nearest[1].split(";")
            if release.max_arch:
                parts = [p for p in parts if arch_key(p) <= arch_key(release.max_arch)]
            arch_list = ";".join(parts)
            unknown = (f"the arch list of a PyTorch {release_key} CUDA {cuda} build is not known"
                       if release.cuda_incomplete and cuda not in release.cuda
                       else f"no official arch list for PyTorch {release_key} with CUDA {cuda}")
            check.warn(f"{unknown}: using PyTorch {nearest[0]}'s ({arch_list})")
    for arch in arch_list.split(";"):
        if not arch:
            continue
        if not versions.is_valid_version(arch.split("+")[0].rstrip("af")):
            check.refuse(f"{arch!r} is not an arch value; write them like '8.0;8.6;9.0+PTX'")
            continue
        _check_arch(data, cuda, arch, release_key, release, check)
    return arch_list


def bundle_rule(data: Data, request: Request, cuda: str | None) -> BundleRule | None:
    """The libraries upstream's recipe copied into torch/lib for this CUDA variant (bundle.toml), if any.

    Callers pass cuda=None for Jetson builds: they take cuDNN and CUPTI from JetPack on the device.
    """
    facts = platforms.get(request.platform).facts
    if cuda is None or facts.family not in ("linux", "win"):
        return None
    rules = data.bundle.win if facts.windows else data.bundle.linux
    for rule in rules:
        if versions.matches(request.pytorch, rule.pytorch) and versions.matches(cuda, rule.cuda):
            return rule
    return None


@dataclass(frozen=True)
class BundledFile:
    """One library (or glob) the build script copies into torch/lib: `dir_var` overrides `dir_default`."""

    dir_var: str
    dir_default: str  # in the platform's shell syntax ($CUDA_HOME/lib64, %CUDA_PATH%\bin)
    name: str
    optional: bool = False


def bundled_files(data: Data, request: Request, cuda: str | None) -> tuple[BundledFile, ...]:
    """The files the variant's bundling step copies, names with {cuda}/{cuda_major} filled in."""
    rule = bundle_rule(data, request, cuda)
    if rule is None or cuda is None:
        return ()
    dirs = data.bundle.win_dirs if platforms.get(request.platform).facts.windows else data.bundle.linux_dirs
    return tuple(
        BundledFile(dirs[lib.dir].var, dirs[lib.dir].default,
                    lib.name.format(cuda=cuda, cuda_major=cuda.split(".")[0]), lib.optional)
        for lib in rule.libs
    )


def bundled_cudnn(variant: Variant, data: Data | None = None) -> str:
    """The cuDNN (full version, the build string's) a Linux CUDA variant copies into torch/lib; "" when it
    bundles none (cpu, Jetson, Windows, or a statically linked cuDNN)."""
    data = data or tables.load()
    request = variant.request
    if not request.is_cuda or variant.jetson or not variant.cudnn or data.platform(request.platform).family != "linux":
        return ""
    files = bundled_files(data, request, request.accel)
    return variant.cudnn if any(f.dir_var == data.bundle.linux_dirs["cudnn"].var for f in files) else ""


def _env_entry_applies(entry: BuildEnvEntry, request: Request, cuda: str | None) -> bool:
    # `when` "linux"/"osx" is the platform's business (platforms.Platform.env_value)
    if entry.when == "cuda" and cuda is None or entry.when == "cpu" and cuda is not None:
        return False
    if entry.pytorch and not versions.matches(request.pytorch, entry.pytorch):
        return False
    if entry.cuda and (cuda is None or not versions.matches(cuda, entry.cuda)):
        return False
    return not (entry.python and not versions.matches(request.python, entry.python))


def windows_magma(data: Data, request: Request, cuda: str | None) -> WindowsArchive | None:
    """The prebuilt MAGMA archive upstream's bld.bat linked, for a Windows CUDA variant of its releases."""
    if cuda is None or not platforms.get(request.platform).facts.windows:
        return None
    return next((m for m in data.eras.windows_magma if versions.matches(request.pytorch, m.pytorch)), None)


def windows_mkl(data: Data, request: Request) -> WindowsArchive | None:
    """The static MKL archive upstream's bld.bat put first on the include and library paths (up to 2.2)."""
    if not platforms.get(request.platform).facts.windows:
        return None
    return next((m for m in data.eras.windows_mkl if versions.matches(request.pytorch, m.pytorch)), None)


def _build_env(data: Data, request: Request, release: Release, cuda: str | None, cudnn: str | None,
               arch_list: str | None,
               jetson: tuple[str, JetsonDevice, JetPack] | None,
               fixes: tuple[AppliedFix, ...]) -> tuple[tuple[str, str], ...]:
    """The exports of build.sh, in order; later entries override earlier ones with the same name."""
    here = platforms.get(request.platform)
    facts = here.facts
    env: dict[str, str] = {}
    for entry in data.eras.build_env:
        if not _env_entry_applies(entry, request, cuda):
            continue
        value = here.env_value(entry)
        if value is not None:
            env[entry.name] = value
    if facts.family == "linux":
        # also where upstream's compiler chose the old ABI itself (1.9-1.11: pytorch.toml, cxx11_abi)
        env["_GLIBCXX_USE_CXX11_ABI"] = "1" if release.cxx11_abi else "0"
    if cuda:
        assert arch_list is not None
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
        # A bundled cuDNN is linked dynamically; otherwise the release's default, except that cuDNN >= 8.3
        # ships no single static archive (official-builds §1.7).
        rule = bundle_rule(data, request, None if jetson else cuda)
        bundles_cudnn = rule is not None and any(lib.dir == "cudnn" for lib in rule.libs)
        static = (release.static_cudnn and not bundles_cudnn and cudnn is not None
                  and versions.parse(cudnn) < versions.parse("8.3"))
        env["USE_STATIC_CUDNN"] = "1" if static else "0"
        if release.cusparselt and facts.family == "linux":
            # upstream's bld.bat never set it (release/2.5:conda/pytorch-nightly/bld.bat)
            env["USE_CUSPARSELT"] = "1"
        if jetson or (not facts.magma and windows_magma(data, request, cuda) is None):
            env["USE_MAGMA"] = "0"
    if jetson:
        _, _, jetpack = jetson
        if not jetpack.nccl:
            env.update({"USE_NCCL": "0", "USE_SYSTEM_NCCL": "0", "USE_DISTRIBUTED": "0"})
            env.pop("USE_STATIC_NCCL", None)
            env.pop("NCCL_ROOT_DIR", None)
        for name, value in data.jetson.build_env.items():
            env[name] = f"${{{name}:-{value}}}"
    if request.options.debug:
        env["DEBUG"] = "1"
    for applied in fixes:
        env.update(applied.fix.env)
    env.update(dict(request.options.extra_env))
    return tuple(env.items())


def _cuda_unknown(data: Data, version: str, accels: tuple[str, ...]) -> list[str]:
    """The requested CUDA versions whose upstream builds of `version` torchforge's data may miss."""
    release = data.pytorch.releases[minor(version)]
    return [a for a in accels if release.cuda_incomplete and a != "cpu" and a not in release.cuda]


def default_release(selection: Selection, data: Data | None = None) -> tuple[str, str]:
    """The release to use when none was asked for, and why: the newest release that published official conda
    packages of every requested CUDA x Python on the platform, else the newest that can build them all."""
    data = data or tables.load()
    version, reason = _default_release(replace(selection, options=_release_choosing(selection.options)), data)
    flags = _customising_flags(selection.options)
    if flags:
        reason += f"; {', '.join(flags)} {'makes' if len(flags) == 1 else 'make'} it a custom build"
    return version, reason


def _release_choosing(options: Options) -> Options:
    """The options that may decide the release: the device profile and the host compiler. The others only
    customise a build: a custom build of a release does not mean the release published no packages."""
    return Options(jetson=options.jetson, gcc=options.gcc)


def _customising_flags(options: Options) -> list[str]:
    given = {"--arch-list": options.arch_list, "--debug": options.debug,
             "--env": [name for name, _ in options.extra_env if name not in _UNCHANGED_BINARY],
             "--source": options.source, "--patch": options.patch_digests,
             "--magma-source": options.magma_source, "--magma-patch": options.magma_patch_digests}
    return [flag for flag, value in given.items() if value]


def _default_release(selection: Selection, data: Data) -> tuple[str, str]:
    accels = ", ".join(a if a == "cpu" else f"CUDA {a}" for a in selection.accels)
    what = f"{accels} with Python {', '.join(selection.pythons)} on {selection.platform}"
    newest_first = sorted((v for key in data.pytorch.releases for v in _patches(data, key)), key=versions.parse,
                          reverse=True)
    statuses: dict[str, set[Status]] = {}
    for version in newest_first:
        requests = replace(selection, pytorch=version).requests()
        statuses[version] = {classify(request, data).status for request in requests}
        if statuses[version] == {Status.OFFICIAL}:
            return version, f"PyTorch {version}: the newest release with official conda packages of {what}"
    buildable = [version for version, found in statuses.items() if Status.REFUSED not in found]
    # A release whose data may miss upstream's build of a requested CUDA (cuda_incomplete) would plan it from
    # another release's cuDNN and arch list: an older release whose facts are known comes first.
    known = [version for version in buildable if not _cuda_unknown(data, version, selection.accels)]
    if buildable:
        version = (known or buildable)[0]
        unknown = _cuda_unknown(data, version, selection.accels)
        return version, (f"PyTorch {version}: no release published official conda packages of {what}; "
                         f"{version} is the newest release that can build them"
                         + (f" (its CUDA {', '.join(unknown)} build facts are not known)" if unknown else ""))
    fallback = data.pytorch.defaults.pytorch
    return fallback, f"PyTorch {fallback} (the default): no release in torchforge's data can build {what}"
