"""The schema of the core data tables (torchforge/data/cuda.toml, pytorch, eras, bundle, magma, fixes, jetson,
platforms, companions) as frozen pydantic models, and `Data`, all of them together; torchforge.data loads them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from torchforge import versions


PLATFORMS = ("linux-64", "linux-aarch64", "win-64", "osx-64", "osx-arm64")


class FrozenModel(BaseModel):
    """Base of every data-table model: immutable, and unknown keys are errors (a typo is never ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Meta(FrozenModel):
    source: str


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
