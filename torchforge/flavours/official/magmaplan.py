"""The magma-cudaXYZ package of an official variant: the MAGMA release its PyTorch release links, the source
(upstream's tarball, or --magma-source), the gencode list from the arch list, the CMake options and the fixes
that apply to that release and CUDA.
"""

from __future__ import annotations

import json

from torchforge import versions
from torchforge.datamodels import Data, Fix, Release
from torchforge.flavours.official.magmasource import MagmaSource
from torchforge.flavours.official.variant import magma_id
from torchforge.versions import nodot
from torchforge.flavours.official.resolved import (
    AppliedFix, Checker, MagmaPlan)


def nearest_release_value(data: Data, release_key: str, cuda: str, attr: str) -> tuple[str, str] | None:
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


def applicable_fixes(data: Data, package: str, **conditions: str | None) -> tuple[AppliedFix, ...]:
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
    fixes = applicable_fixes(data, "magma", pytorch=None, cuda=cuda, magma=version, jetson=None)
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


def choose_magma(data: Data, release_key: str, release: Release, cuda: str, source: MagmaSource | None,
                  check: Checker) -> str | None:
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


def linked_magma_build(release: Release, cuda: str, magma_version: str, check: Checker) -> int | None:
    """The earlier magma build the official package linked (pytorch.toml magma_build), when that MAGMA is built."""
    build = release.cuda.get(cuda)
    if build is None or build.magma_build is None or magma_version != (build.magma or release.magma):
        return None
    if build.magma_evidence:
        check.warn(f"MAGMA {magma_version} build {build.magma_build} is inferred: {build.magma_evidence}")
    return build.magma_build
