"""Loads the versioned data files in torchforge/data/ into frozen models, once, and checks them.

The tables are facts copied from ../shared/reference with their sources (each file's [meta] source). Code
never holds a version number; everything version-dependent is looked up here. Cross-table invariants are
checked at load, so a typo in a table fails loudly with the file and key instead of rendering a wrong recipe.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from torchforge import versions
from torchforge.errors import DataError

PLATFORMS = ("linux-64", "linux-aarch64", "win-64", "osx-64", "osx-arm64")


class FrozenModel(BaseModel):
    """Base of every data-table model: immutable, and unknown keys are errors (a typo is never ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")



class Meta(FrozenModel):
    source: str


# ---- cuda.toml -------------------------------------------------------------------------------------------


class Toolkit(FrozenModel):
    full_version: str
    arch_set: str | None = None
    max_gcc: int | None = None
    max_clang: int | None = None
    msvc: tuple[int, int] | None = None
    driver_linux: str | None = None
    compat_floor_linux: str | None = None
    runtime_upper: str


class CudaTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    arch_sets: dict[str, tuple[str, ...]]
    toolkits: dict[str, Toolkit]


# ---- pytorch.toml ----------------------------------------------------------------------------------------


class CudaBuild(FrozenModel):
    conda: bool = False
    wheel: bool = False
    cudnn: str | None = None
    nccl: str | None = None
    magma: str | None = None
    # the magma-cudaXYZ build number linked where it was an earlier build than magma.toml's (versions.X.earlier_builds)
    magma_build: int | None = None
    magma_evidence: str | None = None  # where magma / magma_build are inferred rather than read: why (a warning)
    conda_arch: str | None = None
    conda_arch_win: str | None = None
    wheel_arch: str | None = None
    runtime_upper: str | None = None  # overrides cuda.toml's bound where the release's scripts used another
    conda_platforms: tuple[str, ...] | None = None  # subdirs of the official conda build (None: linux-64 and win-64)


class PatchFacts(FrozenModel):
    """Where one patch release differs from its X.Y table."""

    python: tuple[str, str] | None = None
    cudnn: dict[str, str] = {}
    conda_official: bool | None = None  # overrides the release's flag (1.8.2 lived on the pytorch-lts channel)


class Release(FrozenModel):
    python: tuple[str, str]
    python_experimental: tuple[str, ...] = ()
    conda_experimental: tuple[str, ...] = ()  # experimental Pythons that still got official conda packages
    cxx_standard: int
    min_gcc: str | None = None
    min_cuda: str | None = None
    era: str
    selector: Literal["features", "mutex"]
    cuda_runtime: Literal["cudatoolkit", "pytorch-cuda"]
    static_cudnn: bool
    cusparselt: bool = False
    conda_official: bool
    max_arch: str | None = None
    magma: str | None = None
    triton: str | None = None
    triton_by_patch: dict[str, str] = {}
    triton_python: str | None = None
    triton_source: str | None = None
    triton_package: str = "torchtriton"  # the conda name: pytorch channel's torchtriton (<= 2.5), conda-forge's triton
    triton_subdirs: tuple[str, ...] | None = None  # the conda subdirs its marker admits; None = every non-Windows one
    cxx11_abi: bool = False
    cuda_incomplete: str | None = None  # why the CUDA tables may miss upstream builds (None: all are listed)
    cuda_tag: Literal["xy", "full"] = "xy"  # CUDA in the build string: X.Y, or (<= 1.7) the full toolkit version
    python_win: tuple[str, str] | None = None  # Windows Python range where it differed
    patch: dict[str, PatchFacts] = {}
    cuda: dict[str, CudaBuild] = {}


class Defaults(FrozenModel):
    pytorch: str
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    platform: str
    source_url: str


class PytorchTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    defaults: Defaults
    releases: dict[str, Release]
    patch_releases: dict[str, tuple[str, ...]] = {}


# ---- eras.toml -------------------------------------------------------------------------------------------


class Requirement(FrozenModel):
    spec: str
    python: str | None = None
    pytorch: str | None = None  # PEP 440 specifier on the PyTorch version, where a patch release changed a pin
    platforms: tuple[str, ...] | None = None
    accel: Literal["cuda", "cpu"] | None = None
    line: int | None = None  # line of the era's upstream file that states it
    added: str | None = None  # why torchforge adds a requirement upstream did not have
    # host only: the package's run_exports are ignored, as the official package had no run requirement from it
    ignore_run_exports: bool = False

    check_specifiers = field_validator("python", "pytorch")(versions.checked_specifier)


class Era(FrozenModel):
    source: str | None = None  # upstream file (branch:path) the `line` numbers refer to
    build: tuple[Requirement, ...]
    host: tuple[Requirement, ...]
    run: tuple[Requirement, ...]


class Runtime(FrozenModel):
    pytorch_cuda_versions: tuple[str, ...]
    split_packages: tuple[str, ...]
    mutex_version: str
    cpuonly_version: str


class ScriptEnv(FrozenModel):
    names: tuple[str, ...]
    magma_names: tuple[str, ...]


class BuildEnvEntry(FrozenModel):
    name: str
    value: str
    win: str | None = None
    when: Literal["cuda", "cpu", "linux", "osx"] | None = None
    pytorch: str | None = None  # PEP 440 specifiers: PyTorch X.Y.Z, CUDA X.Y, Python X.Y of the variant
    cuda: str | None = None
    python: str | None = None
    source: str | None = None

    check_specifiers = field_validator("pytorch", "cuda", "python")(versions.checked_specifier)


class WindowsArchive(FrozenModel):
    """A prebuilt archive upstream's bld.bat downloaded: MAGMA (MAGMA_HOME) or the static MKL (MKL_STATIC_DIR)."""

    pytorch: str
    version: str
    url: str  # {version} (and for MAGMA {cuda_nodot}) are filled in
    source: str

    check_specifiers = field_validator("pytorch")(versions.checked_specifier)


class InstallCommands(FrozenModel):
    setup_py: str
    pip: str
    setup_py_win: str
    pip_win: str


class RpathRule(FrozenModel):
    dir: str
    rpath: str


class ErasTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    runtime: Runtime
    script_env: ScriptEnv
    eras: dict[str, Era]
    build_env: tuple[BuildEnvEntry, ...]
    install: InstallCommands
    rpath: tuple[RpathRule, ...]
    windows_magma: tuple[WindowsArchive, ...] = ()
    windows_mkl: tuple[WindowsArchive, ...] = ()


# ---- bundle.toml -----------------------------------------------------------------------------------------


class BundleDir(FrozenModel):
    var: str  # variable that overrides the directory (forwarded through script_env)
    default: str  # the build image's directory, in the platform's shell syntax
    source: str


class BundledLibrary(FrozenModel):
    dir: str  # key into the platform's [dirs]
    name: str  # file name or glob; {cuda} = X.Y, {cuda_major} = X
    optional: bool = False  # copied when present (upstream: `if exist`)


class BundleRule(FrozenModel):
    pytorch: str
    cuda: str
    libs: tuple[BundledLibrary, ...]
    source: str

    check_specifiers = field_validator("pytorch", "cuda")(versions.checked_specifier)


class BundleTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    hash_exempt: tuple[str, ...]  # shell `case` patterns of names kept as they are
    hash_exempt_source: str
    cudnn_version_code: dict[str, tuple[int, int, int]]  # cuDNN major -> multipliers of major, minor, patch
    cudnn_version_code_source: str
    linux_dirs: dict[str, BundleDir]
    win_dirs: dict[str, BundleDir]
    linux: tuple[BundleRule, ...]
    win: tuple[BundleRule, ...]


# ---- magma.toml ------------------------------------------------------------------------------------------


class MagmaPackage(FrozenModel):
    name_prefix: str
    url: str
    cmake_options: tuple[str, ...]


class CmakeStyle(FrozenModel):
    """How the gencode list reaches one generation of MAGMA's CMake (placeholders filled per build)."""

    cmake_options: tuple[str, ...]


class MagmaBuild(FrozenModel):
    """An earlier published build of a MAGMA version: the fixes of the later build it did not have yet."""

    without: tuple[str, ...]  # fixes.toml keys
    source: str


class MagmaVersion(FrozenModel):
    sha256: str
    build_number: int
    earlier_builds: dict[str, MagmaBuild] = {}  # build number -> what it lacked
    build_number_known: bool = True  # False: no official package of this version, the number is conda's default
    cmake_style: str
    pytorch: str | None = None  # PyTorch releases whose source accepts this MAGMA (PEP 440); None: any

    @field_validator("sha256")
    @classmethod
    def _is_sha256(cls, value: str) -> str:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


class MagmaTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    package: MagmaPackage
    preferred: tuple[str, ...]
    cmake_styles: dict[str, CmakeStyle]
    versions: dict[str, MagmaVersion]
    gencode: dict[str, tuple[str, ...]]
    published: dict[str, tuple[str, ...]] = {}  # MAGMA version -> CUDA X.Y of the magma-cudaXYZ packages upstream published


# ---- fixes.toml ------------------------------------------------------------------------------------------


class SourceEdit(FrozenModel):
    kind: Literal["replace", "insert_after", "comment_lines", "comment_range"]
    file: str
    find: str
    replace: str | None = None
    text: str | None = None
    prefix: str | None = None
    until: str | None = None  # comment_range: the last line of the range contains this
    required: bool = True
    fix: str | None = None  # filled in by torchforge with the fix's key (messages name it); never in the data


class Fix(FrozenModel):
    package: Literal["pytorch", "magma"]
    pytorch: str | None = None
    cuda: str | None = None
    magma: str | None = None
    jetson_devices: tuple[str, ...] | None = None
    reason: str
    source: str
    env: dict[str, str] = {}
    edits: tuple[SourceEdit, ...] = ()
    cmake_options: tuple[str, ...] = ()
    manual_patch: tuple[str, ...] = ()
    upstream_patch: str | None = None  # the official patch these edits reproduce (listed in the recipe)


class FixesTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    fixes: dict[str, Fix]


# ---- jetson.toml -----------------------------------------------------------------------------------------


class JetPack(FrozenModel):
    cudnn: str | None = None
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    python_strict: bool
    max_pytorch: str | None = None
    nccl: bool


class JetsonDevice(FrozenModel):
    name: str
    arch: str
    jetpack: str


class JetsonTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    jetpacks: dict[str, JetPack]
    devices: dict[str, JetsonDevice]
    tegra_arch: dict[str, str]
    build_env: dict[str, str]


# ---- platforms.toml --------------------------------------------------------------------------------------


class PlatformFacts(FrozenModel):
    conda_pytorch: str
    cuda: bool
    magma: bool
    build_string: Literal["accel", "number"]
    mutex: bool
    rpath: bool
    windows: bool
    family: Literal["linux", "win", "osx"]

    @field_validator("conda_pytorch")
    @classmethod
    def _is_specifier(cls, value: str) -> str:
        if value and not versions.is_valid_specifier(value):
            raise ValueError(f"not a PEP 440 specifier: {value!r}")
        return value

    def conda_official(self, release_key: str) -> bool:
        return bool(self.conda_pytorch) and versions.matches(release_key, self.conda_pytorch)


class PlatformsTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    platforms: dict[str, PlatformFacts]


# ---- companions.toml -------------------------------------------------------------------------------------


class MutexFacts(FrozenModel):
    name: str
    version: str
    build_number: int
    cuda_build_offset: int


class CpuonlyFacts(FrozenModel):
    build_number: int
    run: tuple[str, ...]


class PytorchCudaVersion(FrozenModel):
    build_number: int
    run: tuple[str, ...]
    run_win: tuple[str, ...]


class PytorchCudaFacts(FrozenModel):
    platforms: tuple[str, ...]
    versions: dict[str, PytorchCudaVersion]


class CompanionsTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    mutex: MutexFacts
    cpuonly: dict[str, CpuonlyFacts]
    pytorch_cuda: PytorchCudaFacts


class Data(FrozenModel):
    cuda: CudaTable
    pytorch: PytorchTable
    eras: ErasTable
    bundle: BundleTable
    magma: MagmaTable
    fixes: FixesTable
    jetson: JetsonTable
    platforms: PlatformsTable
    companions: CompanionsTable

    def platform(self, name: str) -> PlatformFacts:
        return self.platforms.platforms[name]

    def arch_set(self, cuda: str) -> tuple[str, ...] | None:
        key = self.cuda.toolkits[cuda].arch_set
        return None if key is None else self.cuda.arch_sets[key]


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
