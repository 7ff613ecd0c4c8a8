"""`torchforge init`: a commented stack file for a request, so a team starts from a file that works."""

from __future__ import annotations

import json
from dataclasses import dataclass

# What each route writes under [pytorch] besides version and cuda, commented for the reader.
ROUTES = {
    "wheels": ('wheels = {wheels}  # wheel files or folders of them, relative to this file\n'
               'cuda_libs = "conda-forge"  # CUDA libraries from conda-forge\'s packages, or "wheels": NVIDIA\'s repacked\n'),
    "index": ('# index = "https://download.pytorch.org/whl/cu128"  # the wheel index pip reads (default: PyPI)\n'
              'cuda_libs = "conda-forge"\n'),
    "source": ('# flavour = "conda-forge"  # official or conda-forge (default: as `torchforge build` chooses)\n'
               '{source}'),
    "channel": 'match = {match}  # the pytorch already in [channels] next_to, by match spec\n',
}


@dataclass(frozen=True)
class InitRequest:
    route: str  # wheels, index, source or channel
    version: str
    cuda: str
    pythons: tuple[str, ...]
    arch_list: str | None
    wheels: tuple[str, ...]
    match: str | None
    source: str | None
    companions: tuple[str, ...]
    extensions: tuple[str, ...]
    next_to: tuple[str, ...]
    out: str


def _q(value: str) -> str:
    return json.dumps(value)


def _array(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def stack_text(request: InitRequest) -> str:
    """The stack file's text: each key with a comment saying what it is and what else it takes."""
    companion_route = "wheels" if request.route in ("wheels", "index") else "source"
    arch = (f"arch_list = {_q(request.arch_list)}  # TORCH_CUDA_ARCH_LIST of every package, once for the stack\n"
            if request.arch_list else "# arch_list = \"9.0\"  # CUDA stacks: the arch list of every package, once\n")
    source = (f"source = {_q(request.source)}  # the PyTorch source: a checkout, tarball or URL\n" if request.source
              else '# source = "../pytorch"  # a checkout, tarball or URL (default: the release\'s tarball)\n')
    route = ROUTES[request.route].format(wheels=_array(request.wheels), match=_q(request.match or ""), source=source)
    companions = "".join(f"{name} = {_q(companion_route)}\n" for name in request.companions) or \
        f"# torchvision = {_q(companion_route)}\n"
    extensions = "".join(f"\n[[extensions]]\nspec = {_q(spec)}\n" for spec in request.extensions) or \
        '\n# [[extensions]]\n# spec = "torch-scatter==2.1.2"  # NAME==VERSION, a local sdist or folder, or git+URL@REV\n'
    return (
        "# torchforge stack file: the one description of this stack (docs/stack-file.md lists every key).\n"
        "# build, matrix, doctor, render, ci, install and verify read it with --stack; `build --stack` writes the\n"
        "# lock (the exact package files) beside it.\n"
        f"python = {_array(request.pythons)}  # the Pythons X.Y it is built for\n"
        'platform = "linux-64"\n'
        f"{arch}"
        "build_number = 0\n\n"
        "[pytorch]\n"
        f"from = {_q(request.route)}  # wheels (repacked from files), index (repacked from pip's index), source, channel\n"
        f"version = {_q(request.version)}\n"
        f"cuda = {_q(request.cuda)}  # cpu or the CUDA X.Y\n"
        f"{route}\n"
        f"[companions]  # torchvision, torchaudio: {companion_route}\n"
        f"{companions}"
        f"{extensions}\n"
        "[channels]\n"
        f"next_to = {_array(request.next_to)}  # what the stack installs next to, in priority order\n"
        f"out = {_q(request.out)}  # the output channel, relative to this file\n"
        '# upload = "channels/team"  # where `ci` uploads after the tests pass\n'
    )
