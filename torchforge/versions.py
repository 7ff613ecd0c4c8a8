"""Small version helpers shared by the data loader and the rules (X.Y strings, arch values, specifiers)."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version


def parse(text: str) -> Version:
    return Version(text)


def minor(version: str) -> str:
    """'2.5.1' -> '2.5'."""
    parts = version.split(".")
    return ".".join(parts[:2])


def nodot(version: str) -> str:
    """'12.4' -> '124' (magma-cuda124, cu124)."""
    return version.replace(".", "")


def arch_key(arch: str) -> tuple[int, int, str]:
    """Sort key of an arch value such as '8.6', '9.0a', '12.0' (also '3.7+PTX' with the suffix dropped)."""
    base = arch.split("+")[0]
    suffix = ""
    if base and base[-1].isalpha():
        base, suffix = base[:-1], base[-1]
    major, _, minor_part = base.partition(".")
    return int(major), int(minor_part or 0), suffix


def matches(version: str, specifier: str | None) -> bool:
    """True when `specifier` is empty or `version` satisfies it (prereleases allowed)."""
    if not specifier:
        return True
    return SpecifierSet(specifier).contains(Version(version), prereleases=True)


def is_valid_specifier(specifier: str) -> bool:
    try:
        SpecifierSet(specifier)
    except InvalidSpecifier:
        return False
    return True


def checked_specifier(value: str | None) -> str | None:
    """`value` unchanged when it is None or a PEP 440 specifier; ValueError otherwise (for pydantic validators)."""
    if value is not None and not is_valid_specifier(value):
        raise ValueError(f"not a PEP 440 specifier: {value!r}")
    return value


def is_valid_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True
