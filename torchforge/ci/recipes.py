"""`torchforge ci`'s jobs, made from a flavour's neutral plan (flavours.base.Plan) alone, for every flavour.

One build job per distinct `torchforge build` command of the plan's recipes (`PlannedRecipe.build_flags`: the
official flavour's magma-cudaXYZ and each pytorch variant, the conda-forge flavour's recipe folder and each --with
package of it); a recipe with no command of its own (the official companions) is built by the jobs beside it.
One test job per Python a job's recipes build (`PlannedRecipe.pythons`): it installs that Python's packages into
a fresh environment, the CPU ones on the build runner, CUDA ones on the GPU runner. The upload waits for every
test, staged and promoted where the target has labels. The file is rendered by `torchforge.ci`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchforge import versions
from torchforge.ci import (
    ALL, CHANNEL_DIR, CiPlan, CiRemoteCache, Job, Provider, TestJob, accel_tag, conda_spec, default_runner, gpu_labels, image_fields,
    load_data, parse_runner_map, pinned_requirement, upload_plan,
)
from torchforge.compilecache import group_key, settings_material
from torchforge.config import SiteConfig
from torchforge.containers import require_image
from torchforge.errors import UsageError
from torchforge.extensions.recipe import KIND as EXTENSION
from torchforge.flavours.base import Plan, PlannedRecipe
from torchforge.targets import Target

CPU = "cpu"
# Kinds whose job keys name the CUDA (and Python) alone: pytorch-cu124-py312 and test-cu124-py312, build-cpu and
# test-cpu-py311; the others' keys start with their kind (magma-cu124, torchvision-cpu, test-torchvision-cpu-py311).
MAIN_KINDS = {"pytorch": "pytorch", "recipe": "build"}


@dataclass(frozen=True)
class JobSettings:
    """The command line's choices every job repeats or follows."""

    provider: Provider
    flavour_flags: tuple[str, ...] = ()  # --flavour X where the jobs must pin it
    site_flags: tuple[str, ...] = ()  # --channel, --config, --skip-preflight: every build job passes them on
    runner: str | None = None
    runner_map: str | None = None
    gpu_runner: str | None = None
    upload_to: Target | None = None
    requirement: str | None = None
    site: SiteConfig | None = None
    test_script: str | None = None
    # The command line that writes the file again, after --pytorch/--cuda/--py/--platform (resolved from the plan)
    # and before and after --flavour: (flag, value or None)
    given: tuple[tuple[str, str | None], ...] = ()
    given_after: tuple[tuple[str, str | None], ...] = ()
    remote_cache: CiRemoteCache | None = None  # --cache-url: the compile cache server every build job uses


@dataclass(frozen=True)
class Resolved:
    """The request as the plan resolved it (a default release, every CUDA, every Python): the header's command."""

    release: str
    accels: tuple[str, ...]
    pythons: tuple[str, ...]
    platform: str

    def flags(self) -> tuple[tuple[str, str | None], ...]:
        return (("--pytorch", self.release), ("--cuda", ",".join(self.accels)), ("--py", ",".join(self.pythons)),
                ("--platform", self.platform))


def resolved(plan: Plan) -> Resolved:
    """Read from the recipes that build Python packages (the pytorch ones): their release, CUDA, Pythons."""
    tested = [recipe for recipe in plan.recipes if recipe.pythons and recipe.build_flags]
    if not tested:
        raise UsageError("the selection has no recipes", "give --cuda and --py values")
    return Resolved(tested[0].stems[0].rsplit("-", 2)[1], tuple(dict.fromkeys(r.accel for r in tested)),
                    tuple(dict.fromkeys(p for r in tested for _, p in r.pythons)), tested[0].subdir)


def regenerate_line(provider: Provider, argv: Sequence[tuple[str, str | None]]) -> str:
    """The command that writes the same file again (flags that were given, in a fixed order)."""
    words = ["torchforge", "ci", provider.value]
    for flag, value in argv:
        words += [flag] if value is None else [flag, value]
    return shlex.join(words)


def _key(group: Sequence[PlannedRecipe]) -> str:
    """A job's key from its recipes: by their kind (an extension by its package's name: each has its own job), the
    Python where the job builds for one Python only."""
    recipe = group[0]
    prefix = recipe.stems[0].rsplit("-", 2)[0] if recipe.kind == EXTENSION else MAIN_KINDS.get(recipe.kind, recipe.kind)
    python = recipe.python if len({r.python for r in group}) == 1 else ""
    return f"{prefix}-{accel_tag(recipe.accel)}" + (f"-py{versions.nodot(python)}" if python else "")


def _image(recipe: PlannedRecipe, plan: Plan, settings: JobSettings, site: SiteConfig) -> dict[str, Any]:
    """The build image (linux-64): the recipe's CUDA version's image where the toolkit comes from the machine,
    else the cpu image (compilers and toolkit come from the flavour's channel), on GitHub only where it can be a
    `container:` job."""
    if recipe.subdir != "linux-64":
        return {}
    if plan.needs.toolkit_on_host:
        return image_fields(recipe.accel, require_image(recipe.accel, site.images), recipe.cudnn)
    fields = image_fields(CPU, require_image(CPU, site.images))
    if settings.provider is Provider.GITHUB and not (fields["glibc"] and versions.parse(fields["glibc"]) >= versions.parse(
            load_data().tools.container_min_glibc)):
        return {}
    return fields


def _test_jobs(job: Job, recipes: Sequence[PlannedRecipe], plan: Plan, keys: dict[str, str], release: str,
               gpu: tuple[str, ...]) -> list[TestJob]:
    """One per Python of each recipe: that Python's packages, the recipe's others (libtorch, the metapackage) and
    those of the Python-free recipes it needs (its magma), installed beside them."""
    by_id = {recipe.id: recipe for recipe in plan.recipes}
    tests = []
    for recipe in recipes:
        per_python = dict(recipe.pythons)
        shared = [stem for stem in recipe.stems if stem not in per_python]
        beside = [by_id[need] for need in recipe.needs if need in by_id and not by_id[need].pythons]
        short = job.key.split("-", 1)[1] if recipe.kind in MAIN_KINDS else job.key
        one_python = bool(recipe.python) and len({r.python for r in recipes}) == 1  # the job's key names it
        for python in dict.fromkeys(per_python.values()):
            stems = (*shared, *(s for s, p in recipe.pythons if p == python), *(s for b in beside for s in b.stems))
            tests.append(TestJob(
                key=f"test-{short}" + ("" if one_python else f"-py{versions.nodot(python)}"), build=job,
                magma=next((keys[b.id] for b in beside if b.id in keys), None), specs=tuple(map(conda_spec, stems)),
                version=release, runner=job.runner if job.accel == CPU else gpu, python="" if one_python else python))
    return tests


def ci_plan(plan: Plan, settings: JobSettings) -> CiPlan:
    """The jobs of a plan's recipes and who needs whom."""
    request = resolved(plan)
    site = settings.site or SiteConfig()
    groups: dict[tuple[str, ...], list[PlannedRecipe]] = {}
    for recipe in plan.recipes:
        if recipe.build_flags:
            groups.setdefault(recipe.build_flags, []).append(recipe)
    base_runner = default_runner(settings.provider, request.platform, settings.runner)
    per_accel = parse_runner_map(settings.runner_map, (*request.accels, *(r.accel for r in plan.recipes)))
    gpu = gpu_labels(settings.provider, request.platform, settings.gpu_runner, site)
    keys = {recipe.id: _key(group) for group in groups.values() for recipe in group}
    seeds: dict[str, str] = {}  # compile cache key -> the first job that fills it (the others start after it)
    jobs, tests = [], []
    for flags, group in groups.items():
        first, key = group[0], keys[group[0].id]
        cache_key = first.cache_group or group_key(*settings_material(first.id, first.settings))
        after = seeds.setdefault(cache_key, key)
        job = Job(key=key, package=first.id, kind=first.kind, platform=first.subdir, accel=first.accel,
                  argv=("torchforge", "build", *flags, *settings.flavour_flags, *settings.site_flags, "--out",
                        CHANNEL_DIR),
                  needs=tuple(dict.fromkeys(keys[n] for r in group for n in r.needs if n in keys)),
                  after=None if after == key else after, runner=per_accel.get(first.accel, base_runner),
                  cache_key=cache_key, **_image(first, plan, settings, site),
                  channels=site.channels.apply(first.channels))
        jobs.append(job)
        tests += _test_jobs(job, group, plan, keys, request.release, gpu)
    # A job runs when it is chosen and when any job that installs its packages is chosen.
    run_selectors = {job.key: (ALL, job.package, *(j.package for j in jobs if job.key in j.needs)) for job in jobs}
    # Every package of the plan, those built beside the jobs' own too (the official companions); what other
    # recipes install (magma) first.
    needed = {need for recipe in plan.recipes for need in recipe.needs}
    stems = [stem for recipe in sorted(plan.recipes, key=lambda r: r.id not in needed) for stem in recipe.stems]
    upload = upload_plan(settings.upload_to, base_runner, stems) if settings.upload_to is not None else None
    regenerate = regenerate_line(settings.provider, (
        *request.flags(), *settings.given,
        *((("--flavour", settings.flavour_flags[1]),) if settings.flavour_flags else ()), *settings.given_after))
    return CiPlan(tuple(jobs), run_selectors, upload, pinned_requirement(settings.requirement), regenerate,
                  tuple(tests), settings.test_script, build_stages=tuple(dict.fromkeys(job.kind for job in jobs)),
                  remote_cache=settings.remote_cache)
