"""The variant-selection metapackages a pytorch package's requirements name (pytorch-mutex, cpuonly,
pytorch-cuda), planned so that a torchforge channel next to conda-forge or defaults is complete.

Facts come from data/companions.toml; which companions a variant needs follows its era (selector and CUDA
runtime of the release) and its platform. Pure: no files, no commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torchforge import data as tables
from torchforge.datamodels import Data
from torchforge.flavours.official.resolved import Status, Variant


@dataclass(frozen=True)
class CompanionPlan:
    name: str
    version: str
    build_number: int
    build_string: str
    subdir: str  # "noarch" or the platform
    run: tuple[str, ...] = ()
    run_exports: tuple[str, ...] = ()
    track_features: tuple[str, ...] = ()
    official: bool = True  # upstream published this package with this definition
    warnings: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}-{self.subdir.replace('-', '_')}"

    @property
    def filename_stem(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}"

    @property
    def noarch(self) -> bool:
        return self.subdir == "noarch"

    @property
    def summary(self) -> str:
        return _SUMMARIES[self.name]


_SUMMARIES = {
    "pytorch-mutex": "Selects the cpu or cuda PyTorch build; pytorch packages depend on exactly one variant",
    "cpuonly": "Install next to pytorch to get the CPU build",
    "pytorch-cuda": "Selects the CUDA version of a CUDA pytorch build and brings its CUDA libraries",
}


def mutex(data: Data, variant: str) -> CompanionPlan:
    facts = data.companions.mutex
    number = facts.build_number + (facts.cuda_build_offset if variant == "cuda" else 0)
    pin = f"{facts.name} =={facts.version} {variant}"
    return CompanionPlan(facts.name, facts.version, number, variant, "noarch", run_exports=(pin,),
                         track_features=(facts.name,) if variant == "cpu" else ())


def cpuonly(data: Data, version: str) -> CompanionPlan:
    facts = data.companions.cpuonly[version]
    return CompanionPlan("cpuonly", version, facts.build_number, str(facts.build_number), "noarch",
                         run=facts.run, track_features=("cpuonly",))


def pytorch_cuda(data: Data, cuda: str, platform: str) -> CompanionPlan:
    """pytorch-cuda X.Y for one platform: upstream's pins where it was published, else torchforge's own."""
    published = data.companions.pytorch_cuda.versions.get(cuda)
    # Upstream's build strings carried conda-build's variant hash (h<hash>_<n>), which depends on its build
    # machine; torchforge names the package by its build number.
    note = "the build string is the build number (upstream's carried a conda-build hash)"
    if published is not None:
        run = published.run + (published.run_win if tables.load().platform(platform).windows else ())
        return CompanionPlan("pytorch-cuda", cuda, published.build_number, str(published.build_number), platform,
                             run=run, warnings=(note,))
    upper = data.cuda.toolkits[cuda].runtime_upper
    run = (f"cuda-version >={cuda},<{upper}", *data.eras.runtime.split_packages)
    return CompanionPlan("pytorch-cuda", cuda, 0, "0", platform, run=run, official=False, warnings=(
        f"not official: upstream never published pytorch-cuda {cuda}; torchforge's own definition (cuda-version "
        f"bounds the split CUDA packages)", note))


def companions_for(variants: Iterable[Variant], data: Data | None = None) -> tuple[CompanionPlan, ...]:
    """Every companion the given (not refused) pytorch variants need, once each, in a stable order."""
    data = data or tables.load()
    found: dict[str, CompanionPlan] = {}

    def add(plan: CompanionPlan) -> None:
        found.setdefault(plan.id, plan)

    for variant in variants:
        if variant.status is Status.REFUSED or variant.release_key is None or variant.jetson:
            continue
        request = variant.request
        if not data.platform(request.platform).mutex:
            continue
        release = data.pytorch.releases[variant.release_key]
        if release.selector == "mutex":
            add(mutex(data, "cuda" if request.is_cuda else "cpu"))
            if not request.is_cuda:
                add(cpuonly(data, "2.0"))
        elif not request.is_cuda:
            add(cpuonly(data, "1.0"))
        if request.is_cuda and release.cuda_runtime == "pytorch-cuda" \
                and request.platform in data.companions.pytorch_cuda.platforms:
            add(pytorch_cuda(data, request.accel, request.platform))
    return tuple(found.values())
