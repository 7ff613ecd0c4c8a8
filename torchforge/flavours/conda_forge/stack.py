"""The conda-forge flavour's torchvision and torchaudio: conda-forge's recipe of the release paired with the
channel's own pytorch, built against that exact pytorch package.

The pairing is torchforge/data/stack_pairing.toml (PyPI's wheels); the recipe's facts are the feedstock's, per
release and job kind (torchforge/data/conda_forge_stack.toml, read from its recipe.yaml and build.sh). What
differs from the feedstock, on purpose: pytorch is pinned to the exact package the recipe is built against
(`pytorch ==2.13.0 cuda130_..._0`) instead of `pytorch * cuda*` and pytorch's run_exports; the CUDA arch list is
always that pytorch's CF_TORCH_CUDA_ARCH_LIST (torchaudio's feedstock hard-codes its own); the feedstock's
source patches are not applied (each recipe says so); the feedstock's `-tests` output is not built.
Pure: no files, no commands. The recipe and its build script are written from templates
(recipe_templates/conda_forge/companion_*), for rattler-build and conda-build alike; the variants file is data.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from functools import cache
from typing import Literal

from packaging.version import Version
from ruamel.yaml import YAML

from torchforge import __version__, stackpairing
from torchforge.companionsource import CompanionSource
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel
from torchforge.errors import RefusedError
from torchforge.flavours.base import PlannedRecipe, PytorchBuild
from torchforge.templates import render_template

WHERE = "torchforge/data/conda_forge_stack.toml"
Companion = Literal["torchvision", "torchaudio"]
RecipeFormat = Literal["rattler-build", "conda-build"]
ARCH_MARKER = "{arch_list}"
# The rendered compilers, written back as the functions that give them in either recipe format.
FUNCTIONS = {"stdlib('c')", "compiler('c')", "compiler('cxx')", "compiler('cuda')"}


class JobFacts(FrozenModel):
    job: str  # the Python 3.12 job's file (else the first Python's); `jobs` names every Python's
    build_number: int
    source_url: str
    source_sha256: str
    patches: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    host: tuple[str, ...] = ()
    run: tuple[str, ...] = ()
    run_constraints: tuple[str, ...] = ()
    ignore_run_exports_by_name: tuple[str, ...] = ()
    ignore_run_exports_from_package: tuple[str, ...] = ()
    build_string: str  # the feedstock's, with {tag} {py} {hash} {number} for its parts
    suite_tests_left_out: int = 0
    test_imports: tuple[str, ...] = ()
    test_pip_check: bool = False
    test_requires: tuple[str, ...] = ()
    test_script: tuple[str, ...] = ()
    down_prioritize_variant: int = 0  # rattler-build's track_features `{name}-p-0` ... for each level
    jobs: dict[str, str]  # Python X.Y -> that Python's job file (.ci_support/)
    pythons: dict[str, str]  # Python X.Y -> its job's python pin, whole (`3.13.* *_cp313`)
    variant: dict[str, str]
    env: dict[str, str]  # a value naming ${PREFIX}, ${CC}, ${CXX} is written as their expansion


class ReleaseFacts(FrozenModel):
    commit: str
    feedstock_pytorch: str
    cpu: JobFacts | None = None
    cuda: dict[str, JobFacts] = {}  # CUDA X.Y -> that CUDA's job (each its own sysroot, compilers, pins)


class StackTable(FrozenModel):
    schema_: int = 1
    torchvision: dict[str, ReleaseFacts]
    torchaudio: dict[str, ReleaseFacts]


@cache
def load() -> StackTable:
    return parse_table_as(StackTable, data_text("conda_forge_stack"), WHERE,
                          "regenerate it with scripts/stack_feedstock_facts.py --write")


@dataclass(frozen=True)
class CompanionRecipe:
    package: Companion
    version: str
    pytorch: PytorchBuild
    facts: JobFacts
    feedstock_commit: str
    feedstock_version: str  # the feedstock release whose recipe is used (== version unless it has none)
    build_number: int
    warnings: tuple[str, ...]
    source: CompanionSource | None = None  # --with-source: a local tree or archive instead of the release's

    @property
    def tag(self) -> str:
        return f"cuda{self.pytorch.cuda.replace('.', '')}" if self.pytorch.cuda else "cpu"

    @property
    def id(self) -> str:
        """One per package, release, CUDA, arch list, Python and subdir: each its own recipe folder, log and build
        (one pytorch recipe makes a package per Python, and each has its own companion)."""
        arch = self.pytorch.arch_list or ""
        arch = f"-sm{arch.replace(';', '_').replace('.', '').replace('+', '')}" if arch else ""
        python = f"py{self.pytorch.python.replace('.', '')}"
        return f"{self.package}-{self.version}-{self.tag}{arch}-{python}-{self.pytorch.subdir.replace('-', '_')}"

    @property
    def settings(self) -> str:
        """Everything that changed the binary: the exact pytorch included (another pytorch: another package)."""
        source = {"source": self.source.identity} if self.source is not None else {}
        return json.dumps({"flavour": "conda-forge", "package": self.package, "feedstock": self.feedstock_commit,
                           "pytorch": f"{self.pytorch.version}-{self.pytorch.build}",
                           "arch_list": self.pytorch.arch_list, "build_number": self.build_number, **source},
                          sort_keys=True)

    @property
    def build_string(self) -> str:
        """conda-forge's words, then torchforge's digest of the settings where the engine would put its hash."""
        digest = hashlib.sha256(self.settings.encode()).hexdigest()[:7]
        return self.facts.build_string.format(tag=self.tag, py=self.pytorch.python.replace(".", ""), hash=digest,
                                              number=self.build_number)

    @property
    def stem(self) -> str:
        return f"{self.package}-{self.version}-{self.build_string}"

    def pytorch_spec(self, recipe_format: RecipeFormat) -> str:
        """The exact pytorch package: rattler-build's `==V BUILD`, conda-build's `V BUILD` (which it reads as exact
        and would take `==V BUILD` apart otherwise)."""
        if recipe_format == "rattler-build" and "." in self.pytorch.build:
            # rattler-build's recipe parser takes a dotted build string (a repacked wheel's whl_py3.12_cpu_0) in the
            # bracket form only
            return f'pytorch[version="=={self.pytorch.version}", build="{self.pytorch.build}"]'
        exact = "==" if recipe_format == "rattler-build" else ""
        return f"pytorch {exact}{self.pytorch.version} {self.pytorch.build}"


def plan(package: Companion, pytorch: PytorchBuild, build_number: int | None = None,
         source: CompanionSource | None = None) -> CompanionRecipe:
    """The `package` recipe for one pytorch package of the channel (build number: the feedstock's unless given;
    `source`: --with-source's tree instead of the release's archive)."""
    release = stackpairing.companion_release(package, pytorch.version)
    releases = getattr(load(), package)
    built = sorted((v for v in releases if Version(v) <= Version(release.version)), key=Version)
    if not built:
        raise RefusedError(f"conda-forge's {package}-feedstock has no recipe for {package} {release.version} or "
                           f"earlier ({WHERE} holds {', '.join(releases)})",
                           "pick a pytorch release whose companion the feedstock built, or leave it out of --with")
    chosen = releases[built[-1]]
    facts, warnings = _job(package, built[-1], chosen, pytorch)
    if facts.patches:
        warnings.append(f"conda-forge applies {len(facts.patches)} source patches to {package} {built[-1]} "
                        f"(recipe/patches at {chosen.commit[:12]}); this recipe applies none of them")
    if built[-1] != release.version:
        warnings.append(f"conda-forge's {package}-feedstock has no recipe for {package} {release.version} (the "
                        f"release PyPI pairs with pytorch {pytorch.version}); the recipe of {built[-1]} is used, "
                        f"with {release.version}'s source archive, whose sha256 no table holds")
    if release.wheel_requires == "none":
        warnings.append(f"{package} {release.version}'s wheels name no torch; the pairing with pytorch "
                        f"{pytorch.version} ({release.requires}) is cited from the project ({stackpairing.WHERE})")
    own_facts = built[-1] == release.version
    number = (facts.build_number if own_facts else 0) if build_number is None else build_number
    return CompanionRecipe(package, release.version, pytorch, facts, chosen.commit, built[-1], number,
                           tuple(warnings), source)


def _job(package: Companion, version: str, release: ReleaseFacts,
         pytorch: PytorchBuild) -> tuple[JobFacts, list[str]]:
    """The feedstock's job for pytorch's CUDA (cpu) and Python: its own job where the feedstock has one; for a
    CUDA it has none of, the newest job of an older CUDA (else the oldest), said in a warning."""
    warnings = []
    if pytorch.cuda is None:
        facts = release.cpu
    elif pytorch.cuda in release.cuda:
        facts = release.cuda[pytorch.cuda]
    elif release.cuda:
        cudas = sorted(release.cuda, key=Version)
        older = [c for c in cudas if Version(c) < Version(pytorch.cuda)]
        taken = older[-1] if older else cudas[0]
        facts = release.cuda[taken]
        warnings.append(f"conda-forge's {package}-feedstock has no CUDA {pytorch.cuda} job for {package} {version} "
                        f"(its CUDA jobs: {', '.join(cudas)}); the recipe of its CUDA {taken} job is used (sysroot "
                        f"{facts.variant.get('c_stdlib_version', 'unstated')})")
    else:
        facts = None
    if facts is None:
        accel = "CUDA" if pytorch.cuda else "cpu"
        raise RefusedError(f"conda-forge's {package}-feedstock has no linux {accel} job for {package} {version}",
                           f"build the {'cpu' if pytorch.cuda else 'CUDA'} pytorch instead")
    if pytorch.python not in facts.pythons:
        raise RefusedError(f"conda-forge's {package}-feedstock builds {package} {version} for Python "
                           f"{', '.join(facts.pythons)}, not {pytorch.python} (no job pins its python)",
                           f"build pytorch for one of those Pythons (--py), or leave {package} out of --with")
    return facts, warnings


def requirements(recipe: CompanionRecipe, recipe_format: RecipeFormat) -> dict[str, list[str]]:
    """build/host/run: the feedstock's, with its `pytorch` lines replaced by the one exact pytorch package."""
    cuda = recipe.pytorch.cuda or ""

    # a pytorch with libtorch inside (a repacked wheel): the exact pytorch pin stands for the feedstock's libtorch
    replaced = ("pytorch",) if recipe.pytorch.split_libtorch else ("pytorch", "libtorch")

    def ours(specs: tuple[str, ...], pin: bool) -> list[str]:
        kept = [s.replace("{cuda}", cuda) for s in specs if s.split()[0] not in replaced]
        return [*kept, recipe.pytorch_spec(recipe_format)] if pin and any(s.split()[0] == "pytorch" for s in specs) else kept

    found = {"build": ours(recipe.facts.build, False), "host": ours(recipe.facts.host, True),
             "run": ours(recipe.facts.run, True), "run_constraints": list(recipe.facts.run_constraints)}
    return {key: specs for key, specs in found.items() if specs}


def ignored_run_exports(recipe: CompanionRecipe, recipe_format: RecipeFormat) -> dict[str, list[str]]:
    """The feedstock's ignore_run_exports, in the format's keys."""
    by_name, from_package = recipe.facts.ignore_run_exports_by_name, recipe.facts.ignore_run_exports_from_package
    keys = ("by_name", "from_package") if recipe_format == "rattler-build" \
        else ("ignore_run_exports", "ignore_run_exports_from")
    return {key: list(names) for key, names in zip(keys, (by_name, from_package), strict=True) if names}


def variant_config(recipe: CompanionRecipe) -> dict[str, list[str]]:
    """The job's variant keys (conda-forge's pins the feedstock's job used), for the chosen Python and CUDA: the
    python pin is that Python's job's own (`3.12.* *_cpython`, `3.13.* *_cp313`)."""
    config = {key: [value] for key, value in recipe.facts.variant.items()}
    config["python"] = [recipe.facts.pythons[recipe.pytorch.python]]
    config["cuda_compiler_version"] = [recipe.pytorch.cuda or "None"]
    if "libtorch" in config:
        config["libtorch"] = [".".join(recipe.pytorch.version.split(".")[:2])]
    return config


def _spec(spec: str, recipe_format: RecipeFormat) -> str:
    if recipe_format == "conda-build" and spec.startswith("pin_compatible("):
        spec = spec.replace("lower_bound=", "min_pin=").replace("upper_bound=", "max_pin=")
    if spec in FUNCTIONS or spec.startswith("pin_compatible("):
        return ("${{ " if recipe_format == "rattler-build" else "{{ ") + spec + " }}"
    return spec


def _extra(recipe: CompanionRecipe) -> dict[str, str]:
    """What every package records of its recipe: the settings the pipeline's reuse check compares."""
    return {"torchforge_flavour": "conda-forge", "torchforge_settings": recipe.settings,
            "feedstock": f"github:conda-forge/{recipe.package}-feedstock@{recipe.feedstock_commit}",
            "cuda": recipe.pytorch.cuda or "cpu"}


def recipe_text(recipe: CompanionRecipe, recipe_format: RecipeFormat, source: dict[str, str]) -> str:
    """recipe.yaml (rattler-build) or meta.yaml (conda-build), from its template: the feedstock's requirements,
    tests and ignored run exports in the format's keys."""
    facts = recipe.facts
    specs = {key: [_spec(s, recipe_format) for s in values]
             for key, values in requirements(recipe, recipe_format).items()}
    fields = {"warnings": recipe.warnings, "version": recipe.version, "package": recipe.package, "source": source,
              "build_number": recipe.build_number, "build_string": recipe.build_string,
              "ignored": ignored_run_exports(recipe, recipe_format), "test_imports": list(facts.test_imports),
              "test_requires": list(facts.test_requires), "extra": _extra(recipe)}
    if recipe_format == "rattler-build":
        return render_template("conda_forge/companion_recipe.yaml.j2", **fields, requirements=specs,
                               down_prioritize_variant=facts.down_prioritize_variant,
                               test_pip_check=facts.test_pip_check, test_script=list(facts.test_script))
    if "run_constraints" in specs:
        specs["run_constrained"] = specs.pop("run_constraints")
    return render_template("conda_forge/companion_meta.yaml.j2", **fields, requirements=specs,
                           track_features=track_features(recipe) if facts.down_prioritize_variant else [],
                           test_commands=[line.replace("${{ version }}", recipe.version) for line in facts.test_script])


def track_features(recipe: CompanionRecipe) -> list[str]:
    """What rattler-build writes for `down_prioritize_variant: N` (`{name}-p-0` ... `{name}-p-{N-1}`), for
    meta.yaml, which has no such key."""
    return [f"{recipe.package}-p-{level}" for level in range(recipe.facts.down_prioritize_variant)]


def build_script(recipe: CompanionRecipe) -> str:
    """build.sh: the feedstock's exports for the job; the arch list is the installed pytorch's (a pytorch with
    libtorch inside, a repacked wheel, has no activation script to set it: the plan's, read from its libraries'
    device code, is exported; a split one's activation must set the planned list). `${PREFIX}`, `${CC}`,
    `${CXX}` in a feedstock's value expand as in the feedstock's script; pip reaches no index (the feedstock's
    line would ask PyPI for a newer pip)."""
    shown = [(name, '"${CF_TORCH_CUDA_ARCH_LIST}"' if value == ARCH_MARKER or name == "TORCH_CUDA_ARCH_LIST"
              else json.dumps(value)) for name, value in recipe.facts.env.items()]
    return render_template("conda_forge/companion_build.sh.j2", torchforge_version=__version__, id=recipe.id,
                           package=recipe.package, feedstock=recipe.feedstock_commit[:12], version=recipe.version,
                           cuda=recipe.pytorch.cuda, split_libtorch=recipe.pytorch.split_libtorch,
                           arch_list=recipe.pytorch.arch_list or "", exports=shown)


def _yaml(document: object) -> str:
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    text = io.StringIO()
    yaml.dump(document, text)
    return text.getvalue()


def source_archive(recipe: CompanionRecipe) -> dict[str, str]:
    """The release's source archive: the feedstock's URL and sha256, or (a release the feedstock has no recipe
    for) the same URL for this version, without a checksum."""
    if recipe.feedstock_version == recipe.version:
        return {"url": recipe.facts.source_url, "sha256": recipe.facts.source_sha256}
    return {"url": recipe.facts.source_url.replace(f"v{recipe.feedstock_version}", f"v{recipe.version}")}


def recipe_files(recipe: CompanionRecipe, recipe_format: RecipeFormat,
                 local_source: str | None = None) -> dict[str, str]:
    """{file name: text} of the recipe folder for the engine."""
    source = {"path": local_source} if local_source else source_archive(recipe)
    recipe_file, variant_file = ("recipe.yaml", "variants.yaml") if recipe_format == "rattler-build" \
        else ("meta.yaml", "conda_build_config.yaml")
    return {recipe_file: recipe_text(recipe, recipe_format, source),
            variant_file: _yaml(variant_config(recipe)), "build.sh": build_script(recipe)}


def planned_recipe(recipe: CompanionRecipe, recipe_format: RecipeFormat, channel: str,
                   local_source: str | None = None) -> PlannedRecipe:
    """What the pipeline builds: the recipe folder for the engine, the one package it yields, its channel (the
    output channel, where the pytorch it pins is, comes first through the pipeline); from `local_source` or
    --with-source's tree where one is given."""
    local = local_source or (recipe.source.path if recipe.source is not None else None)
    return PlannedRecipe(recipe.id, recipe.pytorch.subdir, (recipe.stem,), recipe.settings,
                         recipe_files(recipe, recipe_format, local), (channel,),
                         recipe.pytorch.cuda or "cpu", local, arch_list=recipe.pytorch.arch_list)
