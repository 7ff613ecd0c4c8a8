"""`torchforge standin-channel` and `torchforge install`: try the whole flow (build, publish, install, import) on a
machine with no conda channel and no conda."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from torchforge.commands.options import (
    CudaOpt, PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, nonempty_path, selection_from_flags,
)
from torchforge.console import err, out
from torchforge.prefix import install as install_into
from torchforge.standin import write_standin_channel


def register(app: typer.Typer) -> None:
    @app.command("standin-channel")
    def standin_channel(
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Channel folder to write (created if missing).")] = Path("standin-channel"),
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        source: SourceOpt = None,
    ) -> None:
        """Write a STAND-IN channel for an offline build: one tiny package per requirement of the selected
        pytorch recipes (python links to this machine's interpreter, patchelf to its patchelf; the others
        are empty), and OUT/torchforge.toml, which makes `torchforge build --config OUT/torchforge.toml`
        use it instead of every real channel. Packages built against it are for trying torchforge only."""
        selection = selection_from_flags(pytorch, cuda, python, platform, source=source)
        written, config = write_standin_channel(selection, out_dir)
        for path in written:
            out.print(str(path))
        err.print(f"stand-in channel: {len(written)} stand-in package(s) in {out_dir}, NOT the real ones; "
                  f"build with --config {config}")

    @app.command("install")
    def install(
        specs: Annotated[list[str], typer.Argument(help="Packages to install, e.g. pytorch or 'pytorch 2.9.0'.")],
        channels: Annotated[list[str], typer.Option("--channel", "-c", help="Channel folder or URL, in priority order (repeatable).")],
        prefix: Annotated[Path, typer.Option("--prefix", "-p", parser=nonempty_path, help="New environment folder.")],
    ) -> None:
        """Solve and install packages from channels into a new prefix with py-rattler (like `conda create -p
        PREFIX -c CHANNEL SPEC`), for trying a channel where no conda, mamba or pixi is installed."""
        for line in install_into(specs, channels, prefix):
            out.print(line)
        err.print(f"installed into {prefix}; run {prefix}/bin/python where the packages include python")
