"""Loads the versioned data files in torchforge/data/ into frozen models, once, and checks them.

The tables are facts copied from ../shared/reference with their sources (each file's [meta] source). Code
never holds a version number; everything version-dependent is looked up here. Cross-table invariants are
checked at load, so a typo in a table fails loudly with the file and key instead of rendering a wrong recipe.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from torchforge import versions
from torchforge.errors import DataError
from torchforge.datamodels import (
    BundleTable, CompanionsTable, CudaTable, Data, ErasTable, FixesTable, JetsonTable, MagmaTable,
    PLATFORMS, PlatformsTable, PytorchTable)


_FILES: dict[str, type[BaseModel]] = {
    "cuda": CudaTable,
    "pytorch": PytorchTable,
    "eras": ErasTable,
    "bundle": BundleTable,
    "magma": MagmaTable,
    "fixes": FixesTable,
    "jetson": JetsonTable,
    "platforms": PlatformsTable,
    "companions": CompanionsTable,
}


def data_text(name: str) -> str:
    """The text of torchforge/data/NAME.toml, from a checkout or an installed wheel."""
    return resources.files("torchforge").joinpath("data", f"{name}.toml").read_text(encoding="utf-8")


def parse_toml(text: str, where: str) -> dict[str, object]:
    """Parse a data table; its `schema` key becomes `schema_` (pydantic reserves `schema`)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{where} is not valid TOML: {exc}", "fix the file; the message gives the position") from exc
    raw["schema_"] = raw.pop("schema", 1)
    return raw


TableModel = TypeVar("TableModel", bound=BaseModel)


def validate_table(model: type[TableModel], raw: dict[str, object], where: str, hint: str | None = None) -> TableModel:
    """Validate one parsed data table; a schema mismatch is a DataError naming the file (and `hint`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise DataError(f"{where} does not match its schema:\n{exc}", hint) from exc


def parse_table_as(model: type[TableModel], text: str, where: str, hint: str | None = None) -> TableModel:
    return validate_table(model, parse_toml(text, where), where, hint)


def _read(name: str) -> dict[str, object]:
    return parse_toml(data_text(name), f"torchforge/data/{name}.toml")


@cache
def load() -> Data:
    """All tables, validated and cross-checked. Cached: the files are read once per process."""
    tables: dict[str, BaseModel] = {
        name: validate_table(model, _read(name), f"torchforge/data/{name}.toml") for name, model in _FILES.items()
    }
    data = Data.model_validate(tables)
    problems = check_invariants(data)
    if problems:
        raise DataError("torchforge's data tables are inconsistent:\n  - " + "\n  - ".join(problems))
    return data


def check_invariants(data: Data) -> list[str]:
    """Cross-table checks; each problem names the file and key."""
    return [problem for check in (_cuda_problems, _release_problems, _era_and_bundle_problems, _patch_release_problems,
                                  _magma_problems, _jetson_problems, _fix_problems,
                                  _platform_companion_default_problems)
            for problem in check(data)]


def _cuda_problems(data: Data) -> list[str]:
    """CUDA toolkits and their arch sets (cuda.toml)."""
    problems: list[str] = []
    toolkits = data.cuda.toolkits
    for key, toolkit in toolkits.items():
        if toolkit.arch_set is not None and toolkit.arch_set not in data.cuda.arch_sets:
            problems.append(f"cuda.toml toolkits.{key}.arch_set names unknown set {toolkit.arch_set!r}")
        if not toolkit.full_version.startswith(key + "."):
            problems.append(f"cuda.toml toolkits.{key}.full_version {toolkit.full_version!r} is not a {key}.x release")
    return problems


def _release_problems(data: Data) -> list[str]:
    """Each PyTorch release of pytorch.toml against the eras, MAGMA and CUDA tables."""
    problems: list[str] = []
    toolkits = data.cuda.toolkits
    for rel_key, release in data.pytorch.releases.items():
        where = f"pytorch.toml releases.{rel_key}"
        if release.era not in data.eras.eras:
            problems.append(f"{where}.era names unknown era {release.era!r}")
        if versions.parse(release.python[0]) > versions.parse(release.python[1]):
            problems.append(f"{where}.python range is reversed")
        for magma in filter(None, [release.magma, *(b.magma for b in release.cuda.values())]):
            if magma not in data.magma.versions:
                problems.append(f"{where} links MAGMA {magma}, which magma.toml has no checksum for")
        for cuda_key, build in release.cuda.items():
            if cuda_key not in toolkits:
                problems.append(f"{where}.cuda.{cuda_key}: CUDA {cuda_key} missing from cuda.toml")
                continue
            if build.conda and not release.conda_official:
                problems.append(f"{where}.cuda.{cuda_key} is conda but the release has no official conda packages")
            if build.conda and (build.conda_arch is None or build.cudnn is None):
                problems.append(f"{where}.cuda.{cuda_key}: an official conda build needs conda_arch and cudnn")
            linked = build.magma or release.magma
            if build.magma_build is not None and (linked not in data.magma.versions or str(build.magma_build)
                                                  not in data.magma.versions[linked].earlier_builds):
                problems.append(f"{where}.cuda.{cuda_key}.magma_build {build.magma_build}: magma.toml gives no such "
                                f"earlier build of MAGMA {linked}")
            accepted = data.arch_set(cuda_key)
            for field in ("conda_arch", "conda_arch_win", "wheel_arch"):
                value = getattr(build, field)
                if value is None or accepted is None:
                    continue
                for arch in value.split(";"):
                    if arch.split("+")[0] not in accepted:
                        problems.append(f"{where}.cuda.{cuda_key}.{field}: {arch} is outside what nvcc {cuda_key} accepts")
    return problems


def _era_and_bundle_problems(data: Data) -> list[str]:
    """Eras.toml's requirements cite their source; bundle.toml's rules name known folders."""
    problems: list[str] = []
    for era_key, era in data.eras.eras.items():
        for section in ("build", "host", "run"):
            for req in getattr(era, section):
                if era.source and req.line is None and req.added is None:
                    problems.append(f"eras.toml eras.{era_key}.{section} {req.spec!r} cites no line of {era.source} and gives no reason")
    for platform_key in ("linux", "win"):
        dirs = getattr(data.bundle, f"{platform_key}_dirs")
        for rule in getattr(data.bundle, platform_key):
            for lib in rule.libs:
                if lib.dir not in dirs:
                    problems.append(f"bundle.toml {platform_key} rule for PyTorch {rule.pytorch} names unknown dir {lib.dir!r}")
    return problems


def _patch_release_problems(data: Data) -> list[str]:
    """Pytorch.toml's patch releases and the releases that list them."""
    problems: list[str] = []
    for rel_key, patches in data.pytorch.patch_releases.items():
        if rel_key not in data.pytorch.releases:
            problems.append(f"pytorch.toml patch_releases.{rel_key} names an unknown release")
        problems.extend(f"pytorch.toml patch_releases.{rel_key}: {p} is not a {rel_key}.Z release"
                        for p in patches if versions.minor(p) != rel_key)
    for rel_key, release in data.pytorch.releases.items():
        listed = data.pytorch.patch_releases.get(rel_key, ())
        problems.extend(f"pytorch.toml releases.{rel_key}.patch.{p} is not listed in patch_releases.{rel_key}"
                        for p in release.patch if p not in listed)
        problems.extend(f"pytorch.toml releases.{rel_key}.patch.{p}.cudnn.{c}: no CUDA {c} build in the release"
                        for p, facts in release.patch.items() for c in facts.cudnn if c not in release.cuda)
    return problems


def _magma_problems(data: Data) -> list[str]:
    """Magma.toml against cuda.toml and fixes.toml."""
    problems: list[str] = []
    toolkits = data.cuda.toolkits
    for magma_version, cudas in data.magma.published.items():
        if magma_version not in data.magma.versions:
            problems.append(f"magma.toml published.{magma_version}: no checksum for MAGMA {magma_version}")
        problems.extend(f"magma.toml published.{magma_version}: CUDA {c} missing from cuda.toml"
                        for c in cudas if c not in toolkits)
    for cuda_key in data.magma.gencode:
        if cuda_key not in toolkits:
            problems.append(f"magma.toml gencode.{cuda_key}: CUDA {cuda_key} missing from cuda.toml")
    for version_key, magma in data.magma.versions.items():
        if magma.cmake_style not in data.magma.cmake_styles:
            problems.append(f"magma.toml versions.{version_key}.cmake_style names unknown style {magma.cmake_style!r}")
        if magma.pytorch is not None and not versions.is_valid_specifier(magma.pytorch):
            problems.append(f"magma.toml versions.{version_key}.pytorch is not a PEP 440 specifier")
        for number, earlier in magma.earlier_builds.items():
            where = f"magma.toml versions.{version_key}.earlier_builds.{number}"
            if not number.isdigit() or int(number) >= magma.build_number:
                problems.append(f"{where}: not a build number below {magma.build_number}")
            problems.extend(f"{where}.without names {key}, which is no magma fix in fixes.toml"
                            for key in earlier.without
                            if key not in data.fixes.fixes or data.fixes.fixes[key].package != "magma")
    for version_key in data.magma.preferred:
        if version_key not in data.magma.versions:
            problems.append(f"magma.toml preferred names MAGMA {version_key}, which has no versions entry")
    return problems


def _jetson_problems(data: Data) -> list[str]:
    """Jetson.toml's devices, arches and JetPacks."""
    problems: list[str] = []
    toolkits = data.cuda.toolkits
    for device_key, device in data.jetson.devices.items():
        if device.jetpack not in data.jetson.jetpacks:
            problems.append(f"jetson.toml devices.{device_key}.jetpack names unknown JetPack {device.jetpack}")
    for arch, device_key in data.jetson.tegra_arch.items():
        if device_key not in data.jetson.devices or data.jetson.devices[device_key].arch != arch:
            problems.append(f"jetson.toml tegra_arch.{arch} does not name a device with that arch")
    for jp_key, jetpack in data.jetson.jetpacks.items():
        for cuda_key in jetpack.cuda:
            if cuda_key not in toolkits:
                problems.append(f"jetson.toml jetpacks.{jp_key}: CUDA {cuda_key} missing from cuda.toml")
    return problems


def _fix_problems(data: Data) -> list[str]:
    """Fixes.toml's specifiers, devices and edits."""
    problems: list[str] = []
    for fix_key, fix in data.fixes.fixes.items():
        for field in ("pytorch", "cuda", "magma"):
            spec = getattr(fix, field)
            if spec is not None and not versions.is_valid_specifier(spec):
                problems.append(f"fixes.toml fixes.{fix_key}.{field} is not a PEP 440 specifier")
        for device in fix.jetson_devices or ():
            if device not in data.jetson.devices:
                problems.append(f"fixes.toml fixes.{fix_key} names unknown Jetson device {device!r}")
        for edit in fix.edits:
            needs = {"replace": edit.replace, "insert_after": edit.text, "comment_lines": edit.prefix,
                     "comment_range": edit.prefix and edit.until}[edit.kind]
            if not needs:
                problems.append(f"fixes.toml fixes.{fix_key}: a {edit.kind} edit of {edit.file} lacks its text")
            if edit.fix is not None:
                problems.append(f"fixes.toml fixes.{fix_key}: `fix` is set by torchforge, not in the data")
    return problems


def _platform_companion_default_problems(data: Data) -> list[str]:
    """Platforms.toml, companions.toml against eras.toml, and pytorch.toml's defaults."""
    problems: list[str] = []
    toolkits = data.cuda.toolkits
    if tuple(data.platforms.platforms) != PLATFORMS:
        problems.append(f"platforms.toml must describe exactly {', '.join(PLATFORMS)}, in that order")
    for cuda_key in data.companions.pytorch_cuda.versions:
        if cuda_key not in data.eras.runtime.pytorch_cuda_versions:
            problems.append(f"companions.toml pytorch_cuda.versions.{cuda_key} is not in eras.toml runtime.pytorch_cuda_versions")
    for cuda_key in data.eras.runtime.pytorch_cuda_versions:
        if cuda_key not in data.companions.pytorch_cuda.versions:
            problems.append(f"eras.toml runtime.pytorch_cuda_versions names {cuda_key}, which companions.toml does not define")
    defaults = data.pytorch.defaults
    if versions.minor(defaults.pytorch) not in data.pytorch.releases:
        problems.append(f"pytorch.toml defaults.pytorch {defaults.pytorch} is not a known release")
    for cuda_key in defaults.cuda:
        if cuda_key != "cpu" and cuda_key not in toolkits:
            problems.append(f"pytorch.toml defaults.cuda names unknown CUDA {cuda_key}")
    return problems
