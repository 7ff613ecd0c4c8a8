"""Classify each requested variant (official / buildable / refused) and resolve everything a recipe needs.

Every rule reads the data tables; each refusal says what is wrong and what would work, each warning says
why a buildable variant is not an official one. Nothing here writes files or runs commands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from torchforge import data as tables
from torchforge import platforms, versions
from torchforge.datamodels import CudaBuild, Data, JetPack, JetsonDevice, PlatformFacts, Release, Toolkit
from torchforge.sharedflags import nvcc_refusal, unknown_release
from torchforge.flavours.official.variant import Options, Request, Selection
from torchforge.versions import arch_key, minor
from torchforge.flavours.official.resolved import (
    AppliedFix, Checker, Jetson, MagmaPlan, Status, UNCHANGED_BINARY, Variant, apply_env_options, build_string,
    settings_hash, variant_settings)
from torchforge.flavours.official.magmaplan import applicable_fixes, choose_magma, linked_magma_build, nearest_release_value, plan_magma
from torchforge.flavours.official.bundled import build_env, bundle_rule, cuda_unknown


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


def _jetson_device(data: Data, request: Request, check: Checker) -> tuple[str, JetsonDevice, JetPack] | None:
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
    check = Checker(data, request)
    request = apply_env_options(request, check)
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
    fixes = applicable_fixes(data, "pytorch", pytorch=request.pytorch, cuda=subject.cuda, magma=None,
                              jetson=subject.jetson[0] if subject.jetson else None)
    for applied in fixes:
        check.warn(f"applying fix {applied.key}: {applied.fix.reason}")
    magma = _magma_of(subject, check)
    return _variant(subject, check, arch_list, cudnn, nccl, fixes, magma)


def _subject(data: Data, request: Request, check: Checker) -> _Subject | None:
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


def _rule_python(s: _Subject, check: Checker) -> None:
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


def _rule_cuda_major(s: _Subject, check: Checker) -> None:
    """A CUDA major newer than every build of the release: its sources predate that toolkit."""
    newest_major = newest_cuda_major(s.release)
    if s.cuda and newest_major is not None and versions.parse(s.cuda).major > newest_major:
        newest = max(s.release.cuda, key=versions.parse)
        check.refuse(
            f"PyTorch {s.release_key}'s sources predate CUDA {versions.parse(s.cuda).major} (its newest upstream build is "
            f"CUDA {newest}); choose CUDA {newest} or older, or a newer PyTorch"
        )


def _rule_cuda_on_platform(s: _Subject, check: Checker) -> None:
    """The platform builds CUDA at all, and the CUDA is not below the release's floor."""
    if s.cuda and not s.facts.cuda:
        check.refuse(f"{s.request.platform} builds have no CUDA (PyTorch on macOS is CPU, with MPS on Apple silicon); "
                     f"use --cuda cpu")
    if s.cuda and s.release.min_cuda and versions.parse(s.cuda) < versions.parse(s.release.min_cuda):
        check.refuse(f"PyTorch {s.release_key} requires CUDA {s.release.min_cuda} or newer (its CMake refuses CUDA {s.cuda})")


def _rule_jetson(s: _Subject, check: Checker) -> None:
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


def _cudnn_and_nccl(s: _Subject, check: Checker) -> tuple[str | None, str | None]:
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
        nearest = nearest_release_value(s.data, s.release_key, cuda, "cudnn")
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


def _rule_host_compiler(s: _Subject, check: Checker) -> None:
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


def _rule_official(s: _Subject, check: Checker) -> None:
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


def _magma_of(s: _Subject, check: Checker) -> MagmaPlan | None:
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
        magma_version = choose_magma(s.data, s.release_key, s.release, cuda, request.options.magma_source, check)
        if magma_version is not None:
            return plan_magma(s.data, cuda, magma_version, platform, request.options.arch_list,
                              request.options.magma_source, request.options.magma_patch_digests,
                              linked_magma_build(s.release, cuda, magma_version, check))
    elif cuda and platform == "linux-aarch64" and not jetson:
        check.warn("no magma-cuda package for aarch64 (upstream builds aarch64 CUDA with USE_MAGMA=0)")
    return None


def _variant(s: _Subject, check: Checker, arch_list: str | None, cudnn: str | None, nccl: str | None,
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
        env=build_env(s.data, request, release, cuda, cudnn, arch_list, s.jetson, fixes),
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


def _check_arch(data: Data, cuda: str, arch: str, release_key: str, release: Release, check: Checker) -> None:
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
                       jetson: tuple[str, JetsonDevice, JetPack] | None, check: Checker) -> str | None:
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
            nearest = (nearest_release_value(data, release_key, cuda, "conda_arch")
                       or nearest_release_value(data, release_key, cuda, "wheel_arch"))
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
             "--env": [name for name, _ in options.extra_env if name not in UNCHANGED_BINARY],
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
    known = [version for version in buildable if not cuda_unknown(data, version, selection.accels)]
    if buildable:
        version = (known or buildable)[0]
        unknown = cuda_unknown(data, version, selection.accels)
        return version, (f"PyTorch {version}: no release published official conda packages of {what}; "
                         f"{version} is the newest release that can build them"
                         + (f" (its CUDA {', '.join(unknown)} build facts are not known)" if unknown else ""))
    fallback = data.pytorch.defaults.pytorch
    return fallback, f"PyTorch {fallback} (the default): no release in torchforge's data can build {what}"
