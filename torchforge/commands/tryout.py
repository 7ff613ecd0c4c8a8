"""`torchforge standin-channel` and `torchforge install`: try the whole flow (build, publish, install, import) on a
machine with no conda channel and no conda."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from torchforge import sequence
from torchforge.commands.options import (
    ArchListOpt, CudaOpt, ExtensionOpt, FlavourOpt, ForChannelOpt, ForOpt, PlatformOpt, PythonOpt, PytorchOpt,
    SourceOpt, WheelsOpt, WithOpt, check_channel_args, chosen_flavour, nonempty_path, with_names,
)
from torchforge.commands.stack import StackOpt, refuse_flags
from torchforge.closure import default_source
from torchforge.console import err, out, warn
from torchforge.errors import UsageError
from torchforge.extensions.standins import extension_standins, real_setuptools
from torchforge.flavours import Request
from torchforge.prefix import resuming
from torchforge.prefix import install as install_into
from torchforge.standin import SUBDIR, write_standin_channel


def register(app: typer.Typer) -> None:
    @app.command("standin-channel")
    def standin_channel(
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Channel folder to write (created if missing).")] = Path("standin-channel"),
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, source: SourceOpt = None, flavour: FlavourOpt = None,
        extension: ExtensionOpt = None, for_: ForOpt = None, channel: ForChannelOpt = None, with_: WithOpt = None,
        wheels: WheelsOpt = None,
    ) -> None:
        """Write a STAND-IN channel for an offline build: one tiny package per requirement of the recipes that
        `torchforge build` would build with the same flags (the same flavour: conda-forge's shape for 2.6+,
        whose cuDNN, NCCL and MAGMA stand-ins are tiny libraries with the real SONAMEs and run_exports; python
        links to this machine's interpreter, patchelf to its patchelf; the others are empty), and
        OUT/torchforge.toml, which makes `torchforge build --config OUT/torchforge.toml` use it instead of every
        real channel. Packages built against it are for trying torchforge only. --extension SPEC adds what that
        extension's recipe installs (setuptools, wheel, pip, its stated requirements), read without running it;
        `wheel` is the real one where this machine's setuptools needs it to build wheels. --for SPEC (a pytorch of
        a --channel, e.g. one `repack` wrote): stand-ins for what that pytorch requires and no --channel has;
        --with torchvision,torchaudio adds what their recipes install (their setuptools is the real one, from
        --wheels or pip's index, where this machine's cannot build a wheel)."""
        if channel and for_ is None:
            raise UsageError("--channel says where --for's pytorch is, and no --for is given",
                             "add --for SPEC (e.g. --for 'pytorch ==2.13.0 whl_*'), or leave --channel out")
        chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, for_spec=for_)
        request = Request(pytorch, cuda, python, platform, arch_list, source=source, for_pytorch=for_,
                          for_channels=check_channel_args(channel), with_packages=with_names(with_))
        needed = sequence.standins(chosen, request)
        python_of_stand_ins = needed.python or this_python()
        extra = extension_standins(tuple(extension or ()), python_of_stand_ins, needed.cuda)
        for line in extra.warnings:
            warn(line)
        specs = list(dict.fromkeys([*needed.specs, *extra.specs]))
        # the companions' recipes build a wheel with the host's setuptools (an extension's brings `wheel` itself)
        real = (*extra.real, *(real_setuptools(specs, python_of_stand_ins,
                                               default_source(tuple(str(w) for w in wheels or ())))
                               if request.with_packages else ()))
        written, config = write_standin_channel(specs, out_dir, conda_forge=needed.conda_forge,
                                                subdir=platform or SUBDIR, real=real)
        for path in written:
            out.print(str(path))
        use = f"--channel {out_dir} after the pytorch's --channel" if for_ else f"--config {config}"
        err.print(f"stand-in channel: {len(written)} STAND-IN package(s) in {out_dir} for the requirements of {needed.shape}: "
                  f"tiny packages for trying torchforge offline, NOT the real ones; build with {use}")

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



def this_python() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"
