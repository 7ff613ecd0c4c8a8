"""Turn a resolved variant into the typed context the templates lay out. Pure: no files, no commands.

conda-build (meta.yaml) and rattler-build (recipe.yaml) share this context: every value is resolved for
exactly one variant, so the two formats differ only in syntax and neither needs selectors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchforge import __version__
from torchforge import data as tables
from torchforge import versions
from torchforge.datamodels import Data, PlatformFacts, Release, Requirement, Runtime, SourceEdit
from torchforge.sourcestate import Source, resolve_source
from torchforge.flavours.official.bundled import BundledFile, bundle_rule, bundled_files, windows_magma, windows_mkl
from torchforge.flavours.official.resolved import AppliedFix, MagmaPlan, Variant

# conda-build and rattler-build set these for every build script; they are not read from the outside.
BUILD_TOOL_VARIABLES = frozenset(
    {"PREFIX", "SP_DIR", "PYTHON", "PKG_VERSION", "PKG_BUILDNUM", "PKG_NAME", "RECIPE_DIR", "SRC_DIR",
     "CPU_COUNT", "LIBRARY_PREFIX", "BUILD_PREFIX"}
)


# The version of a spec's first constraint: `==2.0.1`, `>=1.19`, `1.21.5.*` and `2.0.0rc1.*` give 2.0.1, 1.19,
# 1.21.5 and 2.0.0rc1.
_SPEC_VERSION = re.compile(r"^[=<>!~]*([0-9][0-9A-Za-z.+_]*?)(?:\.?\*)?(?:,|$)")

# The official magma-cudaXYZ holds lib/libmagma.a and include/*.h only: no shared library, no magma_sparse, no
# pkgconfig, no testers (official-builds.md §2.1-2.2).
MAGMA_PACKAGE_CHECKS = (
    'test ! -e "$PREFIX/lib/libmagma.so"',
    'test ! -e "$PREFIX/lib/libmagma_sparse.a" && test ! -e "$PREFIX/lib/libmagma_sparse.so"',
    'test ! -e "$PREFIX/lib/pkgconfig/magma.pc"',
    'test ! -e "$PREFIX/bin"',
)


@dataclass(frozen=True)
class RecipeContext:
    kind: str  # "pytorch" or "magma"
    variant_id: str
    status: str
    header: str
    name: str
    version: str
    build_number: int
    build_string: str
    platform: str
    python: str | None
    source: Source
    script_env: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    literal_env: frozenset[str] = frozenset()  # names whose value is the user's --env: quoted literally
    build_requirements: tuple[str, ...] = ()
    host_requirements: tuple[str, ...] = ()
    run_requirements: tuple[str, ...] = ()
    run_constrained: tuple[str, ...] = ()
    ignore_run_exports: tuple[str, ...] = ()  # host packages whose run_exports the official package did not have
    features: tuple[str, ...] = ()
    test_imports: tuple[str, ...] = ()
    install_command: str = ""
    rpath_rules: tuple[tuple[str, str], ...] = ()
    source_edits: tuple[SourceEdit, ...] = ()
    cmake_options: tuple[str, ...] = ()
    gencode: tuple[str, ...] = ()
    cuda: str | None = None
    summary: str = ""
    license: str = "BSD-3-Clause"
    home: str = ""
    warnings: tuple[str, ...] = ()
    fixes: tuple[tuple[str, str], ...] = ()
    manual_patches: tuple[str, ...] = ()
    bundle_files: tuple[BundledFile, ...] = ()
    bundle_dirs: tuple[tuple[str, str], ...] = ()  # (variable, default) of every directory bundled from
    bundle_keep_names: tuple[str, ...] = ()  # shell `case` patterns of names not hash-renamed
    bundle_source: str = ""
    cudnn_library: str = ""  # a bundled cuDNN front-end library to ask for its version, and the answer expected
    cudnn_version_code: int = 0
    magma_win_version: str = ""
    magma_win_url: str = ""
    mkl_win_version: str = ""  # the static MKL archive of upstream's bld.bat (Windows, up to 2.2)
    mkl_win_url: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    package_checks: tuple[str, ...] = ()  # shell tests of the built package's contents

    @property
    def numpy_variant(self) -> str | None:
        """conda_build_config.yaml's `numpy`: the version of the host numpy spec (`numpy ==2.0.1` -> 2.0.1).

        conda-build reads this variant key whenever host needs numpy and warns when it is missing; the explicit
        host spec still decides what is installed. An unpinned numpy has no version to give.
        """
        for spec in self.host_requirements:
            fields = spec.split()
            if fields[0] == "numpy" and len(fields) > 1:
                found = _SPEC_VERSION.match(fields[1])
                if found:
                    return found.group(1)
        return None

    @property
    def is_windows(self) -> bool:
        return tables.load().platform(self.platform).windows

    @property
    def has_source_edits(self) -> bool:
        return bool(self.source_edits)


def _applies(requirement: Requirement, python: str, platform: str, is_cuda: bool, pytorch: str | None = None) -> bool:
    if requirement.python and not versions.matches(python, requirement.python):
        return False
    if requirement.pytorch and (pytorch is None or not versions.matches(pytorch, requirement.pytorch)):
        return False
    if requirement.platforms is not None and platform not in requirement.platforms:
        return False
    if requirement.accel is not None and (requirement.accel == "cuda") != is_cuda:
        return False
    return True


def _select(requirements: tuple[Requirement, ...], python: str, platform: str, is_cuda: bool,
            pytorch: str | None = None) -> list[str]:
    return [r.spec for r in requirements if _applies(r, python, platform, is_cuda, pytorch)]


def _ignored_run_exports(requirements: tuple[Requirement, ...], python: str, platform: str, is_cuda: bool,
                         pytorch: str) -> tuple[str, ...]:
    return tuple(r.spec.split()[0] for r in requirements
                 if r.ignore_run_exports and _applies(r, python, platform, is_cuda, pytorch))


def pytorch_context(variant: Variant, patches: tuple[str, ...] = ()) -> RecipeContext:
    data: Data = tables.load()
    request = variant.request
    assert variant.release_key is not None and variant.build_string is not None
    release = data.pytorch.releases[variant.release_key]
    era = data.eras.eras[release.era]
    runtime = data.eras.runtime
    platform, python, cuda = request.platform, request.python, (request.accel if request.is_cuda else None)
    is_cuda = cuda is not None
    build = _select(era.build, python, platform, is_cuda, request.pytorch)
    host = _select(era.host, python, platform, is_cuda, request.pytorch)
    run = _select(era.run, python, platform, is_cuda, request.pytorch)
    warnings = list(variant.warnings)
    if not any(spec.split()[0] == "numpy" for spec in host):
        host.insert(1, "numpy")
        warnings.append(f"the official recipes give no numpy pin for Python {python}: numpy is left unpinned")
    host[0] = f"python {python}.*"
    run[0] = f"python {python}.*"
    if variant.magma is not None:
        host.append(variant.magma.host_spec)
    if cuda is not None:
        run += _cuda_run_requirements(data, variant, release, cuda, warnings)
    facts = data.platform(platform)
    mutex, run_constrained, features = _selector(release, facts, runtime, is_cuda)
    run += mutex
    env_names = {name for name, _ in variant.env}
    edits = _edits(variant.fixes)
    bundle = _bundle(data, variant, cuda)
    magma_win = windows_magma(data, request, cuda)
    mkl_win = windows_mkl(data, request)
    tag = f"v{request.pytorch}"
    source = resolve_source(request.options.source, data.pytorch.defaults.source_url, tag)
    return RecipeContext(
        kind="pytorch",
        variant_id=variant.id,
        status=variant.status.value,
        header=f"Rendered by torchforge {__version__} for {variant.id} ({variant.status.value}). Re-render instead of editing.",
        name="pytorch",
        version=request.pytorch,
        build_number=request.options.build_number,
        build_string=variant.build_string,
        platform=platform,
        python=python,
        source=Source(source.kind, source.location, source.rev, patches=patches),
        script_env=tuple(n for n in data.eras.script_env.names if n not in env_names or _reads_itself(variant, n)),
        env=variant.env,
        literal_env=frozenset(name for name, _ in request.options.extra_env),
        build_requirements=tuple(build),
        host_requirements=tuple(host),
        run_requirements=tuple(run),
        run_constrained=tuple(run_constrained),
        ignore_run_exports=_ignored_run_exports(era.host, python, platform, is_cuda, request.pytorch),
        features=tuple(features),
        test_imports=("torch",),
        install_command=_install_command(data, facts, release),
        rpath_rules=tuple((rule.dir, rule.rpath) for rule in data.eras.rpath) if facts.rpath else (),
        source_edits=edits,
        cuda=cuda,
        summary="PyTorch: tensors and dynamic neural networks in Python with strong GPU acceleration",
        home="https://pytorch.org/",
        warnings=tuple(warnings),
        fixes=_fix_notes(variant.fixes),
        **bundle,
        magma_win_version=magma_win.version if magma_win else "",
        magma_win_url=magma_win.url.format(version=magma_win.version, cuda_nodot=versions.nodot(cuda or ""))
        if magma_win else "",
        mkl_win_version=mkl_win.version if mkl_win else "",
        mkl_win_url=mkl_win.url.format(version=mkl_win.version) if mkl_win else "",
        extra={
            "torchforge_variant": variant.id,
            "torchforge_status": variant.status.value,
            # Every option that changed the binary; the reuse check compares it with the planned settings.
            "torchforge_settings": variant.settings,
            **({"cuda": cuda, "cudnn": variant.cudnn or "", "arch_list": variant.arch_list or ""} if cuda else {}),
        },
    )


def _cuda_run_requirements(data: Data, variant: Variant, release: Release, cuda: str,
                           warnings: list[str]) -> list[str]:
    """A CUDA build's run requirements on its CUDA runtime (the release's way: pytorch-cuda, cudatoolkit, or
    cuda-version and the split packages; none on a Jetson) and on triton where the release ships it there."""
    request, runtime = variant.request, data.eras.runtime
    toolkit = data.cuda.toolkits[cuda]
    cuda_build = release.cuda.get(cuda)
    upper = (cuda_build.runtime_upper if cuda_build else None) or toolkit.runtime_upper
    run: list[str] = []
    if variant.jetson is not None:
        warnings.append("the CUDA runtime comes from JetPack on the device: no conda CUDA runtime dependency")
    elif release.cuda_runtime == "pytorch-cuda" and cuda in runtime.pytorch_cuda_versions:
        run.append(f"pytorch-cuda >={cuda},<{upper}")
    elif release.cuda_runtime == "cudatoolkit":
        run.append(f"cudatoolkit >={cuda},<{upper}")
    else:
        run.append(f"cuda-version >={cuda},<{upper}")
        run.extend(runtime.split_packages)
    triton = release.triton_by_patch.get(request.pytorch, release.triton)
    on_platform = (not data.platform(request.platform).windows if release.triton_subdirs is None
                   else request.platform in release.triton_subdirs)
    if triton and on_platform and (
            release.triton_python is None or versions.matches(request.python, release.triton_python)):
        # an exact version, or a range where the wheel's pin is one (2.14: triton~=3.8.0)
        run.append(f"{release.triton_package} {triton}" if triton[0] in "<>=!~" else
                   f"{release.triton_package} =={triton}")
    return run


def _install_command(data: Data, facts: PlatformFacts, release: Release) -> str:
    """setup.py install for the releases the official channel built that way, pip for the others."""
    install = data.eras.install
    if facts.windows:
        return install.setup_py_win if release.conda_official else install.pip_win
    return install.setup_py if release.conda_official else install.pip


def _selector(release: Release, facts: PlatformFacts, runtime: Runtime,
              is_cuda: bool) -> tuple[list[str], list[str], list[str]]:
    """(run requirements, run constraints, features) that select CPU or CUDA: the mutex package and cpuonly's
    constraint, or the cpuonly feature of the releases before the mutex."""
    run: list[str] = []
    run_constrained: list[str] = []
    features: list[str] = []
    if release.selector == "mutex":
        # macOS: no mutex, but CPU builds still constrain cpuonly (release/1.13 meta.yaml:47-55).
        if facts.mutex:
            run.append(f"pytorch-mutex =={runtime.mutex_version} {'cuda' if is_cuda else 'cpu'}")
        if facts.mutex or not is_cuda:
            run_constrained.append("cpuonly <0" if is_cuda else "cpuonly")
    elif not is_cuda and facts.mutex:
        features.append("cpuonly")
    return run, run_constrained, features


def _bundle(data: Data, variant: Variant, cuda: str | None) -> dict[str, Any]:
    """The bundling step's context: the files to copy (with their directory variables), the names kept."""
    cuda = None if variant.jetson else cuda  # JetPack provides cuDNN and CUPTI on the device
    rule = bundle_rule(data, variant.request, cuda)
    if rule is None:
        return {}
    files = bundled_files(data, variant.request, cuda)
    check: dict[str, Any] = {}
    cudnn = variant.cudnn
    windows = data.platform(variant.request.platform).windows
    if not windows and cudnn and any(f.name.startswith("libcudnn") for f in files):
        major, minor, patch = (int(part) for part in cudnn.split(".")[:3])
        multipliers = data.bundle.cudnn_version_code.get(str(major))
        if multipliers:
            check = {"cudnn_library": f"libcudnn.so.{major}",
                     "cudnn_version_code": major * multipliers[0] + minor * multipliers[1] + patch * multipliers[2]}
    return {
        **check,
        "bundle_files": files,
        "bundle_dirs": tuple(dict.fromkeys((f.dir_var, f.dir_default) for f in files)),
        "bundle_keep_names": data.bundle.hash_exempt,
        "bundle_source": rule.source,
    }


def _reads_itself(variant: Variant, name: str) -> bool:
    """An exported value like ${MAX_JOBS:-$CPU_COUNT} still reads the outside variable."""
    return any(n == name and f"${{{name}:-" in value for n, value in variant.env)


def _fix_notes(fixes: tuple[AppliedFix, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((applied.key, applied.fix.reason) for applied in fixes)


def _magma_source(plan: MagmaPlan, patches: tuple[str, ...]) -> Source:
    """The release tarball with its checksum; a mirror URL keeps that checksum, a local tarball pins its own,
    a local tree has none."""
    source = plan.source
    if source is None:
        return Source("url", plan.url, sha256=plan.sha256, patches=patches)
    if source.kind == "tree":
        return Source("path", source.location, patches=patches)
    if source.kind == "tarball":
        return Source("url", Path(source.location).as_uri(), sha256=source.sha256, patches=patches)
    return Source("url", source.location, sha256=plan.sha256, patches=patches)


def _edits(fixes: tuple[AppliedFix, ...]) -> tuple[SourceEdit, ...]:
    """Every fix's edits, each labelled with its fix so a failing edit names it."""
    return tuple(edit.model_copy(update={"fix": applied.key}) for applied in fixes for edit in applied.fix.edits)


def magma_context(plan: MagmaPlan, patches: tuple[str, ...] = ()) -> RecipeContext:
    return RecipeContext(
        kind="magma",
        variant_id=plan.id,
        status=plan.status.value,
        header=f"Rendered by torchforge {__version__} for {plan.id}. Re-render instead of editing.",
        name=plan.name,
        version=plan.version,
        build_number=plan.build_number,
        build_string=plan.build_string,
        platform="linux-64",
        python=None,
        source=_magma_source(plan, patches),
        script_env=tables.load().eras.script_env.magma_names,
        env=(
            ("CUDA_HOME", "${CUDA_HOME:-/usr/local/cuda}"),
            ("MAX_JOBS", "${MAX_JOBS:-$CPU_COUNT}"),
            ("DESIRED_CUDA", plan.cuda),
            ("CUDA_ARCH_LIST", plan.gencode_flags),
        ),
        source_edits=_edits(plan.fixes),
        cmake_options=plan.cmake_options,
        gencode=plan.gencode,
        cuda=plan.cuda,
        summary="Matrix Algebra on GPU and Multicore Architectures, static library for PyTorch builds",
        home="https://icl.utk.edu/magma/",
        warnings=plan.warnings,
        fixes=_fix_notes(plan.fixes),
        manual_patches=tuple(p for applied in plan.fixes for p in applied.fix.manual_patch),
        package_checks=MAGMA_PACKAGE_CHECKS,
        extra={
            "torchforge_variant": plan.id,
            "sha256": plan.sha256,
            "torchforge_settings": plan.settings,
            "gencode": " ".join([*(f"sm_{g}" for g in plan.gencode), *(f"compute_{g}" for g in plan.ptx)]),
            "upstream_patches": " ".join(plan.upstream_patches),
            "source_edits": " ".join(applied.key for applied in plan.fixes if applied.fix.edits),
        },
    )
