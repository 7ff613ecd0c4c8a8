"""The stack file's schema (docs/stack-file.md publishes it, generated from these models).

A stack file is a saved request: every field says what a flag of `build`, `repack`, `ci` ... says, once, for the
whole stack. Types are checked here (pydantic, unknown keys refused); which fields go together is checked in
torchforge.stackfile.load, where each refusal names its key's line.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# How the pytorch of a stack is made (issue 39): repacked from wheel files or from an index's wheels (pip),
# built from source by a flavour, or taken from a channel that already holds it (by match spec).
PytorchFrom = Literal["wheels", "index", "source", "channel"]
# How a companion (torchvision, torchaudio) is made: repacked from its wheel beside torch, or built from source
# after pytorch and pinned to it (`--with`).
CompanionFrom = Literal["wheels", "source"]
_RELEASE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_MINOR = re.compile(r"^[0-9]+\.[0-9]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class PytorchSection(_Strict):
    """[pytorch]: the one pytorch package of the stack and how it is made."""

    from_: PytorchFrom = Field(alias="from", description="wheels | index | source | channel")
    version: str = Field(description="The release X.Y.Z (for wheels: checked against the torch wheel).")
    cuda: str = Field(description="cpu or the CUDA X.Y of the build.")
    wheels: tuple[str, ...] = Field((), description="from = wheels: wheel files or folders of them, relative to "
                                                    "the stack file (torch, triton, NVIDIA's component wheels).")
    index: str | None = Field(None, description="from = index: the wheel index pip reads (default: PyPI).")
    cuda_libs: Literal["conda-forge", "wheels"] | None = Field(
        None, description="from = wheels or index: where the CUDA libraries come from (repack --cuda-libs; "
                          "default conda-forge).")
    flavour: Literal["official", "conda-forge"] | None = Field(
        None, description="from = source: the package shape (default: as `build` chooses for the release).")
    source: str | None = Field(None, description="from = source: a PyTorch checkout, tarball or URL (--source).")
    match: str | None = Field(None, description="from = channel: the match spec of the pytorch package already in "
                                                "[channels] (e.g. 'pytorch 2.11.0 *cuda130*').")

    @field_validator("version")
    @classmethod
    def _release(cls, value: str) -> str:
        if not _RELEASE.match(value):
            raise ValueError(f"{value!r} is not a release X.Y.Z (e.g. '2.13.0')")
        return value

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: str) -> str:
        if value != "cpu" and not _MINOR.match(value):
            raise ValueError(f"{value!r} is neither cpu nor a CUDA X.Y (e.g. '12.8')")
        return value


class Extension(_Strict):
    """[[extensions]]: one PyTorch extension built from its sdist for the stack's pytorch (--extension SPEC)."""

    spec: str = Field(description="NAME==VERSION, a local sdist or folder (relative to the stack file), "
                                  "or git+URL@REV.")
    env: dict[str, str] = Field(default_factory=dict, description="This package's own build variables for its "
                                "setup.py (--extension-env NAME:KEY=VALUE), e.g. { MAMBA_FORCE_CXX11_ABI = \"TRUE\" }"
                                "; part of its build string. Variables torchforge sets are refused.")


class ChannelsSection(_Strict):
    """[channels]: where the stack is published and what it installs next to."""

    next_to: tuple[str, ...] = Field(("conda-forge",), description="The channels the stack's packages install next "
                                                                   "to, in priority order (--channel).")
    out: str = Field("forge-channel", description="The output channel folder, relative to the stack file (--out).")
    upload: str | None = Field(None, description="Upload target of `ci` (--upload-to): a URL or a channels/ name.")
    wheels: tuple[str, ...] = Field((), description="Folders of wheels, relative to the stack file, that the "
                                    "requirements no channel provides are repacked from (--wheels; default: "
                                    "pip's own index).")


class StackFile(_Strict):
    """A team's stack: one pytorch, its CUDA and arch list (written once), Pythons, companions, extensions and
    channels."""

    pytorch: PytorchSection
    python: tuple[str, ...] = Field(description="The Pythons X.Y the stack is built for.", min_length=1)
    platform: str = Field("linux-64", description="The conda subdir (--platform).")
    arch_list: str | None = Field(None, description="CUDA: TORCH_CUDA_ARCH_LIST of every package (e.g. '9.0'), "
                                                    "written once for the whole stack.")
    build_number: int = Field(0, ge=0, description="The build number of the packages made (--build-number).")
    companions: dict[Literal["torchvision", "torchaudio"], CompanionFrom] = Field(
        default_factory=dict, description="torchvision / torchaudio and how each is made: wheels or source.")
    extensions: tuple[Extension, ...] = ()
    channels: ChannelsSection = Field(default_factory=ChannelsSection)

    @field_validator("python")
    @classmethod
    def _pythons(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for python in value:
            if not _MINOR.match(python):
                raise ValueError(f"{python!r} is not a Python X.Y (e.g. '3.12')")
        if len(set(value)) != len(value):
            raise ValueError("a Python is listed twice")
        return value


def json_schema() -> dict[str, object]:
    """The stack file's JSON schema, as the docs publish it."""
    return StackFile.model_json_schema(by_alias=True)
