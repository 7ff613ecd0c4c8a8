"""The files an official pytorch package bundles from the build machine (cuDNN, NCCL ... by platform and CUDA)
and the build environment a variant's recipe sets (data/build_env entries, the Windows MAGMA and MKL).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchforge import data as tables
from torchforge import platforms, versions
from torchforge.datamodels import BuildEnvEntry, BundleRule, Data, JetPack, JetsonDevice, Release, WindowsArchive
from torchforge.flavours.official.variant import Request
from torchforge.versions import minor
from torchforge.flavours.official.resolved import (
    AppliedFix, Variant)


def bundle_rule(data: Data, request: Request, cuda: str | None) -> BundleRule | None:
    """The libraries upstream's recipe copied into torch/lib for this CUDA variant (bundle.toml), if any.

    Callers pass cuda=None for Jetson builds: they take cuDNN and CUPTI from JetPack on the device.
    """
    facts = platforms.get(request.platform).facts
    if cuda is None or facts.family not in ("linux", "win"):
        return None
    rules = data.bundle.win if facts.windows else data.bundle.linux
    for rule in rules:
        if versions.matches(request.pytorch, rule.pytorch) and versions.matches(cuda, rule.cuda):
            return rule
    return None


@dataclass(frozen=True)
class BundledFile:
    """One library (or glob) the build script copies into torch/lib: `dir_var` overrides `dir_default`."""

    dir_var: str
    dir_default: str  # in the platform's shell syntax ($CUDA_HOME/lib64, %CUDA_PATH%\bin)
    name: str
    optional: bool = False


def bundled_files(data: Data, request: Request, cuda: str | None) -> tuple[BundledFile, ...]:
    """The files the variant's bundling step copies, names with {cuda}/{cuda_major} filled in."""
    rule = bundle_rule(data, request, cuda)
    if rule is None or cuda is None:
        return ()
    dirs = data.bundle.win_dirs if platforms.get(request.platform).facts.windows else data.bundle.linux_dirs
    return tuple(
        BundledFile(dirs[lib.dir].var, dirs[lib.dir].default,
                    lib.name.format(cuda=cuda, cuda_major=cuda.split(".")[0]), lib.optional)
        for lib in rule.libs
    )


def bundled_cudnn(variant: Variant, data: Data | None = None) -> str:
    """The cuDNN (full version, the build string's) a Linux CUDA variant copies into torch/lib; "" when it
    bundles none (cpu, Jetson, Windows, or a statically linked cuDNN)."""
    data = data or tables.load()
    request = variant.request
    if not request.is_cuda or variant.jetson or not variant.cudnn or data.platform(request.platform).family != "linux":
        return ""
    files = bundled_files(data, request, request.accel)
    return variant.cudnn if any(f.dir_var == data.bundle.linux_dirs["cudnn"].var for f in files) else ""


def _env_entry_applies(entry: BuildEnvEntry, request: Request, cuda: str | None) -> bool:
    # `when` "linux"/"osx" is the platform's business (platforms.Platform.env_value)
    if entry.when == "cuda" and cuda is None or entry.when == "cpu" and cuda is not None:
        return False
    if entry.pytorch and not versions.matches(request.pytorch, entry.pytorch):
        return False
    if entry.cuda and (cuda is None or not versions.matches(cuda, entry.cuda)):
        return False
    return not (entry.python and not versions.matches(request.python, entry.python))


def windows_magma(data: Data, request: Request, cuda: str | None) -> WindowsArchive | None:
    """The prebuilt MAGMA archive upstream's bld.bat linked, for a Windows CUDA variant of its releases."""
    if cuda is None or not platforms.get(request.platform).facts.windows:
        return None
    return next((m for m in data.eras.windows_magma if versions.matches(request.pytorch, m.pytorch)), None)


def windows_mkl(data: Data, request: Request) -> WindowsArchive | None:
    """The static MKL archive upstream's bld.bat put first on the include and library paths (up to 2.2)."""
    if not platforms.get(request.platform).facts.windows:
        return None
    return next((m for m in data.eras.windows_mkl if versions.matches(request.pytorch, m.pytorch)), None)


def build_env(data: Data, request: Request, release: Release, cuda: str | None, cudnn: str | None,
               arch_list: str | None,
               jetson: tuple[str, JetsonDevice, JetPack] | None,
               fixes: tuple[AppliedFix, ...]) -> tuple[tuple[str, str], ...]:
    """The exports of build.sh, in order; later entries override earlier ones with the same name."""
    here = platforms.get(request.platform)
    facts = here.facts
    env: dict[str, str] = {}
    for entry in data.eras.build_env:
        if not _env_entry_applies(entry, request, cuda):
            continue
        value = here.env_value(entry)
        if value is not None:
            env[entry.name] = value
    if facts.family == "linux":
        # also where upstream's compiler chose the old ABI itself (1.9-1.11: pytorch.toml, cxx11_abi)
        env["_GLIBCXX_USE_CXX11_ABI"] = "1" if release.cxx11_abi else "0"
    if cuda:
        assert arch_list is not None
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
        # A bundled cuDNN is linked dynamically; otherwise the release's default, except that cuDNN >= 8.3
        # ships no single static archive (official-builds §1.7).
        rule = bundle_rule(data, request, None if jetson else cuda)
        bundles_cudnn = rule is not None and any(lib.dir == "cudnn" for lib in rule.libs)
        static = (release.static_cudnn and not bundles_cudnn and cudnn is not None
                  and versions.parse(cudnn) < versions.parse("8.3"))
        env["USE_STATIC_CUDNN"] = "1" if static else "0"
        if release.cusparselt and facts.family == "linux":
            # upstream's bld.bat never set it (release/2.5:conda/pytorch-nightly/bld.bat)
            env["USE_CUSPARSELT"] = "1"
        if jetson or (not facts.magma and windows_magma(data, request, cuda) is None):
            env["USE_MAGMA"] = "0"
    if jetson:
        _, _, jetpack = jetson
        if not jetpack.nccl:
            env.update({"USE_NCCL": "0", "USE_SYSTEM_NCCL": "0", "USE_DISTRIBUTED": "0"})
            env.pop("USE_STATIC_NCCL", None)
            env.pop("NCCL_ROOT_DIR", None)
        for name, value in data.jetson.build_env.items():
            env[name] = f"${{{name}:-{value}}}"
    if request.options.debug:
        env["DEBUG"] = "1"
    for applied in fixes:
        env.update(applied.fix.env)
    env.update(dict(request.options.extra_env))
    return tuple(env.items())


def cuda_unknown(data: Data, version: str, accels: tuple[str, ...]) -> list[str]:
    """The requested CUDA versions whose upstream builds of `version` torchforge's data may miss."""
    release = data.pytorch.releases[minor(version)]
    return [a for a in accels if release.cuda_incomplete and a != "cpu" and a not in release.cuda]
