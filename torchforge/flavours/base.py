"""The neutral plan every flavour produces, and the protocol a flavour implements (issue 30).

A flavour turns a `Request` (the command line's shared flags) into a `Plan`: the ordered recipe folders to
build (`PlannedRecipe`), the warnings to show, and what the machine checks need to know (`MachineNeeds`).
Everything below the flavours (the pipeline's steps, preflight, the compile cache, channels) reads these
types, never a flavour's own model. A new kind of recipe (torchvision, an extension) is one more producer of
`PlannedRecipe`s inside a flavour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torchforge.binaries.plan import PackagePlan

# The variable every plan's build scripts read for the number of compile jobs (--jobs, or preflight's choice).
JOBS_VARIABLE = "MAX_JOBS"
OVERRIDE_CUDA = "CONDA_OVERRIDE_CUDA"  # the __cuda virtual package conda and rattler solve with
# --with: the packages of a PyTorch stack built from source after pytorch, each pinned to the exact pytorch package
# (issue 32); `repack --with` takes them and triton, whose wheels it repacks.
STACK_PACKAGES = ("torchvision", "torchaudio")
# The engines' two recipe formats ("conda-build": meta.yaml, "rattler-build": recipe.yaml): a plain string here
# so that this module depends on nothing (torchforge.templates.RecipeFormat has the same values).
RecipeFormatName = str


@dataclass(frozen=True)
class PytorchBuild:
    """One exact pytorch package (a file of a channel, or one a plan makes), as its index record says it: what a
    companion or an extension is built against and pinned to. Its arch list is resolved once, here: a planned
    package's from the flavour's plan, a channel's from the device code of pytorch's own CUDA libraries."""

    version: str
    build: str  # the build string: py3.11_cpu_0, cuda130_generic_torchforge_py312_h1a2b3c4_0, whl_py3.12_cpu_0
    subdir: str
    python: str  # X.Y
    cuda: str | None  # X.Y, None for a CPU build
    arch_list: str | None = None  # TORCH_CUDA_ARCH_LIST's words; never empty for CUDA, None for a CPU build
    # pytorch's own requirement on the package that holds libcudart (nvidia-cuda-runtime for a repacked wheel,
    # cuda-cudart on conda-forge): a CUDA library built against pytorch links libcudart too, so it requires that
    # package itself rather than reach it through pytorch (the RPATH audit accepts only declared ones).
    cuda_runtime: str | None = None
    # Its C++ libraries are a libtorch package of their own (conda-forge's split); False: inside pytorch's files, as
    # in a repacked wheel (torch/lib), where the pin of this exact pytorch stands for libtorch too
    split_libtorch: bool = True
    depends: tuple[str, ...] = ()  # its run requirements, as its index record says them (a channel's package)

    @property
    def accel(self) -> str:
        return f"cu{self.cuda.replace('.', '')}" if self.cuda else "cpu"

    @property
    def stem(self) -> str:
        """The package file's name without its extension: pytorch-VERSION-BUILD."""
        return f"pytorch-{self.version}-{self.build}"

    @property
    def for_flags(self) -> tuple[str, ...]:
        """`torchforge build --for` of exactly this file (a CI job's command for what is built for it)."""
        return ("--for", f"pytorch =={self.version} {self.build}")


@dataclass(frozen=True)
class Request:
    """What one command line asks for, before any flavour has read it: the flags every flavour shares.

    `None` means "the flavour's default" (every CUDA, every Python ...); lists stay comma-separated as given.
    """

    pytorch: str | None = None
    cuda: str | None = None
    python: str | None = None
    platform: str | None = None
    arch_list: str | None = None
    build_number: int = 0
    source: str | None = None
    patches: tuple[Path, ...] = ()
    feedstock_patches: bool = False  # the conda-forge flavour's own patches (--feedstock-patches)
    # Flags one flavour alone reads ({"--debug": True, ...}): another flavour refuses those that are set.
    flavour_flags: tuple[tuple[str, object], ...] = ()
    # --with: packages built after each pytorch package, pinned to it (torchvision, torchaudio)
    with_packages: tuple[str, ...] = ()
    # --with-source NAME=PATH: (companion, path as given) built from that local tree or archive (companionsource)
    with_sources: tuple[tuple[str, str], ...] = ()
    # --extension: SPECs of extensions built from their sdist for each pytorch package (torchforge/extensions)
    extensions: tuple[str, ...] = ()
    # --extension-env NAME:KEY=VALUE: (name in conda's form, KEY, VALUE), one extension's own build variables
    # (torchforge/extensions/variables.py)
    extension_env: tuple[tuple[str, str, str], ...] = ()
    # (SPEC, name, version, sdist identity) of `extensions` planned already (a stack file's loader reads a SPEC's
    # name to check its env): the plan reuses them rather than packing or cloning that source again
    planned_extensions: tuple[tuple[str, str, str, str], ...] = ()
    # --for SPEC: a conda match spec of a pytorch package a channel already has (`pytorch ==2.13.0 whl_*`), looked
    # for in `for_channels` (the --channel values, then --out): companions and extensions are built for it, and no
    # pytorch source build is planned (torchforge/havepytorch.py)
    for_pytorch: str | None = None
    for_channels: tuple[str, ...] = ()
    # --wheels DIR: the folders the wheels of requirements no channel provides are taken from (torchforge.closure);
    # () takes them from pip's own index
    wheel_folders: tuple[str, ...] = ()

    def given(self, *flags: str) -> tuple[str, ...]:
        """The flavour-specific flags among `flags` that the command line set."""
        values = dict(self.flavour_flags)
        return tuple(flag for flag in flags if values.get(flag))


@dataclass(frozen=True)
class PlannedRecipe:
    """One recipe folder of a plan and the packages one engine run makes of it.

    The first nine fields are positional (the conda-forge flavour and tests build them that way); the rest say
    how the recipe joins the plan. `kind` names the kind of recipe for people and logs: "companion", "magma",
    "pytorch", or "recipe" (a folder of several outputs, e.g. conda-forge's libtorch + pytorch + metapackage).
    """

    id: str
    subdir: str
    stems: tuple[str, ...]  # every output's name-version-build, in build order
    # JSON the packages record (about.json extra torchforge_settings): the reuse check compares it; "" for a
    # recipe whose packages are reused by name alone (the official flavour's companion metapackages).
    settings: str
    files: Mapping[str, str | bytes]  # the recipe folder, in the engine's format
    channels: tuple[str, ...]  # the flavour's channels, before the site config's replacements and mirrors
    accel: str = "cpu"  # "cpu" or CUDA X.Y: the build image with --container, CONDA_OVERRIDE_CUDA
    local_source: str | None = None  # a source tree or tarball on this machine (mounted into a container)
    # Per package (stem): the info/index.json fields its recipe format cannot say (recipe.yaml has no
    # track_features), set after the build when the engine left them out.
    index_fields: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    kind: str = "recipe"
    needs: tuple[str, ...] = ()  # ids of recipes that must be built first (pytorch needs its magma)
    python: str | None = None  # the one Python a single-output recipe is built for
    script_env: tuple[str, ...] = ()  # environment variables the build script reads from the caller
    cache_script_env: tuple[str, ...] = ()  # and those it reads only while the compile cache is on
    # Recipes of one cache group differ only in Python and share compiled objects (None: a group of its own).
    cache_group: str | None = None
    cudnn: str = ""  # the cuDNN the packages bundle (full version): its build image must carry exactly that one
    pythons: tuple[tuple[str, str], ...] = ()  # (stem, Python X.Y) of each package built per Python (CI tests each)
    arch_list: str | None = None  # CUDA: every library with device code must cover it (torchforge.archcheck)
    # The pytorch packages the recipe makes, each with its resolved arch list: what companions and extensions of
    # the plan are built for (read here, never from the command line)
    pytorch: tuple[PytorchBuild, ...] = ()
    # Files of the package the arch check leaves out (globs of file names): libraries copied from this machine
    # into it (the official flavour's cuDNN, NCCL ...), which torchforge did not compile
    arch_exempt: tuple[str, ...] = ()
    note: str = ""  # what the plan says of a recipe to build (a dry run shows it): what it waits for, what it resolves
    # The `torchforge build` flags that build exactly this recipe (a CI job runs them; recipes with the same flags
    # are one job). () where the jobs of the recipes beside it build it too (the official companions).
    build_flags: tuple[str, ...] = ()
    # `render` writes its folder; False: built, but rendered only where the request asks (the official companions
    # the channels lack, without --companions)
    rendered: bool = True
    # A recipe of kind "wheel" (a pip wheel, --format wheel) has no folder: what pip builds (a folder or a URL)
    # and the variables its build sets, in the shell forms of the recipes (torchforge.wheelbuild evaluates them)
    source: str | None = None
    build_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CudaUse:
    """A CUDA version whose libraries the plan's recipes link from this machine's toolkit: the kinds of recipe
    that link them (preflight.toml's `needed_by`: magma, pytorch) and the cuDNN they name (said in the fix)."""

    cuda: str
    kinds: tuple[str, ...]
    cudnn: str = ""


@dataclass(frozen=True)
class HostLibrary:
    """A library file a recipe copies from this machine into its package (the official flavour's cuDNN, NCCL ...):
    it must be where the build script looks, or the build fails after the whole compile, at the copy step."""

    recipe: str  # the recipe's id, named in the failure
    name: str  # a file name or glob
    dir_var: str  # the variable that says where it is
    dir_default: str  # where it is without that variable ($CUDA_HOME is filled in at check time)


@dataclass(frozen=True)
class RequirementSolve:
    """A recipe's build and host requirements, which must solve from its channels before its build starts (doctor
    and preflight name each package no channel has; network)."""

    recipe: str  # the recipe's id, named in the row
    platform: str
    channels: tuple[str, ...]  # the recipe's, before the site config (the output channel and --channel come first)
    build: tuple[str, ...]
    host: tuple[str, ...]


@dataclass(frozen=True)
class MachineNeeds:
    """What the machine checks read from a plan: what must be on this machine and reachable from it."""

    cuda_versions: tuple[str, ...] = ()  # nvcc and the driver are checked against each
    platforms: tuple[str, ...] = ()  # subdirs the plan builds: this machine must be one
    arch_lists: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # --source values (a folder, a tarball or a URL)
    channels: tuple[tuple[str, str], ...] = ()  # (platform, URL) the builds read, before the site config
    # The CUDA toolkit and host compiler come from this machine (the official flavour's build.sh), not from the
    # build environment's packages (conda-forge's cuda-nvcc and compilers): only then is nvcc checked here.
    toolkit_on_host: bool = True
    # CUDA packages whose libraries the arch check lists after the build (cuobjdump must be here)
    arch_checked: bool = False
    # Where the toolkit is this machine's: the CUDA libraries each CUDA's recipes link, the files they bundle
    cuda_uses: tuple[CudaUse, ...] = ()
    host_libraries: tuple[HostLibrary, ...] = ()
    # The tools of preflight.toml [tools] the recipes take from this machine (the official flavour's build.sh:
    # cmake, patchelf ..., git where a source is cloned); () where the build environment has its own.
    host_tools: tuple[str, ...] = ()
    # Requirements solved before the build (the official flavour's pytorch recipes); the other plans' channels are
    # checked to answer (`channels`)
    solves: tuple[RequirementSolve, ...] = ()
    builds_a_source: bool = True  # False: no source of its own is built (the official --magma-only: MAGMA's tarball)
    env_max_jobs: str | None = None  # the MAX_JOBS the request's own flags set (official --env): --jobs must agree
    # No recipe compiles a pytorch source (repacked, already in a channel, --for): extensions alone, whose disk use
    # was measured (preflight.toml [disk] min_free_gib_extensions)
    extensions_only: bool = False


@dataclass(frozen=True)
class Plan:
    """The ordered recipes of one request, in build order (a recipe's needs come before it)."""

    flavour: str
    recipes: tuple[PlannedRecipe, ...]
    warnings: tuple[str, ...] = ()
    needs: MachineNeeds = field(default_factory=MachineNeeds)
    # What only the flavour can say about the plan, shown first by `doctor` (name, detail): its recipes, channel, magma
    facts: tuple[tuple[str, str], ...] = ()
    # --for: the pytorch package a channel already has, which the plan's companions and extensions are built for
    given_pytorch: PytorchBuild | None = None
    # the requirements no channel provides, as the packages repacked from their wheels into the output channel
    # before anything builds (torchforge.closure; the recipe closure.BROUGHT_ID names them)
    brought_along: tuple[PackagePlan, ...] = ()
    # The engine its recipes need whatever --engine says ("pip": a plan of pip wheels); None: the chosen conda engine
    engine: str | None = None
    # Its recipes' requirements are conda-forge's packages, so their stand-ins (standin-channel) take conda-forge's
    # shapes (python_abi, cuDNN/NCCL/MAGMA libraries and run_exports); False: the pytorch and defaults channels'
    conda_forge_packages: bool = True

    def pytorch_builds(self) -> tuple[tuple[PlannedRecipe | None, PytorchBuild], ...]:
        """Every pytorch package the plan's companions and extensions are built for, with the recipe that makes it
        (None: the channel's, given with --for)."""
        planned = tuple((recipe, build) for recipe in self.recipes for build in recipe.pytorch)
        return ((None, self.given_pytorch), *planned) if self.given_pytorch else planned


@dataclass(frozen=True)
class MatrixView:
    """`matrix` of a request: the JSON rows, the table people read (cells may carry rich markup), and whether a
    variant is refused (exit 4)."""

    rows: tuple[dict[str, object], ...]
    title: str
    columns: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    refused: bool = False


class Flavour(Protocol):
    """A recipe flavour: the package shape it reproduces, and how it turns a request into a plan."""

    name: str

    def build_refusal(self, request: Request) -> tuple[str, str] | None:
        """Why torchforge renders `request` but does not build it here, and what would work (None: it builds it)."""
        ...

    def matrix(self, request: Request) -> MatrixView:
        """`matrix`: one row per recipe (or variant) of `request`, in the flavour's own words, and its table."""
        ...

    def plan(self, request: Request, recipe_format: RecipeFormatName) -> Plan:
        """The recipes of `request`, rendered for an engine reading `recipe_format`."""
        ...

    def plan_for(self, pytorch: PytorchBuild, request: Request, recipe_format: RecipeFormatName) -> Plan:
        """The recipes of `request` for a pytorch package a channel already has (--for): its --with companions,
        pinned to that file; no pytorch recipe."""
        ...
