"""The conda-forge flavour's facts: the feedstock's tables (data/conda_forge.toml, each value with its commit and
file:line), their models, loading and invariants."""

from __future__ import annotations

import re
from functools import cache
from typing import Literal

from torchforge import versions
from torchforge import data as tables
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import DataError

Accel = Literal["cuda", "cpu"]
Blas = Literal["mkl", "generic"]
# An output's rows in the table: its requirements, and the build keys that say how a solver and conda-build's
# checks treat the package (conda_forge.toml; detect_binary_files_with_prefix holds one value, "false").
OUTPUT_KEYS = ("build", "host", "run", "run_constrained", "run_exports", "ignore_run_exports",
               "ignore_run_exports_from", "track_features", "missing_dso_whitelist", "detect_binary_files_with_prefix")
OutputKey = Literal["build", "host", "run", "run_constrained", "run_exports", "ignore_run_exports",
                    "ignore_run_exports_from", "track_features", "missing_dso_whitelist",
                    "detect_binary_files_with_prefix"]
# subdir -> CUDA target folder (win-64: none, conda-forge's CUDA sits in %LIBRARY_PREFIX%)
PLATFORMS: dict[str, str | None] = {"linux-64": "x86_64-linux", "linux-aarch64": "sbsa-linux", "win-64": None}
WINDOWS = "win-64"
# The .ci_support keys a job's compilers are read from: GCC versions on linux, Visual Studio's packages on Windows.
_CI_COMPILER_KEYS = {"linux": ("c_compiler_version", "cxx_compiler_version", "c_stdlib_version"),
                     "win": ("c_compiler", "cxx_compiler", "c_stdlib")}
_SOURCE = re.compile(r"^[\w./-]+:\d+(-\d+)?(; .+)?$")


class Cited(FrozenModel):
    value: str
    source: str


class CitedList(FrozenModel):
    value: tuple[str, ...]
    source: str


class PythonVariants(CitedList):
    """The job's Pythons: X.Y (what --py names) and the variant value of each, whole (`3.12.* *_cpython`): its
    build-string part picks CPython's build (not free-threading's) wherever conda-build pins python."""

    variant: tuple[str, ...]


class Pin(FrozenModel):
    name: str
    value: str
    source: str


class CiSupport(FrozenModel):
    """The feedstock's variant file of one CUDA (or cpu) job, blas_impl mkl: GCC versions on linux, the Visual
    Studio compiler packages (vs2019, vs2022) on Windows."""

    file: str
    c_compiler_version: Cited | None = None
    cxx_compiler_version: Cited | None = None
    c_stdlib_version: Cited | None = None
    c_compiler: Cited | None = None
    cxx_compiler: Cited | None = None
    c_stdlib: Cited | None = None
    python: PythonVariants
    pins: tuple[Pin, ...]


class JobFact(FrozenModel):
    """A fact of some of the feedstock's jobs: where it applies (absent: every job) and its FILE:LINE."""

    accel: Accel | None = None
    blas: Blas | None = None
    cuda: str | None = None  # where the feedstock builds several CUDAs and the fact is one's only
    source: str


class Row(JobFact):
    """One requirement of one output."""

    output: str
    key: OutputKey
    spec: str


class EnvRow(JobFact):
    """One variable build.sh exports."""

    name: str
    value: str


class PatchFile(JobFact):
    """One source patch the feedstock applies: its path in the feedstock's recipe/ and its checksum."""

    path: str
    sha256: str


class RecipeFacts(FrozenModel):
    requirements: tuple[Row, ...]
    patches: tuple[PatchFile, ...]
    env: tuple[EnvRow, ...]


class Activation(FrozenModel):
    variable: str
    mechanism: Literal["activate.d", "env_vars.d"]
    source: str


class Patches(FrozenModel):
    """The feedstock's source patches at a release: how many entries its meta.yaml lists, and where."""

    count: int
    source: str


class PlatformJobs(FrozenModel):
    """What the feedstock's jobs of one subdir build: CUDA versions, arch lists, variant files, requirements."""

    cuda: tuple[str, ...]
    arch_list: dict[str, Cited]
    # CUDA -> the arch list of the release's earlier builds (its `earlier_builds` commits) for a CUDA its commit
    # no longer builds (2.7.1's first builds had CUDA 12.6): `source` is COMMIT:recipe/build.sh:LINE
    earlier_arch_list: dict[str, Cited] = {}
    ci_support: dict[str, CiSupport]
    recipe: RecipeFacts
    activation: Activation | None = None  # Windows: bld.bat's own (linux: the release's, from build.sh)


class FeedstockRelease(FrozenModel):
    commit: str
    commit_note: str
    # earlier commits of the same release that conda-forge built with CUDA versions `commit` no longer has (their
    # arch lists are read into each platform's earlier_arch_list); chosen by hand, like `commit`
    earlier_builds: tuple[str, ...] = ()
    build_number: int
    build_number_source: str
    cuda_offset_source: str
    mkl_offset_source: str
    triton: str
    triton_source: str
    patches: Patches
    outputs_cuda: tuple[str, ...]
    outputs_cpu: tuple[str, ...]
    activation: Activation | None = None
    platforms: dict[str, PlatformJobs]
    not_built: dict[str, str] = {}  # subdir -> why the feedstock has no job for it at this commit

    def outputs(self, accel: Accel) -> tuple[str, ...]:
        return self.outputs_cuda if accel == "cuda" else self.outputs_cpu


class FlavourSettings(FrozenModel):
    marker: str
    channel: str
    feedstock_files: str  # where a recipe downloads one of the feedstock's files: {commit} and {path} filled in
    blas: dict[str, Blas]
    blas_source: str
    omitted_outputs: dict[str, str]
    magma: str
    visual_studio: dict[str, tuple[int, int]]  # compiler package -> _MSC_VER range


class CompilerFlags(FrozenModel):
    """The feedstock's edits of conda's compiler and linker flags on linux (sed patterns to strip, flags to add)."""

    strip_c: tuple[str, ...]
    strip_cxx: tuple[str, ...]
    add_c: tuple[str, ...]
    add_cxx: tuple[str, ...]
    add_ld: tuple[str, ...]
    source: str


class DroppedLines(FrozenModel):
    file: str
    containing: str
    since: str  # the first release whose build.sh drops them
    source: str


class SourceEdits(FrozenModel):
    """What the feedstock's build.sh changes in PyTorch's source tree before building: files it empties, lines
    it deletes."""

    empty: tuple[str, ...]
    source: str
    drop_lines: tuple[DroppedLines, ...] = ()

    def dropped(self, version: str) -> tuple[DroppedLines, ...]:
        return tuple(d for d in self.drop_lines if versions.parse(version) >= versions.parse(d.since))


class CMakeHandover(FrozenModel):
    """How the feedstock's build.sh hands conda's -DCMAKE_* arguments to PyTorch's CMake (see conda_forge.toml)."""

    library_path: str
    arguments_since: str  # from this release CMAKE_ARGS itself, with the patch that makes setup.py pass it
    arguments_patches: tuple[str, ...]  # that patch's name in the releases' recipe/
    source: str

    def passes_arguments(self, version: str, patches: tuple[tuple[str, str, str], ...]) -> bool:
        """True where setup.py hands $CMAKE_ARGS to CMake: the release's own patch for it is applied."""
        return (versions.parse(version) >= versions.parse(self.arguments_since)
                and any(path in self.arguments_patches for _url, _sha256, path in patches))


class ConsumerTestLine(FrozenModel):
    """One test requirement (`spec`) or command (`line`) of libtorch's CMake consumer test, for the releases
    from `since` up to (not including) `until`, and for `accel` (cpu | cuda) where given."""

    spec: str = ""
    line: str = ""
    accel: str | None = None
    since: str | None = None
    until: str | None = None

    def applies(self, version: str, cuda: bool) -> bool:
        release = versions.parse(version)
        return ((self.accel is None or self.accel == ("cuda" if cuda else "cpu"))
                and (self.since is None or release >= versions.parse(self.since))
                and (self.until is None or release < versions.parse(self.until)))


class ConsumerTest(FrozenModel):
    """libtorch's test of its CMake metadata as the feedstock has it: test requirements and commands."""

    requires: tuple[ConsumerTestLine, ...]
    commands: tuple[ConsumerTestLine, ...]
    source: str

    def for_release(self, version: str, cuda: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(test requirements, commands) of one release and accelerator."""
        return (tuple(r.spec for r in self.requires if r.applies(version, cuda)),
                tuple(c.line for c in self.commands if c.applies(version, cuda)))


class CondaForgeTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    flavour: FlavourSettings
    compiler_flags: CompilerFlags
    source_edits: SourceEdits
    cmake: CMakeHandover
    consumer_test: ConsumerTest
    releases: dict[str, FeedstockRelease]


# The feedstock's build-number offsets: the solver prefers CUDA builds (+200) and MKL builds (+100) where they can
# be installed. The offsets are the feedstock's; each release cites the lines that add them.
CUDA_OFFSET = 200
MKL_OFFSET = 100


@cache
def load() -> CondaForgeTable:
    table = parse_table_as(CondaForgeTable, data_text("conda_forge"), "torchforge/data/conda_forge.toml")
    problems = check_invariants(table)
    if problems:
        raise DataError("torchforge/data/conda_forge.toml is inconsistent:\n  - " + "\n  - ".join(problems))
    return table


def check_invariants(table: CondaForgeTable) -> list[str]:
    problems: list[str] = []
    toolkits = tables.load().cuda.toolkits
    if set(table.flavour.blas) != set(PLATFORMS):
        problems.append(f"conda_forge.toml flavour.blas must name exactly {', '.join(PLATFORMS)}")
    for version, release in table.releases.items():
        where = f"conda_forge.toml releases.{version}"
        if not all(re.fullmatch(r"[0-9a-f]{40}", c) for c in (release.commit, *release.earlier_builds)):
            problems.append(f"{where}: commit and earlier_builds must be full git commits")
        problems.extend(f"{where}.platforms.{p}.earlier_arch_list.{c}: {a.source!r} cites none of earlier_builds"
                        for p, jobs in release.platforms.items() for c, a in jobs.earlier_arch_list.items()
                        if not any(a.source.startswith(f"{e[:8]}:recipe/") for e in release.earlier_builds))
        if set(release.platforms) | set(release.not_built) != set(PLATFORMS) or set(release.platforms) & set(release.not_built):
            problems.append(f"{where}: platforms and not_built must name each of {', '.join(PLATFORMS)} once")
        cited = [release.build_number_source, release.patches.source, release.cuda_offset_source,
                 release.mkl_offset_source, release.triton_source]
        for platform, jobs in release.platforms.items():
            for cuda in jobs.cuda:
                if cuda not in jobs.arch_list or cuda not in jobs.ci_support:
                    problems.append(f"{where}.platforms.{platform}: CUDA {cuda} lacks its arch_list or ci_support entry")
                if cuda not in toolkits:
                    problems.append(f"{where}.platforms.{platform}: CUDA {cuda} is missing from cuda.toml")
            if "cpu" not in jobs.ci_support:
                problems.append(f"{where}.platforms.{platform}.ci_support lacks the cpu job")
            for job, ci in jobs.ci_support.items():
                missing = [k for k in _CI_COMPILER_KEYS[_family(platform)] if getattr(ci, k) is None]
                problems.extend(f"{where}.platforms.{platform}.ci_support.{job} lacks {k}" for k in missing)
                cited += [c.source for k in _CI_COMPILER_KEYS[_family(platform)] if (c := getattr(ci, k))]
                if ci.c_compiler and ci.c_compiler.value not in table.flavour.visual_studio:
                    problems.append(f"{where}.platforms.{platform}.ci_support.{job}: {ci.c_compiler.value} is not in "
                                    "flavour.visual_studio")
            if jobs.activation:
                cited.append(jobs.activation.source)
            cited += [*(a.source for a in jobs.arch_list.values()), *(r.source for r in jobs.recipe.requirements),
                      *(e.source for e in jobs.recipe.env), *(p.source for p in jobs.recipe.patches)]
            problems.extend(f"{where}.platforms.{platform}: patch {p.path} has no sha256" for p in jobs.recipe.patches
                            if not re.fullmatch(r"[0-9a-f]{64}", p.sha256))
            problems.extend(f"{where}.platforms.{platform}: a requirement names unknown output {row.output!r}"
                            for row in jobs.recipe.requirements
                            if row.output not in (*release.outputs_cuda, *release.outputs_cpu))
        problems.extend(f"{where}: source {s!r} is not FILE:LINE" for s in cited if not _SOURCE.match(s))
        for accel in ("cuda", "cpu"):
            if release.outputs(accel)[:2] != ("libtorch", "pytorch"):  # type: ignore[arg-type]
                problems.append(f"{where}: the {accel} outputs do not start with libtorch, pytorch")
    return problems


# ---- the plan of one recipe -----------------------------------------------------------------------------

def _family(platform: str) -> str:
    return "win" if platform == WINDOWS else "linux"
