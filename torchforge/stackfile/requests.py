"""A stack file as the requests the flags make: the flavours' `Request` (torchforge/flavours/base.py) and the
repack request, so that equal requests give equal plans whichever way they were written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchforge.binaries import fetch
from torchforge.binaries.plan import CudaLibs
from torchforge.flavours import Flavour
from torchforge.flavours.base import Request
from torchforge.stackfile.load import Stack


@dataclass(frozen=True)
class RepackRequest:
    """What `torchforge repack` is asked: the wheel files (or what pip fetches), where CUDA's libraries come
    from, the build number."""

    wheels: tuple[Path, ...]
    fetch: fetch.Request | None
    cuda_libs: CudaLibs
    build_number: int


def repack_request(stack: Stack) -> RepackRequest:
    """The repack request of a stack whose torch is repacked (from = wheels or index)."""
    torch, model = stack.model.pytorch, stack.model
    mode = CudaLibs(torch.cuda_libs or CudaLibs.CONDA_FORGE.value)
    if torch.from_ == "wheels":
        return RepackRequest(stack.wheels, None, mode, model.build_number)
    companions = tuple(name for name, made in model.companions.items() if made == "wheels")
    return RepackRequest((), fetch.Request(torch.version, model.python[0], torch.cuda, companions, torch.index),
                         mode, model.build_number)


def flavour_of(stack: Stack) -> Flavour | None:
    """The flavour the file names (from = source), None where `build` chooses it (or none plans the stack)."""
    flavour = stack.model.pytorch.flavour
    return Flavour(flavour) if flavour else None


def request(stack: Stack) -> Request:
    """The flavours' request of the stack: for from = source, what `build --pytorch ... --with ... --extension ...`
    asks; for from = channel, what `build --for MATCH --channel ... --extension ...` asks (the pytorch found in
    [channels] next_to, then the output channel); for a repacked torch, its extensions for that pytorch (its
    companions are in its repack request)."""
    model, torch = stack.model, stack.model.pytorch
    companions = tuple(name for name, made in model.companions.items() if made == "source")
    if torch.match:  # the release, CUDA and Python are the channel's package's (the flags take none with --for)
        return Request(platform=model.platform, arch_list=model.arch_list, build_number=model.build_number,
                       with_packages=companions, extensions=stack.extensions,
                       extension_env=stack.extension_env, planned_extensions=stack.planned_extensions,
                       for_pytorch=torch.match, wheel_folders=tuple(map(str, stack.requirement_wheels)),
                       for_channels=(*stack.channels, str(stack.out)))
    return Request(torch.version, torch.cuda, ",".join(model.python), model.platform, model.arch_list,
                   model.build_number, stack.source, with_packages=companions, extensions=stack.extensions,
                   extension_env=stack.extension_env, planned_extensions=stack.planned_extensions,
                   wheel_folders=tuple(map(str, stack.requirement_wheels)))


def build_channels(stack: Stack) -> tuple[str, ...]:
    """The --channel values of the stack's builds: the channels it installs next to."""
    return stack.channels


def with_flag(stack: Stack) -> str | None:
    """The companions as `--with` writes them (None: none)."""
    names = [name for name in stack.model.companions]
    return ",".join(names) or None
