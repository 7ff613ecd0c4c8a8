"""`torchforge standin-channel` and `torchforge install`: try the whole flow (build, publish, install, import) on a
machine with no conda channel and no conda."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from torchforge import sequence
from torchforge.commands.options import (
    ArchListOpt, CudaOpt, FlavourOpt, PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path,
)
from torchforge.console import err, out
from torchforge.flavours import Request
from torchforge.prefix import install as install_into
from torchforge.prefix import resuming
from torchforge.standin import SUBDIR, write_standin_channel


def register(app: typer.Typer) -> None:
    @app.command("standin-channel")
    def standin_channel(
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Channel folder to write (created if missing).")] = Path("standin-channel"),
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, source: SourceOpt = None, flavour: FlavourOpt = None,
    ) -> None:
        """Write a STAND-IN channel for an offline build: one tiny package per requirement of the recipes that
        `torchforge build` would build with the same flags (the same flavour: conda-forge's shape for 2.6+,
        whose cuDNN, NCCL and MAGMA stand-ins are tiny libraries with the real SONAMEs and run_exports; python
        links to this machine's interpreter, patchelf to its patchelf; the others are empty), and
        OUT/torchforge.toml, which makes `torchforge build --config OUT/torchforge.toml` use it instead of every
        real channel. Packages built against it are for trying torchforge only."""
        chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list)
        needed = sequence.standins(chosen, Request(pytorch, cuda, python, platform, arch_list, source=source))
        written, config = write_standin_channel(list(needed.specs), out_dir, conda_forge=needed.conda_forge,
                                                subdir=platform or SUBDIR)
        for path in written:
            out.print(str(path))
        err.print(f"stand-in channel: {len(written)} STAND-IN package(s) in {out_dir} for the requirements of {needed.shape}: "
                  f"tiny packages for trying torchforge offline, NOT the real ones; build with --config {config}")

    @app.command("install")
    def install(
        specs: Annotated[list[str], typer.Argument(help="Packages to install, e.g. pytorch or 'pytorch 2.9.0'.")],
        channels: Annotated[list[str], typer.Option("--channel", "-c", help="Channel folder or URL, in priority order (repeatable).")],
        prefix: Annotated[Path, typer.Option("--prefix", "-p", parser=nonempty_path, help="New environment folder.")],
    ) -> None:
        """Solve and install packages from channels into a new prefix with py-rattler (like `conda create -p
        PREFIX -c CHANNEL SPEC`), for trying a channel where no conda, mamba or pixi is installed. An interrupted
        install is finished by running the same command again (it removes the half-made prefix and starts over)."""
        if resuming(prefix):
            err.print(f"{prefix} is what an interrupted install left: removing it and installing again", markup=False)
        for line in install_into(specs, channels, prefix):
            out.print(line)
        err.print(f"installed into {prefix}; run {prefix}/bin/python where the packages include python")
