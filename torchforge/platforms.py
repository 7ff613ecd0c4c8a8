"""Everything that differs between conda platforms, in one place (the way cibuildwheel's platforms/ does).

The facts are data (data/platforms.toml); this module turns them into the few decisions resolve, recipe and
render need, so no other module compares platform names.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchforge import data as tables
from torchforge.datamodels import BuildEnvEntry, CudaBuild, PlatformFacts, Release, Toolkit
from torchforge.versions import nodot


@dataclass(frozen=True)
class Platform:
    name: str
    facts: PlatformFacts

    @property
    def script(self) -> str:
        return "bld.bat" if self.facts.windows else "build.sh"

    def cudnn_tag(self, cudnn: str) -> str:
        """cuDNN in the build string: the DLL major on Windows (cudnn64_8.dll), else the first three parts."""
        return cudnn.split(".")[0] if self.facts.windows else ".".join(cudnn.split(".")[:3])

    def cuda_tag(self, release: Release, toolkit: Toolkit | None, cuda: str | None) -> str | None:
        """CUDA in the build string: X.Y, or for <= 1.7 the full version (Linux) / the DLL tag (Windows)."""
        if cuda is None or toolkit is None or release.cuda_tag == "xy":
            return cuda
        return nodot(cuda) if self.facts.windows else toolkit.full_version

    def python_range(self, release: Release, version: str) -> tuple[str, str]:
        """The Python range of one patch release here (patch facts, then Windows', then the X.Y range)."""
        facts = release.patch.get(version)
        if facts and facts.python:
            return facts.python
        if self.facts.windows and release.python_win:
            return release.python_win
        return release.python

    def conda_arch(self, build: CudaBuild) -> str | None:
        if self.facts.windows and build.conda_arch_win:
            return build.conda_arch_win
        return build.conda_arch

    def env_value(self, entry: BuildEnvEntry) -> str | None:
        """The value of one build_env entry here, or None where it does not apply."""
        if entry.when in ("linux", "osx") and entry.when != self.facts.family:
            return None
        return entry.win if self.facts.windows else entry.value


def get(name: str) -> Platform:
    return Platform(name, tables.load().platform(name))
