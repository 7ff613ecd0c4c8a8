"""The extensions of one request, as PlannedRecipes: each SPEC resolved, read and planned for the one pytorch
package of the output channel (the sequencer puts them after the pytorch steps)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchforge.extensions.metadata import metadata_env, read_metadata
from torchforge.extensions.recipe import ExtensionInputs, extension_recipe, pytorch_in_channel
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.fileops import atomic_write
from torchforge.flavours.base import PlannedRecipe
from torchforge.proc import Command, Runner

# What a setup.py imports while pip reads its metadata, besides torch (the packages' build-system requirements).
METADATA_TOOLS = ("setuptools", "wheel", "packaging", "ninja")
READY = ".torchforge-ready"


def metadata_python(root: Path, torch_version: str, runner: Runner) -> str:
    """A venv under `root` where torch `torch_version` (pip's choice: the CPU wheel where pip's configuration
    offers it) and the usual build tools are importable, created once; its python."""
    venv = root / f"metadata-torch-{torch_version}"
    python = venv / "bin" / "python"
    wanted = "\n".join((f"torch=={torch_version}", *METADATA_TOOLS))
    ready = venv / READY
    if ready.is_file() and ready.read_text() == wanted:
        return str(python)
    runner.run(Command((sys.executable, "-m", "venv", "--clear", str(venv))))
    runner.run(Command((str(python), "-m", "pip", "install", "--quiet", *wanted.split("\n"))))
    atomic_write(ready, wanted)
    return str(python)


def planned_extensions(specs: Sequence[str], channel: Path, subdir: str, arch_list: str, recipe_format: str,
                       channels: tuple[str, ...], scratch: Path, runner: Runner, python: str) -> list[PlannedRecipe]:
    """One recipe per SPEC, for the channel's pytorch of `subdir`; `python` has torch importable (metadata)."""
    pytorch = pytorch_in_channel(channel, subdir)
    planned = []
    for number, text in enumerate(specs):
        work = scratch / f"extension-{number}"
        archive = fetch(parse_spec(text), work, python, runner, metadata_env())
        inputs = ExtensionInputs(archive, read_metadata(archive, python, runner, work), pytorch,
                                 arch_list if pytorch.cuda else "", channels)
        planned.append(extension_recipe(inputs, recipe_format))
    return planned


@dataclass(frozen=True)
class ExtensionRequest:
    """`torchforge build --extension SPEC ...` with the request's arch list."""

    specs: tuple[str, ...] = ()
    arch_list: str = ""


def recipes_for_channel(request: ExtensionRequest, channel: Path, subdir: str, recipe_format: str,
                        channels: tuple[str, ...], runner: Runner) -> list[PlannedRecipe]:
    """The request's extensions for the pytorch that `channel` (the output channel) now holds; pip reads their
    metadata in a venv with the CPU torch of that release, kept under CHANNEL/.cache/extensions."""
    if not request.specs:
        return []
    pytorch = pytorch_in_channel(channel, subdir)
    python = metadata_python(channel / ".cache" / "extensions", pytorch.version, runner)
    own = channel.resolve().as_uri()
    return planned_extensions(request.specs, channel, subdir, request.arch_list, recipe_format,
                              (own, *(c for c in channels if c != own)), channel / ".cache" / "extensions", runner,
                              python)
