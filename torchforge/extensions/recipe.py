"""An extension's recipe, for one exact pytorch build: one more PlannedRecipe producer.

host: python, the sdist's build requirements in conda names, and `pytorch ==VERSION BUILD` (the output channel's
package, exactly); run: the same pytorch build and the sdist's run requirements. The build string names what the
package was built for: `pt<release>_<cpu|cuXYZ>_<digest>_py<XY>_<number>`, the digest over that pytorch's build
string and the arch list, so two pytorch builds (or two arch lists) never share an extension package.
The build compiles with the build machine's compilers and, for CUDA, the toolkit at $CUDA_HOME (the one the
pytorch builds use), which must be the pytorch's CUDA release. It never reaches the network: its pip (and so the
setup.py) runs in a network namespace with no interface up and a filesystem read-only but for the build's own
folders (torchforge/isolation.py); the package's own switches (data/extensions.toml) turn off downloads of
prebuilt binaries, pip runs with --no-index, and every proxy variable names an address that does not exist, so a
download attempt fails at once and names it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torchforge.compilecache import ARCH_LIST_VARIABLE, BUILD_VARIABLES, KEEP_GENCODE_VARIABLE, group_key, settings_material
from torchforge.errors import UsageError
from torchforge.extensions.metadata import SdistMetadata, switches, to_conda
from torchforge.fileops import sha256_file
from torchforge.flavours.base import PlannedRecipe, PytorchBuild
from torchforge.isolation import UNSHARE, child_script, required
from torchforge.templates import render_template

PYTORCH = "pytorch"
KIND = "extension"  # PlannedRecipe.kind of an extension's recipe
# Every proxy variable urllib, pip, git and curl read points here: an address that cannot resolve (.invalid,
# RFC 2606), so a download attempt fails at once and the log names why.
NO_NETWORK_PROXY = "http://no-network-at-build-time.invalid:9"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
FORMATS = {"conda-build": "meta.yaml", "rattler-build": "recipe.yaml"}
NINJA = "ninja"
ISOLATION_SCRIPT = "isolation_child.py"  # the recipe's copy of torchforge/isolation_child.py


Pairs = tuple[tuple[str, str], ...]  # an extension's own build variables (KEY, VALUE), sorted


def build_string(pytorch: PytorchBuild, arch_list: str, number: int, variables: Pairs = ()) -> str:
    """`variables` join the digest only where there are some: a package built without any keeps its string."""
    material = [pytorch.build, arch_list, *([list(map(list, variables))] if variables else [])]
    digest = hashlib.sha256(json.dumps(material).encode()).hexdigest()[:8]
    return f"pt{pytorch.version}_{pytorch.accel}_{digest}_py{pytorch.python.replace('.', '')}_{number}"


def stem_of(name: str, version: str, pytorch: PytorchBuild, arch_list: str, number: int = 0,
            variables: Pairs = ()) -> str:
    """The planned package: name-version-build (the name in conda's form)."""
    return f"{name}-{version}-{build_string(pytorch, arch_list, number, variables)}"


def settings_of(name: str, version: str, sdist: str, pytorch: PytorchBuild, arch_list: str,
                variables: Pairs = ()) -> str:
    """What the package records and the reuse check compares: `sdist` is the SPEC `NAME==VERSION` for an index (a
    package index keeps one file per name and version) or `sha256:HEX` of a local, folder or git archive; the
    package's own build variables where it has some."""
    return json.dumps({"extension": name, "version": version, "sdist": sdist,
                       "pytorch": f"{pytorch.version} {pytorch.build}", "arch_list": arch_list,
                       **({"variables": dict(variables)} if variables else {})}, sort_keys=True)


@dataclass(frozen=True)
class ExtensionInputs:
    archive: Path
    metadata: SdistMetadata
    pytorch: PytorchBuild
    arch_list: str  # TORCH_CUDA_ARCH_LIST's form; "" for CPU
    channels: tuple[str, ...]
    number: int = 0
    sdist: str = ""  # the source's identity in the settings (settings_of); "": the archive's sha256
    variables: Pairs = ()  # the package's own build variables (torchforge/extensions/variables.py)

    @property
    def stem(self) -> str:
        return stem_of(self.metadata.conda_name, self.metadata.version, self.pytorch, self.arch_list, self.number,
                       self.variables)

    @property
    def build(self) -> str:
        return build_string(self.pytorch, self.arch_list, self.number, self.variables)

    def pytorch_pin(self, recipe_format: str) -> str:
        """`pytorch ==VERSION BUILD`. rattler-build's strict match specs refuse a dot in a build string (the pytorch
        channel's `py3.11_cpu_0`, a repacked wheel's `whl_py3.11_cpu_0`): there each run of other characters is
        a `*`, which matches that build and no build of another Python, CUDA or number."""
        build = self.pytorch.build
        if recipe_format == "rattler-build":
            build = re.sub(r"[^A-Za-z0-9_*]+", "*", build)
        return f"{PYTORCH} =={self.pytorch.version} {build}"

    def requirements(self, recipe_format: str) -> dict[str, tuple[str, ...]]:
        python = self.pytorch.python
        exact = self.pytorch_pin(recipe_format)
        # CUDA: torch's cpp_extension runs nvcc through $PYTORCH_NVCC (the compile cache's route and its arch
        # filter) only under ninja; without ninja it falls back to $CUDA_HOME/bin/nvcc, past both.
        ninja = (NINJA,) if self.pytorch.cuda else ()
        host = (f"python {python}.*", *to_conda(self.metadata.build_requires, python, drop=False), *ninja, "pip",
                exact)
        runtime = (self.pytorch.cuda_runtime,) if self.pytorch.cuda and self.pytorch.cuda_runtime else ()
        run = (f"python {python}.*", exact, *runtime, *to_conda(self.metadata.requires, python, drop=True))
        return {"host": tuple(dict.fromkeys(host)), "run": run}

    def env(self) -> dict[str, str]:
        """The build's own variables: the team's for this package (first: torchforge's own cannot be overridden),
        the package's switches (its CUDA ones for a CUDA pytorch), the arch list, no network."""
        arch = {ARCH_LIST_VARIABLE: self.arch_list, "TORCH_CUDA_ARCH_LIST": self.arch_list} if self.arch_list else {}
        own = switches(self.metadata.name)
        return {**dict(self.variables), **dict(own.build_env), **(dict(own.cuda_env) if self.pytorch.cuda else {}),
                **arch,
                **dict.fromkeys(PROXY_VARIABLES, NO_NETWORK_PROXY), "PIP_NO_INDEX": "1"}


def build_script(inputs: ExtensionInputs, isolate: bool = True) -> str:
    """The build script; `isolate`: its pip runs with no network and no writes outside the build's folders."""
    return render_template("extension/build.sh.j2", exports=sorted(inputs.env().items()), cuda=inputs.pytorch.cuda,
                           pytorch_build=inputs.pytorch.build, isolate=isolate, unshare=shlex.join(UNSHARE),
                           isolation_script=ISOLATION_SCRIPT)


def _settings(inputs: ExtensionInputs) -> str:
    return settings_of(inputs.metadata.conda_name, inputs.metadata.version,
                       inputs.sdist or f"sha256:{sha256_file(inputs.archive)}", inputs.pytorch, inputs.arch_list,
                       inputs.variables)


def recipe_text(inputs: ExtensionInputs, recipe_format: str, script_env: tuple[str, ...]) -> str:
    """meta.yaml (conda-build) or recipe.yaml (rattler-build) of the extension, from its template."""
    meta, reqs = inputs.metadata, inputs.requirements(recipe_format)
    return render_template(f"extension/{FORMATS[recipe_format]}.j2", name=meta.conda_name, version=meta.version,
                           url=inputs.archive.resolve().as_uri(), sha256=sha256_file(inputs.archive),
                           number=inputs.number, build=inputs.build, script_env=script_env, host=reqs["host"],
                           run=reqs["run"], settings=_settings(inputs),
                           summary=f"{meta.name} {meta.version} from its sdist, for pytorch {inputs.pytorch.build}")


def extension_recipe(inputs: ExtensionInputs, recipe_format: str) -> PlannedRecipe:
    """The PlannedRecipe of one extension for one pytorch build, in the engine's format ("conda-build" or
    "rattler-build")."""
    if recipe_format not in FORMATS:
        raise UsageError(f"no extension recipe for the engine format {recipe_format!r}", f"use one of {sorted(FORMATS)}")
    text = recipe_text(inputs, recipe_format, (*_own_env(inputs.pytorch), *BUILD_VARIABLES))
    isolate = required(f"{inputs.archive.name}'s setup.py (the engine's build)")
    files: Mapping[str, str | bytes] = {FORMATS[recipe_format]: text, "build.sh": build_script(inputs, isolate),
                                        **({ISOLATION_SCRIPT: child_script()} if isolate else {})}
    return planned_recipe(inputs.stem, _settings(inputs), inputs.pytorch, inputs.arch_list, inputs.channels, files)


def _own_env(pytorch: PytorchBuild) -> tuple[str, ...]:
    """The caller's variables the build reads: the filter's switch, and the toolkit of a CUDA build."""
    return (KEEP_GENCODE_VARIABLE, *(("CUDA_HOME",) if pytorch.cuda else ()))


def cache_group(settings: str, pytorch: PytorchBuild) -> str:
    """The compile-cache group of an extension: the same for every Python of one pytorch release, CUDA, arch list
    and platform (the pytorch recipes' rule), so a second Python's CUDA and C++ objects come from the first's."""
    recorded = json.loads(settings)
    label = f"{recorded['extension']}-{recorded['version']}-{pytorch.accel}-{pytorch.subdir.replace('-', '_')}"
    return group_key(*settings_material(label, settings))


def planned_recipe(stem: str, settings: str, pytorch: PytorchBuild, arch_list: str, channels: tuple[str, ...],
                   files: Mapping[str, str | bytes], needs: tuple[str, ...] = ()) -> PlannedRecipe:
    """The recipe of one extension package in the plan: built for `pytorch` (after the recipes of `needs`), with the
    compile cache (its own group: the nvcc route that keeps only `arch_list`), and the arch check of its CUDA
    libraries."""
    return PlannedRecipe(id=stem, subdir=pytorch.subdir, stems=(stem,), settings=settings, files=files,
                         channels=channels, accel=pytorch.cuda or "cpu", kind=KIND, needs=needs,
                         python=pytorch.python, script_env=_own_env(pytorch), cache_script_env=BUILD_VARIABLES,
                         cache_group=cache_group(settings, pytorch),
                         arch_list=arch_list if pytorch.cuda and arch_list else None)
