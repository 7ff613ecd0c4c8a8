"""`torchforge ci` for a flavour whose recipe folders yield several packages in one engine run (the conda-forge
flavour: libtorch, pytorch per Python and the metapackage).

One build job per recipe folder runs `torchforge build` for it (the same command builds it locally), one test
job per Python installs that Python's packages of it into a fresh environment (CPU packages on the build runner,
CUDA ones on the GPU runner), and the upload and promote jobs are the official flavour's. The jobs are made from
the neutral plan only: `CiRecipe`, which `from_planned` makes from a `flavours.base.PlannedRecipe` (the one adapter;
the flavour's own model is never read here), and the file is rendered by `torchforge.ci` as the official one is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchforge import versions
from torchforge.ci import (
    ALL, CHANNEL_DIR, CiPlan, Job, Provider, TestJob, accel_tag, conda_spec, default_runner, gpu_labels, image_fields,
    load_data, parse_runner_map, pinned_requirement, upload_plan,
)
from torchforge.compilecache import recipe_group_key
from torchforge.config import SiteConfig
from torchforge.containers import require_image
from torchforge.errors import UsageError
from torchforge.flavours.base import PlannedRecipe
from torchforge.targets import Target

CPU = "cpu"
KIND = "recipe"  # the build jobs' kind, and their GitLab stage
# The engine that comes with torchforge: a job builds the same way whether its image has conda-build or not
# (`--engine auto` would take an image's conda-build, which reads the other recipe format).
ENGINE = ("--engine", "rattler-build")


@dataclass(frozen=True)
class CiRecipe:
    """What CI needs of one planned recipe folder."""

    id: str
    subdir: str
    stems: tuple[str, ...]  # every package's name-version-build, in build order
    accel: str  # "cpu" or CUDA "X.Y"
    channels: tuple[str, ...]  # the flavour's channels, before the site's replacements
    cache_key: str  # the compile cache group `torchforge build` uses for it (compilecache.recipe_group_key)
    pythons: tuple[tuple[str, str], ...] = ()  # (stem, Python X.Y) of the packages built per Python
    needs: tuple[str, ...] = ()  # ids of recipes whose packages this one installs

    @property
    def version(self) -> str:
        """The release its packages carry (every package of one recipe has the same version)."""
        return self.stems[0].rsplit("-", 2)[1]

    @property
    def python_versions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(python for _, python in self.pythons))


def from_planned(planned: Sequence[PlannedRecipe]) -> tuple[CiRecipe, ...]:
    """The adapter from the pipeline's plan (the one place that reads a PlannedRecipe)."""
    return tuple(CiRecipe(p.id, p.subdir, tuple(p.stems), p.accel, tuple(p.channels),
                          recipe_group_key(p.id, p.settings), tuple(p.pythons)) for p in planned)


@dataclass(frozen=True)
class RecipeJobSettings:
    """The command line's choices every job repeats or follows."""

    provider: Provider
    request_args: tuple[str, ...] = ()  # selection flags besides --pytorch/--cuda/--py/--platform (--arch-list ...)
    extra_args: tuple[str, ...] = ()  # --flavour, --channel, --config, --skip-preflight
    runner: str | None = None
    runner_map: str | None = None
    gpu_runner: str | None = None
    upload_to: Target | None = None
    requirement: str | None = None
    regenerate: str = "torchforge ci"
    site: SiteConfig | None = None
    test_script: str | None = None


def build_argv(recipe: CiRecipe, settings: RecipeJobSettings) -> tuple[str, ...]:
    """`torchforge build` of exactly this recipe folder: its CUDA, all its Pythons, one engine run."""
    return ("torchforge", "build", "--pytorch", recipe.version, "--cuda", recipe.accel,
            "--py", ",".join(recipe.python_versions), "--platform", recipe.subdir, *ENGINE, *settings.request_args,
            *settings.extra_args, "--out", CHANNEL_DIR)


def _image(recipe: CiRecipe, settings: RecipeJobSettings, site: SiteConfig) -> dict[str, Any]:
    """The build image: the site's cpu image for every recipe, as the compilers and the CUDA toolkit come from the
    flavour's channel. On GitHub only where it can be a `container:` job: the flavour has no --container build."""
    if recipe.subdir != "linux-64":
        return {}
    fields = image_fields(CPU, require_image(CPU, site.images))
    if settings.provider is Provider.GITHUB and not (fields["glibc"] and versions.parse(fields["glibc"]) >= versions.parse(
            load_data().tools.container_min_glibc)):
        return {}
    return fields


def _test_jobs(recipe: CiRecipe, job: Job, gpu: tuple[str, ...]) -> list[TestJob]:
    """One per Python: that Python's packages of the recipe and the ones built once (libtorch, the metapackage)."""
    per_python = dict(recipe.pythons)
    shared = [stem for stem in recipe.stems if stem not in per_python]
    tag = job.key.removeprefix("build-")
    return [TestJob(key=f"test-{tag}-py{versions.nodot(python)}", build=job, magma=None,
                    specs=tuple(conda_spec(stem) for stem in (*shared, *(s for s, p in recipe.pythons if p == python))),
                    version=recipe.version, runner=job.runner if job.accel == CPU else gpu, python=python)
            for python in recipe.python_versions]


def recipes_ci_plan(recipes: Sequence[CiRecipe], settings: RecipeJobSettings) -> CiPlan:
    """The jobs of the recipe folders and who needs whom."""
    if not recipes:
        raise UsageError("the selection has no recipes", "give --cuda and --py values")
    platform = recipes[0].subdir
    site = settings.site or SiteConfig()
    base_runner = default_runner(settings.provider, platform, settings.runner)
    per_accel = parse_runner_map(settings.runner_map, tuple(dict.fromkeys(r.accel for r in recipes)))
    gpu = gpu_labels(settings.provider, platform, settings.gpu_runner, site)
    keys = {recipe.id: f"build-{accel_tag(recipe.accel)}" for recipe in recipes}
    jobs, tests = [], []
    for recipe in recipes:
        job = Job(key=keys[recipe.id], package=recipe.id, kind=KIND, platform=recipe.subdir, accel=recipe.accel,
                  argv=build_argv(recipe, settings), needs=tuple(keys[n] for n in recipe.needs), after=None,
                  runner=per_accel.get(recipe.accel, base_runner), cache_key=recipe.cache_key,
                  **_image(recipe, settings, site), channels=site.channels.apply(recipe.channels))
        jobs.append(job)
        tests += _test_jobs(recipe, job, gpu)
    # A recipe job runs when it is chosen and when any job that installs its packages is chosen.
    run_selectors = {job.key: (ALL, job.package, *(j.package for j in jobs if job.key in j.needs)) for job in jobs}
    stems = [stem for recipe in recipes for stem in recipe.stems]
    upload = upload_plan(settings.upload_to, base_runner, stems) if settings.upload_to is not None else None
    return CiPlan(tuple(jobs), run_selectors, upload, pinned_requirement(settings.requirement), settings.regenerate,
                  tuple(tests), settings.test_script, build_stages=(KIND,))
