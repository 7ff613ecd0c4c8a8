"""The conda-forge flavour's recipes: one per (release, platform, CUDA or cpu, arch list), its outputs and build
strings, and the recipe folder laid out with the templates in recipe_templates/conda_forge/. Pure: no files, no
commands."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass

from torchforge import __version__, versions
from torchforge import data as tables
from torchforge.compilecache import BUILD_VARIABLES
from torchforge.errors import RefusedError, UsageError
from torchforge.flavours.base import JOBS_VARIABLE
from torchforge.sourcestate import Source
from torchforge.templates import RecipeFormat, render_template
from torchforge.sharedflags import nvcc_refusal, split_list
from torchforge.flavours.conda_forge.facts import (
    Accel,
    Blas,
    OUTPUT_KEYS,
    PLATFORMS,
    WINDOWS,
    CiSupport,
    JobFact,
    PlatformJobs,
    FlavourSettings,
    CondaForgeTable,
    CUDA_OFFSET,
    MKL_OFFSET,
    load,
)
from torchforge.flavours.conda_forge.specs import conda_build_spec, rattler_build_spec

@dataclass(frozen=True)
class Output:
    """One output of the recipe. Its build string is planned here, whole: conda-forge's words and the marker
    (`cuda124_mkl_torchforge`), `_py312` for pytorch, then torchforge's digest of the recipe's settings and the
    build number (`h1a2b3c4_301`) where conda-build would put its own hash, so every engine gives the same names
    and the pipeline knows each file name before the build."""

    name: str
    words: str  # conda-forge's variant words and the marker: cuda124_mkl_torchforge
    per_python: bool  # one package per Python (pytorch): the build string carries _pyXY
    requirements: dict[str, tuple[str, ...]]  # key -> specs, in the feedstock's order
    suffix: str = ""  # h<digest of the recipe's settings>_<build number>: plan() fills it in once the recipe is known

    def build_string_with(self, python_word: str) -> str:
        """The build string with `python_word` where the Python goes: `312`, or a recipe format's expression."""
        python = f"_py{python_word}" if self.per_python else ""
        return f"{self.words}{python}_{self.suffix}"

    def build_string_for(self, python: str | None) -> str:
        """The full build string of this output for a Python X.Y (None for an output that is not per Python)."""
        if self.per_python and python is None:
            raise ValueError(f"{self.name} is built per Python: name one")
        return self.build_string_with(versions.nodot(python) if self.per_python and python else "")

    @property
    def build_string(self) -> str:
        """meta.yaml's: conda-build fills in the Python (py{{ CONDA_PY }})."""
        return self.build_string_with("{{ CONDA_PY }}")


@dataclass(frozen=True)
class PlannedOutput:
    """One package a recipe yields: exactly the name-version-build the engine must produce."""

    name: str
    version: str
    build_string: str
    subdir: str
    python: str | None  # the Python of a per-Python output (pytorch), else None

    @property
    def stem(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}"


@dataclass(frozen=True)
class CondaForgeRecipe:
    """One conda-forge-flavoured recipe: libtorch once, pytorch per Python, the metapackage."""

    version: str
    platform: str
    cuda: str | None
    arch_list: str
    blas: Blas
    pythons: tuple[str, ...]
    build_number: int
    feedstock_commit: str
    outputs: tuple[Output, ...]
    env: tuple[tuple[str, str], ...]
    variant_config: tuple[tuple[str, tuple[str, ...]], ...]
    activation_variable: str
    warnings: tuple[str, ...]
    feedstock_patches: tuple[tuple[str, str, str], ...] = ()  # (URL, sha256, path) of each patch of this job
    # What the recipe builds from, where the user chose it (with_inputs): the identity of a --source
    # (torchforge.sourcestate), the sha256 of each --patch, whether the feedstock's patches are applied. Part of
    # the settings, so another source or patch is another package.
    source_identity: str | None = None
    patch_digests: tuple[str, ...] = ()
    applies_feedstock_patches: bool = False

    @property
    def accel(self) -> Accel:
        return "cuda" if self.cuda else "cpu"

    @property
    def tag(self) -> str:
        """conda-forge's variant word (cuda129 / cpu)."""
        return f"cuda{versions.nodot(self.cuda)}" if self.cuda else "cpu"

    @property
    def id(self) -> str:
        arch = f"-sm{self.arch_list.replace(';', '_').replace('.', '').replace('+', '')}" if self.cuda else ""
        return f"libtorch-{self.version}-{self.tag}{arch}-{self.platform.replace('-', '_')}"

    @property
    def settings(self) -> str:
        """Everything that changed the binary: the reuse check and the package's `extra` record it."""
        return json.dumps({"flavour": "conda-forge", "feedstock": self.feedstock_commit, "cuda": self.cuda or "cpu",
                           "arch_list": self.arch_list, "blas": self.blas, "build_number": self.build_number,
                           "libtorch_python": self.libtorch_python, **self._input_settings},
                          sort_keys=True)

    @property
    def _input_settings(self) -> dict[str, object]:
        """Only what was chosen: a recipe of the release's source without patches keeps the settings (and build
        strings) it always had."""
        return {**({"source": self.source_identity} if self.source_identity else {}),
                **({"patch": list(self.patch_digests)} if self.patch_digests else {}),
                **({"feedstock_patches": True} if self.applies_feedstock_patches else {})}

    def build_string(self, name: str, python: str | None = None) -> str:
        """The full build string of output `name` (for a Python X.Y where it is built per Python)."""
        return self.output(name).build_string_for(python)

    def planned_outputs(self) -> tuple[PlannedOutput, ...]:
        """Every package one build of this recipe yields, in build order: libtorch, pytorch per Python, the
        metapackage."""
        planned: list[PlannedOutput] = []
        for output in self.outputs:
            for python in self.pythons if output.per_python else (None,):
                planned.append(PlannedOutput(output.name, self.version, output.build_string_for(python),
                                             self.platform, python))
        return tuple(planned)

    def index_fields(self) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
        """Per package (stem), the info/index.json fields every engine must leave in it that recipe.yaml cannot
        say: the feedstock's track_features (2.6.0 and 2.7.0's pytorch-cpu), which the pipeline sets after the
        build where the engine did not write them."""
        features = {o.name: " ".join(o.requirements.get("track_features", ())) for o in self.outputs}
        return tuple((planned.stem, (("track_features", features[planned.name]),))
                     for planned in self.planned_outputs() if features[planned.name])

    @property
    def libtorch_python(self) -> str:
        """The Python libtorch is built against once (its host's `python X.Y`); each pytorch rebuilds the bindings."""
        spec = next(s for s in self.outputs[0].requirements["host"] if s.split()[0] == "python")
        return spec.split()[1]

    @property
    def magma(self) -> str | None:
        """The MAGMA libtorch links: conda-forge's package in host (its run_exports bring libmagma at run time)."""
        return next((spec for spec in self.outputs[0].requirements["host"]
                     if spec.split()[0] in ("libmagma-devel", "libmagma", "magma")), None)

    @property
    def unpatched_warning(self) -> str:
        """What a recipe rendered without the feedstock's patches must say."""
        release = load().releases[self.version]
        return (f"conda-forge applies {release.patches.count} source patches to PyTorch {self.version} "
                f"({release.patches.source} at {release.commit[:12]}); this recipe applies none of them unless "
                "rendered with --feedstock-patches: a build may fail or differ where the feedstock needed one")

    def warnings_for(self, feedstock_patches: bool) -> tuple[str, ...]:
        return self.warnings if feedstock_patches else (self.unpatched_warning, *self.warnings)

    def output(self, name: str) -> Output:
        return next(o for o in self.outputs if o.name == name)


def plan(version: str, platform: str, accel: str, arch_list: str | None = None,
         pythons: tuple[str, ...] | None = None, build_number: int = 0) -> CondaForgeRecipe:
    """The recipe of one release for one CUDA X.Y (or cpu) and arch list; defaults are the feedstock's."""
    table = load()
    settings = table.flavour
    release = table.releases.get(version)
    if release is None:
        raise UsageError(f"--flavour conda-forge has no facts for PyTorch {version}",
                         f"pick one of {', '.join(table.releases)}, or use --flavour official")
    jobs = platform_jobs(table, version, platform)
    cuda = None if accel == "cpu" else accel
    warnings: list[str] = []
    blas = settings.blas[platform]
    arch, arch_note = _arch_list(version, jobs, cuda, arch_list)
    reference = reference_cuda(jobs, cuda)
    ci = jobs.ci_support[reference or "cpu"]
    if cuda is not None and reference != cuda:
        built = (f"conda-forge's PyTorch {version} at {release.commit[:8]} has no CUDA {cuda} job (its earlier builds "
                 "had one)" if cuda in jobs.earlier_arch_list else f"conda-forge never built PyTorch {version} for CUDA {cuda}")
        warnings.append(f"{built}: compilers, pins and CUDA-specific settings follow its CUDA {reference} job ({ci.file})")
    if arch_note:
        warnings.append(arch_note)
    c_version, compiler_warning = _compiler_version(ci.c_compiler_version.value, cuda) if ci.c_compiler_version \
        else _visual_studio(settings, ci.c_compiler.value if ci.c_compiler else "", cuda)
    if compiler_warning:
        warnings.append(compiler_warning)
    if platform == WINDOWS:
        warnings.append(windows_build_note(c_version))
    known_pythons = ci.python.value
    chosen = pythons or known_pythons
    unknown = [p for p in chosen if p not in known_pythons]
    if unknown:
        raise UsageError(f"conda-forge built PyTorch {version} for Python {', '.join(known_pythons)}, not {', '.join(unknown)}",
                         f"use --py with some of {','.join(known_pythons)} ({ci.file})")
    build = release.build_number + build_number + (CUDA_OFFSET if cuda else 0) + (MKL_OFFSET if blas == "mkl" else 0)
    accel_key: Accel = "cuda" if cuda else "cpu"
    fields = {"version": version, "build": str(build), "blas": blas, "cuda_nodot": versions.nodot(cuda) if cuda else "",
              "cuda": cuda or "", "py": "{{ CONDA_PY }}"}
    ours = set(release.outputs(accel_key))
    outputs = tuple(_output(jobs, name, ours, accel_key, blas, reference, fields, settings.marker)
                    for name in release.outputs(accel_key) if name not in settings.omitted_outputs)
    outputs, python_warning = _libtorch_python(outputs, tuple(chosen), jobs)
    if python_warning:
        warnings.append(python_warning)
    env = [(row.name, _format(row.value, fields)) for row in jobs.recipe.env
           if _applies(row, accel_key, blas, reference)]
    if cuda:
        env.append(("TORCH_CUDA_ARCH_LIST", arch))
    config = _variant_config(ci, chosen, blas, cuda, c_version, arch, platform)
    patches = tuple((settings.feedstock_files.format(commit=release.commit, path=f"recipe/{p.path}"), p.sha256, p.path)
                    for p in jobs.recipe.patches if _applies(p, accel_key, blas, reference))
    return with_build_strings(CondaForgeRecipe(
        version=version, platform=platform, cuda=cuda, arch_list=arch, blas=blas, pythons=tuple(chosen),
        build_number=build, feedstock_commit=release.commit, outputs=outputs, env=tuple(env),
        variant_config=config,
        activation_variable=activation.variable if (activation := jobs.activation or release.activation)
        else "CF_TORCH_CUDA_ARCH_LIST",
        warnings=tuple(warnings), feedstock_patches=patches,
    ))


def with_inputs(recipe: CondaForgeRecipe, source_identity: str | None, digests: tuple[str, ...],
                feedstock_patches: bool) -> CondaForgeRecipe:
    """The recipe built from the user's --source (its identity), with the user's patches (their sha256) and, if
    asked, the feedstock's: other settings, so other build strings."""
    return with_build_strings(dataclasses.replace(recipe, source_identity=source_identity, patch_digests=digests,
                                                  applies_feedstock_patches=feedstock_patches))


def with_build_strings(recipe: CondaForgeRecipe) -> CondaForgeRecipe:
    """The recipe with every output's build string complete: torchforge's digest of the recipe's settings (all of
    them, whatever they come to hold) and the build number, one for all outputs."""
    suffix = f"h{settings_digest(recipe.settings)}_{recipe.build_number}"
    return dataclasses.replace(recipe, outputs=tuple(dataclasses.replace(o, suffix=suffix) for o in recipe.outputs))


def windows_build_note(compiler: str) -> str:
    """What a win-64 recipe needs: torchforge renders it anywhere, but builds on linux only."""
    return ("win-64 is rendered, not built, by torchforge (its builds run on linux): build this folder on a Windows "
            f"machine with Visual Studio's {compiler} toolchain, `conda build FOLDER -c conda-forge --override-channels`")


def platform_jobs(table: CondaForgeTable, version: str, platform: str) -> PlatformJobs:
    """The feedstock's jobs of one subdir at a release, or what would work where it has none."""
    release = table.releases[version]
    if platform not in PLATFORMS:
        raise UsageError(f"--flavour conda-forge renders {', '.join(PLATFORMS)}, not {platform}",
                         f"use --platform {' or '.join(PLATFORMS)}, or --flavour official")
    if platform in release.not_built:
        having = [v for v, r in table.releases.items() if platform in r.platforms]
        raise UsageError(
            f"conda-forge's feedstock has no {platform} build of PyTorch {version} "
            f"({release.not_built[platform]}, {release.commit[:12]}), so there is nothing to follow",
            f"--platform {platform} renders PyTorch {', '.join(having)}" if having
            else f"use --platform {' or '.join(p for p in release.platforms)}")
    return release.platforms[platform]


def _arch_list(version: str, jobs: PlatformJobs, cuda: str | None, arch_list: str | None) -> tuple[str, str | None]:
    """(the arch list, a line saying where it comes from where that is not the feedstock's job or the user)."""
    if cuda is None:
        if arch_list:
            raise UsageError("--arch-list applies to CUDA builds only", "leave --arch-list out for cpu")
        return "", None
    toolkit = tables.load().cuda.toolkits.get(cuda)
    if toolkit is None:
        raise UsageError(f"CUDA {cuda} is unknown to torchforge", "use a CUDA X.Y that `torchforge doctor` lists")
    minimum = tables.load().pytorch.releases[versions.minor(version)].min_cuda
    if versions.parse(cuda) < versions.parse(minimum):
        raise UsageError(f"PyTorch {version} needs CUDA {minimum} or newer, not {cuda}", f"use --cuda {minimum} or newer")
    if arch_list is None:
        return _default_arch_list(version, jobs, cuda)
    outside = [why for arch in arch_list.split(";") if (why := nvcc_refusal(cuda, arch))]  # checked: check_arch_list
    if outside:
        raise RefusedError("; ".join(outside))
    return arch_list, None


def _default_arch_list(version: str, jobs: PlatformJobs, cuda: str) -> tuple[str, str | None]:
    """(arch list, where it comes from if not the release commit's own job): the feedstock's job for this CUDA,
    else its earlier builds of the release for it, else PyTorch's own wheels of the release for it."""
    if cuda in jobs.arch_list:
        return jobs.arch_list[cuda].value, None
    if cuda in jobs.earlier_arch_list:
        earlier = jobs.earlier_arch_list[cuda]
        return earlier.value, (f"arch list for CUDA {cuda}: conda-forge's earlier PyTorch {version} builds' "
                               f"({earlier.source}), {earlier.value}")
    wheel = tables.load().pytorch.releases[versions.minor(version)].cuda.get(cuda)
    if wheel is not None and wheel.wheel_arch:
        return wheel.wheel_arch, (f"arch list for CUDA {cuda}: conda-forge never built PyTorch {version} for it, so "
                                  f"PyTorch's own {version} wheels' (pytorch.toml), {wheel.wheel_arch}")
    raise UsageError(
        f"neither conda-forge nor PyTorch's wheels built PyTorch {version} for CUDA {cuda}, so there is no arch "
        "list to follow",
        f"give one with --arch-list (archs nvcc {cuda} builds, ';'-separated); the feedstock's: "
        + "; ".join(f"CUDA {c}: {a.value}" for c, a in jobs.arch_list.items()))


def _libtorch_python(outputs: tuple[Output, ...], chosen: tuple[str, ...],
                     jobs: PlatformJobs) -> tuple[tuple[Output, ...], str | None]:
    """libtorch is built with the feedstock's Python (its host pins one) where the chosen Pythons include it, else
    with the first chosen one: libtorch's run requirements never name Python (its ignore_run_exports has python),
    so this changes how it is built, not what it needs."""
    libtorch, *others = outputs
    host = libtorch.requirements["host"]
    index, spec = next((i, s) for i, s in enumerate(host) if s.split()[0] == "python")
    feedstock = spec.split()[1]
    if feedstock in chosen:
        return outputs, None
    source = next(r.source for r in jobs.recipe.requirements if r.output == libtorch.name and r.key == "host"
                  and r.spec == spec)
    pinned = host[:index] + (f"python {chosen[0]}",) + host[index + 1:]
    rebuilt = dataclasses.replace(libtorch, requirements={**libtorch.requirements, "host": pinned})
    return (rebuilt, *others), (f"conda-forge builds libtorch with Python {feedstock} ({source}), which --py "
                                f"{','.join(chosen)} leaves out: libtorch builds with Python {chosen[0]} (recorded in "
                                "the settings; its run requirements name no Python either way)")


def _compiler_version(feedstock: str, cuda: str | None) -> tuple[str, str | None]:
    """The feedstock's GCC, unless nvcc of the requested CUDA refuses it (then the newest it accepts)."""
    if cuda is None:
        return feedstock, None
    limit = tables.load().cuda.toolkits[cuda].max_gcc
    if limit is not None and int(feedstock) > limit:
        return str(limit), f"nvcc {cuda} accepts GCC {limit} at most: the compilers are GCC {limit}, not the feedstock's {feedstock}"
    return feedstock, None


def _visual_studio(settings: FlavourSettings, feedstock: str, cuda: str | None) -> tuple[str, str | None]:
    """The feedstock's Visual Studio package, unless nvcc of the requested CUDA refuses all of its MSVC versions
    (then the newest package it accepts); a warning where it refuses the newer ones only."""
    accepted = tables.load().cuda.toolkits[cuda].msvc if cuda else None
    if accepted is None or feedstock not in settings.visual_studio:
        return feedstock, None
    low, high = settings.visual_studio[feedstock]
    if low > accepted[1]:
        fitting = [name for name, (lo, hi) in settings.visual_studio.items() if lo <= accepted[1] and hi >= accepted[0]]
        if fitting:
            chosen = max(fitting, key=lambda name: settings.visual_studio[name][0])
            return chosen, (f"nvcc {cuda} accepts MSVC _MSC_VER {accepted[0]}-{accepted[1]}: the compilers are "
                            f"{chosen}, not the feedstock's {feedstock}")
    if high > accepted[1]:
        return feedstock, (f"nvcc {cuda} accepts MSVC _MSC_VER up to {accepted[1]}: build with a {feedstock} toolset "
                           f"no newer than that ({feedstock} spans {low}-{high})")
    return feedstock, None


def reference_cuda(jobs: PlatformJobs, cuda: str | None) -> str | None:
    """The feedstock CUDA job a CUDA follows: itself where conda-forge built it, else the newest of the same major,
    else the nearest."""
    if cuda is None or cuda in jobs.cuda:
        return cuda
    major = [c for c in jobs.cuda if c.split(".")[0] == cuda.split(".")[0]]
    if major:
        return max(major, key=versions.parse)
    older = versions.parse(cuda) < versions.parse(min(jobs.cuda, key=versions.parse))
    return min(jobs.cuda, key=versions.parse) if older else max(jobs.cuda, key=versions.parse)


def _applies(row: JobFact, accel: Accel, blas: Blas, reference: str | None) -> bool:
    return ((row.accel is None or row.accel == accel) and (row.blas is None or row.blas == blas)
            and (row.cuda is None or row.cuda == reference))


def _format(text: str, fields: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), m.group(0)), text)


def settings_digest(settings: str) -> str:
    """torchforge's stand-in for conda-build's PKG_HASH: 7 hex digits of the settings, so every engine and the
    pipeline know the build string before a build (another arch list or CUDA: another package)."""
    return hashlib.sha256(settings.encode()).hexdigest()[:7]


def _output(jobs: PlatformJobs, name: str, ours: set[str], accel: Accel, blas: Blas, reference: str | None,
            fields: dict[str, str], marker: str) -> Output:
    requirements: dict[str, tuple[str, ...]] = {}
    for key in OUTPUT_KEYS:
        specs = [_mark(_format(r.spec, fields), ours, blas, marker) for r in jobs.recipe.requirements
                 if r.output == name and r.key == key and _applies(r, accel, blas, reference)]
        requirements[key] = tuple(dict.fromkeys(specs))
    word = f"cuda{fields['cuda_nodot']}" if accel == "cuda" else "cpu"
    return Output(name, f"{word}_{blas}_{marker}", name == "pytorch", requirements)


def _mark(spec: str, ours: set[str], blas: str, marker: str) -> str:
    """A spec that pins one of this recipe's own packages by build string gets the marker after blas_impl, so a
    torchforge libtorch pairs with a torchforge pytorch and never with conda-forge's."""
    parts = spec.split()
    if len(parts) == 3 and parts[0] in ours and f"_{blas}" in parts[2]:
        parts[2] = parts[2].replace(f"_{blas}", f"_{blas}_{marker}", 1)
    return " ".join(parts)


def _variant_config(ci: CiSupport, pythons: tuple[str, ...] | list[str], blas: str, cuda: str | None,
                    c_version: str, arch: str, platform: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The job's variant. Windows: Visual Studio's compiler packages (no version key), and win-64 as the target so
    the recipe renders for it on any machine."""
    if platform == WINDOWS:
        assert ci.c_compiler and ci.cxx_compiler and ci.c_stdlib  # checked by check_invariants
        target = [("target_platform", (WINDOWS,))]
        studio = c_version or ci.c_compiler.value  # the job's, or the one nvcc accepts (_visual_studio)
        compilers = [("c_compiler", (studio,)), ("cxx_compiler", (studio,)), ("c_stdlib", (ci.c_stdlib.value,))]
    else:
        assert ci.c_stdlib_version  # checked by check_invariants
        target = []
        compilers = [("c_compiler", ("gcc",)), ("cxx_compiler", ("gxx",)), ("c_compiler_version", (c_version,)),
                     ("cxx_compiler_version", (c_version,)), ("c_stdlib", ("sysroot",)),
                     ("c_stdlib_version", (ci.c_stdlib_version.value,))]
    config: list[tuple[str, tuple[str, ...]]] = [
        *target,
        ("python", tuple(dict(zip(ci.python.value, ci.python.variant))[python] for python in pythons)),
        ("blas_impl", (blas,)),
        *compilers,
        ("cuda_compiler", ("cuda-nvcc" if cuda else "None",)),
        ("cuda_compiler_version", (cuda or "None",)),
        ("torch_cuda_arch_list", (arch or "None",)),
    ]
    config.extend((pin.name, (pin.value,)) for pin in ci.pins)
    return tuple(config)


def header(recipe: CondaForgeRecipe) -> str:
    return (f"Rendered by torchforge {__version__} for {recipe.id} (flavour conda-forge, feedstock "
            f"{recipe.feedstock_commit[:12]}). Re-render instead of editing.")


# ---- the recipe folder ------------------------------------------------------------------------------------

# Where conda-build puts the downloaded feedstock patches, inside the source tree (their paths below it are the
# feedstock's, e.g. patches/0001-....patch).
PATCH_FOLDER = "conda-forge-patches"
# torchforge's own CMake project that libtorch's test configures against the installed package (the test's folder)
CONSUMER_PROJECT = "cmake_test/CMakeLists.txt"


def rattler_build_string(output: Output) -> str:
    """An output's build string in recipe.yaml: the planned one, with rattler-build filling in the variant's
    Python where conda-build puts CONDA_PY."""
    return output.build_string_with("${{ python | version_to_buildstring }}")


def libtorch_checks(recipe: CondaForgeRecipe) -> tuple[str, ...]:
    """The libtorch package's own test: its libraries, its CMake config and (CUDA) the activation variable."""
    if recipe.platform == WINDOWS:
        return windows_libtorch_checks(recipe)
    libs = ["c10", "shm", "torch", "torch_cpu", "torch_global_deps"]
    if recipe.cuda:
        libs += ["torch_cuda_linalg", "c10_cuda", "caffe2_nvrtc", "torch_cuda"]
    checks = [f'test -f "$PREFIX/lib/lib{lib}.so"' for lib in libs]
    checks.append('test -f "$PREFIX/share/cmake/Torch/TorchConfig.cmake"')
    checks.append('test ! -e "$PREFIX/lib/libtorch_python.so"')
    if recipe.cuda:
        variable = recipe.activation_variable
        checks.append(f'. "$PREFIX/etc/conda/activate.d/libtorch-torchforge_activate.sh" && test "${variable}" = "{recipe.arch_list}"')
    return tuple(checks)


def windows_libtorch_checks(recipe: CondaForgeRecipe) -> tuple[str, ...]:
    """libtorch's test on Windows (cmd.exe lines): DLLs in Library\\bin, import libraries in Library\\lib (none for
    torch_global_deps, which exports nothing), the CMake config, no torch_python, and (CUDA) the activation."""
    libs = ["c10", "shm", "torch", "torch_cpu", "torch_global_deps"]
    if recipe.cuda:
        libs += ["c10_cuda", "caffe2_nvrtc", "torch_cuda"]  # torch_cuda_linalg is linked into torch_cuda there
    checks = [f"if not exist %LIBRARY_BIN%\\{lib}.dll exit 1" for lib in libs]
    checks += [f"if not exist %LIBRARY_LIB%\\{lib}.lib exit 1" for lib in libs if lib != "torch_global_deps"]
    checks.append("if not exist %LIBRARY_PREFIX%\\share\\cmake\\Torch\\TorchConfig.cmake exit 1")
    checks.append("if exist %LIBRARY_BIN%\\torch_python.dll exit 1")
    if recipe.cuda:
        variable = recipe.activation_variable
        checks.append("call %PREFIX%\\etc\\conda\\activate.d\\libtorch-torchforge_activate.bat")
        checks.append(f'if not "%{variable}%" == "{recipe.arch_list}" exit 1')
    return tuple(checks)


def recipe_files(recipe: CondaForgeRecipe, source: Source, *, feedstock_patches: bool = False,
                 recipe_format: RecipeFormat = RecipeFormat.CONDA_BUILD) -> dict[str, str]:
    """{file name: text} of the recipe folder: conda-build's meta.yaml and conda_build_config.yaml, or
    rattler-build's recipe.yaml and variants.yaml (the same outputs, requirements, build strings and variant
    keys), and the scripts both name. With `feedstock_patches`, the engine downloads the feedstock's patches of
    this job (pinned commit, sha256) and build.sh applies them before building."""
    libtorch, *others = recipe.outputs
    fields = {
        "header": header(recipe), "commit": recipe.feedstock_commit, "warnings": recipe.warnings_for(feedstock_patches),
        "version": recipe.version, "source": source, "build_number": recipe.build_number, "cuda": recipe.cuda,
        "libtorch": libtorch, "others": others, "libtorch_checks": libtorch_checks(recipe),
        "metapackage": others[-1].name, "settings": recipe.settings, "conda_build_spec": conda_build_spec,
        "variant_config": recipe.variant_config, "env": recipe.env, "cuda_target": PLATFORMS[recipe.platform],
        "variable": recipe.activation_variable, "arch_list": recipe.arch_list,
        "libtorch_python": recipe.libtorch_python, "compiler_flags": load().compiler_flags,
        "emptied": load().source_edits.empty, "dropped": load().source_edits.dropped(recipe.version),
        "cmake": load().cmake, "consumer_test": ((), ()) if recipe.platform == WINDOWS
        else load().consumer_test.for_release(recipe.version, bool(recipe.cuda)),
        "cmake_arguments": load().cmake.passes_arguments(recipe.version, recipe.feedstock_patches if feedstock_patches else ()),
        "feedstock_patches": recipe.feedstock_patches if feedstock_patches else (),
        "patch_folder": PATCH_FOLDER, "rattler_build_spec": rattler_build_spec,
        "rattler_build_string": rattler_build_string,
        **_platform_fields(recipe, bool(source.patches) or (feedstock_patches and bool(recipe.feedstock_patches))),
    }
    windows = recipe.platform == WINDOWS
    rattler = recipe_format == RecipeFormat.RATTLER_BUILD
    if windows and rattler:
        raise UsageError("--flavour conda-forge renders win-64 recipes for conda-build only",
                         "leave out --format rattler-build (or --engine rattler-build) for --platform win-64")
    recipe_file, variant_file = ("recipe.yaml", "variants.yaml") if rattler else ("meta.yaml", "conda_build_config.yaml")
    script, activation = ("bld.bat", ("activate.bat", "deactivate.bat")) if windows \
        else ("build.sh", ("activate.sh", "deactivate.sh"))
    files = {recipe_file: render_template(f"conda_forge/{recipe_file}.j2", **fields),
             # one variant file for both engines: the same keys, no selectors
             variant_file: render_template("conda_forge/conda_build_config.yaml.j2", **fields)}
    names = [script, *(activation if recipe.cuda else ()), *(("retarget_cmake_cache.py",) if windows else ())]
    files.update({name: render_template(f"conda_forge/{name}.j2", **fields) for name in names})
    if not windows:
        files[CONSUMER_PROJECT] = render_template(f"conda_forge/{CONSUMER_PROJECT}.j2", **fields)
    return files


def _platform_fields(recipe: CondaForgeRecipe, patched: bool) -> dict[str, object]:
    """What meta.yaml says differently on Windows: its script and (where patches are applied: the user's or the
    feedstock's) conda-forge's MSYS2 `patch`, which Windows lacks."""
    if recipe.platform != WINDOWS:
        return {"script": "build.sh", "extra_build": (), "script_env": (JOBS_VARIABLE, *BUILD_VARIABLES)}
    return {"script": "bld.bat", "extra_build": ("m2-patch",) if patched else (), "script_env": (JOBS_VARIABLE,)}


def plan_selection(pytorch: str | None, cuda: str | None, python: str | None, platform: str | None,
                   arch_list: str | None, build_number: int) -> tuple[CondaForgeRecipe, ...]:
    """Every recipe of a command line: one per CUDA (and cpu); default the newest release and all the feedstock's
    CUDAs plus cpu; Pythons default to the feedstock's."""
    table = load()
    version = pytorch or max(table.releases, key=versions.parse)
    release = table.releases.get(version)
    if release is None:
        raise UsageError(f"--flavour conda-forge has no facts for PyTorch {version}",
                         f"pick one of {', '.join(table.releases)}, or use --flavour official")
    platform = platform or "linux-64"
    jobs = release.platforms.get(platform)  # an unknown subdir: plan() says which ones the flavour renders
    accels = split_list(cuda) or [*(jobs.cuda if jobs else ()), "cpu"]  # checked: sharedflags.check_shared_flags
    if arch_list is not None and len([a for a in accels if a != "cpu"]) > 1:
        raise UsageError("--arch-list with several CUDA versions is ambiguous", "render one CUDA per --arch-list")
    pythons = tuple(split_list(python)) or None
    return tuple(plan(version, platform, accel, arch_list if accel != "cpu" else None, pythons, build_number)
                 for accel in accels)
