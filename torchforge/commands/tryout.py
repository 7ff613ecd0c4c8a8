"""`torchforge standin-channel` and `torchforge install`: try the whole flow (build, publish, install, import) on a
machine with no conda channel and no conda."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from torchforge import sequence
from torchforge.commands.options import (
    ArchListOpt, CudaOpt, ExtensionOpt, FlavourOpt, PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path,
)
from torchforge.commands.stack import StackOpt, refuse_flags
from torchforge.console import err, out, warn
from torchforge.errors import UsageError
from torchforge.extensions.metadata import standin_requirements
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.flavours import Request
from torchforge.prefix import resuming
from torchforge.prefix import install as install_into
from torchforge.proc import Runner
from torchforge.standin import SUBDIR, write_standin_channel


def register(app: typer.Typer) -> None:
    @app.command("standin-channel")
    def standin_channel(
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Channel folder to write (created if missing).")] = Path("standin-channel"),
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, source: SourceOpt = None, flavour: FlavourOpt = None,
        extension: ExtensionOpt = None,
    ) -> None:
        """Write a STAND-IN channel for an offline build: one tiny package per requirement of the recipes that
        `torchforge build` would build with the same flags (the same flavour: conda-forge's shape for 2.6+,
        whose cuDNN, NCCL and MAGMA stand-ins are tiny libraries with the real SONAMEs and run_exports; python
        links to this machine's interpreter, patchelf to its patchelf; the others are empty), and
        OUT/torchforge.toml, which makes `torchforge build --config OUT/torchforge.toml` use it instead of every
        real channel. Packages built against it are for trying torchforge only. --extension SPEC adds what that
        extension's recipe installs (setuptools, wheel, pip, its stated requirements), read without running it."""
        chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list)
        request = Request(pytorch, cuda, python, platform, arch_list, source=source)
        needed = sequence.standins(chosen, request)
        specs = [*needed.specs, *extension_standins(tuple(extension or ()), request)]
        written, config = write_standin_channel(list(dict.fromkeys(specs)), out_dir, conda_forge=needed.conda_forge,
                                                subdir=platform or SUBDIR)
        for path in written:
            out.print(str(path))
        err.print(f"stand-in channel: {len(written)} STAND-IN package(s) in {out_dir} for the requirements of {needed.shape}: "
                  f"tiny packages for trying torchforge offline, NOT the real ones; build with --config {config}")

    @app.command("install")
    def install(
        ctx: typer.Context,
        prefix: Annotated[Path, typer.Option("--prefix", "-p", parser=nonempty_path, help="New environment folder.")],
        specs: Annotated[list[str] | None, typer.Argument(help="Packages to install, e.g. pytorch or 'pytorch 2.9.0'.")] = None,
        channels: Annotated[list[str] | None, typer.Option("--channel", "-c", help="Channel folder or URL, in priority order (repeatable).")] = None,
        stack: StackOpt = None,
        python: Annotated[str | None, typer.Option("--py", "--python", help="With --stack: the Python whose locked environment is installed (default: the lock's only one).")] = None,
    ) -> None:
        """Solve and install packages from channels into a new prefix with py-rattler (like `conda create -p
        PREFIX -c CHANNEL SPEC`), for trying a channel where no conda, mamba or pixi is installed; with --stack,
        exactly the files of the stack's lock (no solve). An interrupted install is finished by running the same
        command again (it removes the half-made prefix and starts over)."""
        if stack is not None:
            refuse_flags(ctx, stack, also=("specs", "channels"), allowed=("python",))
        elif not specs:
            raise UsageError("no package to install", "give SPEC (e.g. pytorch), or --stack FILE")
        elif python is not None:
            raise UsageError("--py goes with --stack", "give --stack FILE, or name the Python in the SPECs")
        if resuming(prefix):
            err.print(f"{prefix} is what an interrupted install left: removing it and installing again", markup=False)
        if stack is not None:
            from torchforge.stackfile import load, lock
            from torchforge.stackfile.install import install_locked

            read = load.read(stack)
            for line in install_locked(lock.read(read.lock_path).environment(python, read.lock_path), prefix):
                out.print(line)
        else:
            installed = install_into(specs or [], channels or [], prefix)
            for line in installed.packages:
                out.print(line)
            seen = installed.cuda_arch
            err.print(f"__cuda_arch {seen}: packages built for other GPUs are refused" if seen else
                      "__cuda_arch absent (no GPU seen): packages' __cuda_arch constraints do not apply", markup=False)
        err.print(f"installed into {prefix}; run {prefix}/bin/python where the packages include python")


def extension_standins(specs: tuple[str, ...], request: Request) -> list[str]:
    """The stand-ins each --extension SPEC's recipe needs, for the request's first Python; a warning where its run
    requirements are left to its setup.py (not read: that runs it) or its build tools are empty stand-ins."""
    import sys
    import tempfile

    python = (request.python or f"{sys.version_info.major}.{sys.version_info.minor}").split(",")[0]
    found: list[str] = []
    for text in specs:
        spec = parse_spec(text)
        with tempfile.TemporaryDirectory(prefix="torchforge-standin-") as tmp:
            archive = None if spec.kind == "index" else fetch(spec, Path(tmp), sys.executable, Runner())
            needs, stated = standin_requirements(archive, python, bool(request.cuda and request.cuda != "cpu"))
        if not stated:
            warn(f"--extension {text}: its run requirements are its setup.py's to say (not run here): add their "
                 "stand-ins by hand if the build's solve names one")
        found += needs
    if found:
        warn("the stand-ins of an extension's build tools (setuptools, wheel, pip) are empty: its build uses those of "
             "this machine's Python, which the stand-in python sees (setuptools < 70.1 also needs `wheel` there for "
             "bdist_wheel)")
    return found
