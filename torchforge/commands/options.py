"""Selection flags shared by matrix, render, build, doctor and ci, and the checks of their values."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from torchforge import companionsource
from torchforge import data as tables
from torchforge.console import note
from torchforge.errors import UsageError
from torchforge.extensions.sdist import parse_spec
from torchforge.extensions.variables import FLAG_FORM, parse_flag
from torchforge.flavours import Flavour, choose
from torchforge.fileops import path_of_file_url
from torchforge.patchfile import check_patches
from torchforge.safeextract import check_archive, is_archive
from torchforge.sharedflags import check_shared_flags

PytorchOpt = Annotated[str | None, typer.Option("--pytorch", help="PyTorch release X.Y.Z (default: the newest release with official packages of the requested CUDA and Python, else the newest that can build them).")]
_DEFAULTS = tables.load().pytorch.defaults  # shown in --help: the data says what an omitted flag means
CudaOpt = Annotated[str | None, typer.Option("--cuda", help=f"Comma list of CUDA X.Y and/or cpu (default: {','.join(_DEFAULTS.cuda)}).")]
PythonOpt = Annotated[str | None, typer.Option("--py", "--python", help=f"Comma list of Python X.Y (default: {','.join(_DEFAULTS.python)}).")]
PlatformOpt = Annotated[str | None, typer.Option("--platform", help="linux-64 (default), linux-aarch64, win-64, osx-64 or osx-arm64 (macOS: cpu only).")]
ArchListOpt = Annotated[str | None, typer.Option("--arch-list", help="Override TORCH_CUDA_ARCH_LIST, e.g. '8.0;9.0'.")]
BuildNumberOpt = Annotated[int, typer.Option("--build-number", min=0, help="Build number (official packages used 0).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Debug build (DEBUG=1; build string gets _debug).")]
JetsonOpt = Annotated[str | None, typer.Option("--jetson", help="Jetson profile: nano, tx1, tx2, tx2_jp33, xavier, orin, thor.")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", help="Extra build variable NAME=VALUE (repeatable), e.g. USE_NCCL=0.")]
GccOpt = Annotated[str | None, typer.Option("--gcc", help="Host GCC version to check against nvcc's limit, e.g. 12.")]


def _local_file(location: str | None) -> Path | None:
    """The local file a --source names (a path or a file:// URL), None for a folder, a remote URL or a git mirror."""
    if location is None:
        return None
    path = path_of_file_url(location) if location.startswith("file://") else Path(location).expanduser()
    return path if path is not None and path.is_file() else None


def _checked_source(location: str | None) -> str | None:
    """--source as given, after a local archive passed the extraction rule: the build engine unpacks it later,
    in either flavour, so one that would write outside its folder is refused before anything is made."""
    local = _local_file(location)
    if local is not None and is_archive(local):  # what is no archive at all is preflight's to judge (exit 9)
        check_archive(local)
    return location


SourceOpt = Annotated[str | None, typer.Option("--source", callback=_checked_source, help="PyTorch source: a local checkout, a tarball URL or a git mirror.")]
MagmaSourceOpt = Annotated[str | None, typer.Option("--magma-source", help="MAGMA source: a local tree or tarball (its version is read from it), or a URL of the release tarball.")]
FlavourOpt = Annotated[Flavour | None, typer.Option(
    "--flavour", help="Package shape: official (the pytorch channel's; the only one up to 2.5) or conda-forge "
                      "(conda-forge's libtorch / pytorch / pytorch-gpu shape, 2.6 and newer). Default: conda-forge "
                      "for a --pytorch release that published no official conda package (2.6+), else official.")]
FeedstockPatchesOpt = Annotated[bool, typer.Option(
    "--feedstock-patches", help="--flavour conda-forge: download conda-forge's source patches of the release "
                                "at build time (pinned commit, sha256) and apply them.")]
WithOpt = Annotated[str | None, typer.Option(
    "--with", help="Also build these for each pytorch package, pinned to it and after it: "
                   "torchvision,torchaudio (comma-separated; the official flavour: PyTorch 2.1-2.5).")]


ForOpt = Annotated[str | None, typer.Option(
    "--for", metavar="SPEC",
    help="Build --with and --extension for this pytorch package a channel already has (a conda match spec, e.g. "
         "'pytorch ==2.13.0 whl_*'), found in --channel or --out; no pytorch is built (docs/have-pytorch.md).")]

WheelsOpt = Annotated[list[Path] | None, typer.Option(
    "--wheels", metavar="DIR",
    help="A folder of wheels (repeatable) that the requirements no channel provides (of a pytorch given with --for, "
         "or of an extension) are repacked from "
         "into --out before anything builds, alone (pip --find-links, no index); without it, pip's own index "
         "(docs/extensions.md).")]

ForChannelOpt = Annotated[list[str] | None, typer.Option(
    "--channel", "-c", help="A local channel --for looks in (repeatable).")]


def _checked_specs(specs: list[str] | None) -> list[str] | None:
    """Each --extension SPEC read before anything is planned: a typo must not wait for the pytorch build."""
    for spec in specs or ():
        parse_spec(spec)
    return specs


ExtensionOpt = Annotated[list[str] | None, typer.Option(
    "--extension", metavar="SPEC", callback=_checked_specs,
    help="Also build this PyTorch extension from its sdist for each pytorch package of the plan, pinned to it and "
         "after it (repeatable): NAME==VERSION, a local sdist or folder, or git+URL@REV (docs/extensions.md).")]


def _checked_env(values: list[str] | None) -> list[str] | None:
    """Each --extension-env read before anything is planned (a variable torchforge sets is refused here)."""
    for text in values or ():
        parse_flag(text)
    return values


ExtensionEnvOpt = Annotated[list[str] | None, typer.Option(
    "--extension-env", metavar="NAME:KEY=VALUE", callback=_checked_env,
    help=f"A build variable of one --extension's setup.py (repeatable): {FLAG_FORM}. It is part of the package's "
         "build string (docs/extensions.md).")]


def extension_variables(values: list[str] | None) -> tuple[tuple[str, str, str], ...]:
    """--extension-env's (name, KEY, VALUE) triples, in the order given."""
    return tuple(parse_flag(text) for text in values or ())


def _checked_with_sources(values: list[str] | None) -> list[str] | None:
    """Each --with-source read (and its path checked) before anything is planned."""
    for text in values or ():
        companionsource.parse_flag(text)
    return values


WithSourceOpt = Annotated[list[str] | None, typer.Option(
    "--with-source", metavar="NAME=PATH", callback=_checked_with_sources,
    help=f"Build this --with companion from a local source tree or archive instead of its release's (repeatable): "
         f"{companionsource.FLAG_FORM}. Its content is part of the package's settings.")]


def with_sources(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--with-source's (NAME, PATH) pairs, in the order given."""
    return tuple(companionsource.parse_flag(text) for text in values or ())


def with_names(companions: str | None) -> tuple[str, ...]:
    """--with's comma-separated names, in order, once each (the flavour says which it builds)."""
    return tuple(dict.fromkeys(name.strip() for name in (companions or "").split(",") if name.strip()))


ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", exists=True, dir_okay=False,
    help="Site config with [channels] and [images] (default: ./torchforge.toml if present).")]
# A file with no hunk is refused while the command line is read: before anything is planned or written.
PatchOpt = Annotated[list[Path] | None, typer.Option(
    "--patch", exists=True, dir_okay=False, callback=lambda paths: check_patches("--patch", paths),
    help="Patch file for the pytorch recipes (repeatable).")]
MagmaPatchOpt = Annotated[list[Path] | None, typer.Option(
    "--magma-patch", exists=True, dir_okay=False, callback=lambda paths: check_patches("--magma-patch", paths),
    help="Patch file for the magma-cudaXYZ recipes only (repeatable).")]


_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/label/[A-Za-z0-9._-]+)?$")


def check_channel_arg(url: str) -> str:
    """--channel takes what conda's -c takes: a URL, a local folder, or a channel name (conda-forge)."""
    if url.strip() and ("://" in url or _CHANNEL_NAME.match(url) or Path(url).is_dir()):
        return url
    raise UsageError(f"--channel {url!r} is not a channel URL, folder or name",
                     "for example --channel conda-forge, --channel https://my.mirror/conda-forge or --channel ./local")


def check_channel_args(urls: list[str] | None) -> tuple[str, ...]:
    """Every --channel of a command, checked; build, doctor and ci take the same ones."""
    return tuple(check_channel_arg(url) for url in urls or ())


def nonempty_path(value: str | Path) -> Path:
    """Parser for folder options: `--out ''` would otherwise become Path('.') and write into the current folder."""
    if isinstance(value, Path):  # a default
        return value
    if not value.strip():
        raise typer.BadParameter("is empty; give a folder")
    return Path(value)


def chosen_flavour(flavour: Flavour | None, pytorch: str | None, cuda: str | None, python: str | None,
                   platform: str | None, arch_list: str | None = None, build_number: int = 0,
                   official_because: str = "", for_spec: str | None = None) -> Flavour:
    """The flavour of a command line, named (with why) only once the flags both flavours share are valid: no
    line states facts about a release that is then refused."""
    check_shared_flags(pytorch, cuda, python, platform, arch_list, build_number)
    if for_spec is not None and flavour is None and not official_because:
        official_because = ("--for builds for a pytorch a channel has; --flavour conda-forge for conda-forge's "
                            "torchvision and torchaudio recipes")
    chosen, why = choose(flavour, pytorch, official_because)
    note(why)
    return chosen
