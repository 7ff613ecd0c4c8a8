"""The selection flags every flavour shares (--pytorch, --cuda, --py, --platform, --arch-list, --build-number),
checked once before a flavour is chosen: their one spelling, the values the engines accept, and the releases
torchforge's data can plan. Below every flavour: the official and conda-forge flavours and the commands read
them here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchforge import data as tables
from torchforge import versions
from torchforge.errors import RefusedError, UsageError
from torchforge.versions import arch_key

CPU = "cpu"
_VERSION_XY = re.compile(r"^\d+\.\d+$")
_VERSION_XYZ = re.compile(r"^\d+\.\d+\.\d+$")
_ARCH = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")  # 8.6, 9.0a, 10.0f, 9.0+PTX
# rattler-build reads build.number as an unsigned 64-bit integer and refuses more ("number too large to fit in
# target type"); conda-build takes any integer: the smaller bound is the one every engine accepts.
MAX_BUILD_NUMBER = 2**64 - 1


def split_list(value: str | None) -> list[str]:
    """'11.8, 12.4,cpu' -> ['11.8', '12.4', 'cpu'] (empty entries dropped, order kept, duplicates removed)."""
    if not value:
        return []
    seen: dict[str, None] = {}
    for item in value.split(","):
        item = item.strip()
        if item:
            seen[item] = None
    return list(seen)


def check_build_number(number: int, flag: str = "--build-number", offset: int = 0, why_offset: str = "") -> int:
    """`number` as the engines read it; `offset` is what a flavour adds to it (`why_offset` says what)."""
    if not 0 <= number <= MAX_BUILD_NUMBER:
        raise UsageError(f"{flag} {number} is outside what the engines accept (0 to {MAX_BUILD_NUMBER})",
                         f"give a build number from 0 to {MAX_BUILD_NUMBER}, e.g. {flag} 1")
    if number + offset > MAX_BUILD_NUMBER:
        raise UsageError(f"{flag} {number} makes the package's build number {number + offset} ({why_offset} add "
                         f"{offset}), more than the engines accept ({MAX_BUILD_NUMBER})",
                         f"give {flag} {MAX_BUILD_NUMBER - offset} or less")
    return number


def normal_arch_list(arch_list: str) -> str:
    """One spelling per set of arches: PyTorch splits the list at ';' and blanks, and the order and repeats of its
    entries change no binary, so '9.0;8.0', '8.0;;9.0' and '8.0 9.0' all become '8.0;9.0'. A list with a value
    that is not an arch is left in its order (check_arch_list refuses it)."""
    parts = list(dict.fromkeys(p for p in re.split(r"[;\s]+", arch_list) if p))
    try:
        return ";".join(sorted(parts, key=lambda p: (arch_key(p), p)))
    except ValueError:
        return ";".join(parts)


def check_arch_list(arch_list: str | None) -> str | None:
    """--arch-list in its one spelling (normal_arch_list); an entry that is not an arch value is bad input."""
    if arch_list is None:
        return None
    if not arch_list.strip(" ;,"):
        raise UsageError("--arch-list is empty", "give a value, or leave --arch-list out")
    wrong = [p for p in dict.fromkeys(re.split(r"[;\s]+", arch_list)) if p and not _ARCH.match(p)]
    if wrong:
        raise UsageError(f"--arch-list {arch_list!r}: {', '.join(repr(w) for w in wrong)} "
                         f"{'is' if len(wrong) == 1 else 'are'} not an arch value",
                         "write them like '8.0;8.6;9.0+PTX' (X.Y, separated by ';' or blanks)")
    return normal_arch_list(arch_list)


def unknown_release(pytorch: str, tables_data: tables.Data | None = None) -> str | None:
    """Why a release X.Y.Z is not one torchforge can plan (not in its data, or never released), else None."""
    data = (tables_data or tables.load()).pytorch
    release_key = versions.minor(pytorch)
    if release_key not in data.releases:
        known = ", ".join(data.releases)
        oldest = min(data.releases, key=versions.parse)
        if versions.is_valid_version(release_key) and versions.parse(release_key) < versions.parse(oldest):
            return (f"PyTorch {pytorch} predates torchforge's data (its oldest release is {oldest}: the recipes, "
                    f"pins and build strings of older releases are not known); known releases: {known}")
        return f"PyTorch {pytorch} is not in torchforge's data; known releases: {known}"
    if pytorch not in data.patch_releases.get(release_key, (pytorch,)):
        return f"PyTorch {pytorch} was never released; {release_key} had {', '.join(data.patch_releases[release_key])}"
    return None


@dataclass(frozen=True)
class SharedFlags:
    """The selection flags both flavours take, checked once (check_shared_flags); lists as given (empty: the
    flavour's default), the arch list in its one spelling."""

    pytorch: str | None
    accels: tuple[str, ...]
    pythons: tuple[str, ...]
    platform: str | None
    arch_list: str | None
    build_number: int


def check_shared_flags(pytorch: str | None, cuda: str | None, python: str | None, platform: str | None,
                       arch_list: str | None = None, build_number: int = 0) -> SharedFlags:
    """The one validation of the flags every flavour shares, before any flavour is chosen or named: a malformed
    value is bad input (exit 2), a release torchforge cannot plan is refused (exit 4), in both flavours alike."""
    # An empty value is a mistake (an unset shell variable), not a request for the default matrix.
    for flag, value in (("--pytorch", pytorch), ("--cuda", cuda), ("--py", python), ("--platform", platform)):
        if value is not None and not split_list(value):
            raise UsageError(f"{flag} is empty", f"give a value, or leave {flag} out for the default")
    check_build_number(build_number)
    if pytorch is not None and not _VERSION_XYZ.match(pytorch):
        patches = tables.load().pytorch.patch_releases.get(pytorch, ())
        example = (f"--pytorch {patches[-1]} (the newest {pytorch} release)" if patches
                   else f"for example --pytorch {tables.load().pytorch.defaults.pytorch}")
        raise UsageError(f"--pytorch expects a release version X.Y.Z, got {pytorch!r}", example)
    accels, pythons = tuple(split_list(cuda)), tuple(split_list(python))
    for accel in accels:
        if accel != CPU and not _VERSION_XY.match(accel):
            raise UsageError(f"--cuda expects X.Y or cpu, got {accel!r}", "for example --cuda 12.8,cpu")
    for py in pythons:
        if not _VERSION_XY.match(py):
            raise UsageError(f"--py expects X.Y, got {py!r}", "for example --py 3.10,3.12")
    if platform is not None and platform not in tables.PLATFORMS:
        raise UsageError(f"unknown platform {platform!r}", f"use one of {', '.join(tables.PLATFORMS)}")
    arch_list = check_arch_list(arch_list)
    why_not = unknown_release(pytorch) if pytorch is not None else None
    if why_not:
        raise RefusedError(why_not, "give --pytorch X.Y.Z of a listed release, or leave --pytorch out for the default")
    return SharedFlags(pytorch, accels, pythons, platform, arch_list, build_number)


def nvcc_refusal(cuda: str, arch: str, tables_data: tables.Data | None = None) -> str | None:
    """Why nvcc of CUDA X.Y cannot build for `arch` (an --arch-list entry), or None where it can or the window of
    that toolkit is not known."""
    accepted = (tables_data or tables.load()).arch_set(cuda)
    base = arch.split("+")[0]
    if accepted is None or base in accepted:
        return None
    numeric = sorted((a for a in accepted if not a[-1].isalpha()), key=arch_key)
    return (f"GPU arch {base} is outside what nvcc {cuda} accepts ({numeric[0]} to {numeric[-1]}); "
            "drop it from --arch-list or choose a CUDA whose nvcc supports it")
