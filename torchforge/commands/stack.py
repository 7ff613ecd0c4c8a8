"""`--stack FILE` of the commands (the stack file read as their request), and `torchforge init`, which writes one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from torchforge.binaries.plan import StackPlan
from torchforge.commands.options import chosen_flavour
from torchforge.console import err, note, out
from torchforge.errors import UsageError
from torchforge.fileops import atomic_write
from torchforge.flavours import Flavour
from torchforge.flavours.base import MatrixView, Plan, Request
from torchforge.stackfile import load, requests
from torchforge.stackfile.init import ROUTES, InitRequest, stack_text
from torchforge.stackfile.plan import repacked_plan, wheels_plan

StackOpt = Annotated[Path | None, typer.Option(
    "--stack", dir_okay=False, help="A stack file (docs/stack-file.md): the whole request, read instead of the "
                                    "selection flags.")]


# What a stack file says (its request): each of these options given beside --stack is refused, on every command
# that has it; the others (engine, jobs, --dry-run, output format ...) say how to run, not what to build.
STACK_SAYS = ("pytorch", "cuda", "python", "platform", "arch_list", "build_number", "debug", "jetson", "env", "gcc",
              "source", "magma_source", "patch", "magma_patch", "fmt", "channel", "magma_only", "flavour", "with_",
              "extension", "feedstock_patches", "for_", "companions", "wheels",
              "extension_env")


def refuse_flags(ctx: typer.Context, stack: Path, *, also: tuple[str, ...] = (), allowed: tuple[str, ...] = ()) -> None:
    """A stack file says what the selection flags say: both at once is refused (which one would win?). Read from
    the command's own parameters (given on the command line or from the environment, not left at their default),
    so no command keeps its own list; `also`: the command's further ones, `allowed`: those it reads with --stack."""
    params = {param.name: param for param in ctx.command.params}
    named = [_shown(params[name]) for name in (*STACK_SAYS, *also) if name in params and name not in allowed
             and _given(ctx, name)]
    if named:
        raise UsageError(f"--stack {stack} and {', '.join(named)}: the stack file already says what "
                         f"{'that flag says' if len(named) == 1 else 'those flags say'}",
                         "give the stack file alone (edit it to change the request), or the flags without --stack")


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _shown(param: object) -> str:
    """How the user typed it: an option's first long name (--py), an argument's name in capitals (SPECS)."""
    opts = [str(opt) for opt in getattr(param, "opts", ())]
    if not opts or not opts[0].startswith("-"):  # an argument: its one "opt" is its name
        return str(getattr(param, "name", "")).upper()
    return next((opt for opt in opts if opt.startswith("--")), opts[0])


@dataclass(frozen=True)
class StackInputs:
    """A stack file read, and the request it makes: `flavour` None where no flavour plans its pytorch."""

    stack: load.Stack
    request: Request
    flavour: Flavour | None


def read(path: Path, out_dir: Path | None = None) -> StackInputs:
    """The stack file and its request (`out_dir`: --out, in place of the file's output channel)."""
    stack = load.read(path)
    if out_dir is not None:
        stack = dataclasses.replace(stack, out=out_dir.resolve())
    request = requests.request(stack)
    if stack.repacked:  # no flavour plans a repacked torch: torchforge.stackfile.plan does
        return StackInputs(stack, request, None)
    flavour = chosen_flavour(requests.flavour_of(stack), request.pytorch, request.cuda, request.python,
                             request.platform, request.arch_list, request.build_number,
                             for_spec=request.for_pytorch)
    return StackInputs(stack, request, flavour)


def wheel_paths(stack: load.Stack) -> list[Path]:
    """The repacked stack's wheels: the file's, or those pip fetches for from = index (kept in the wheel cache)."""
    from torchforge.commands.binaries import default_wheel_dir, fetch_wheels

    repack = requests.repack_request(stack)
    if repack.fetch is None:
        return list(repack.wheels)
    request = repack.fetch
    return list(fetch_wheels(request.pytorch, request.cuda, request.python, ",".join(request.companions),
                             request.index_url, default_wheel_dir()))


def channel_plan(inputs: StackInputs, recipe_format: str, build_flags: tuple[str, ...] = ()) -> tuple[Plan, StackPlan]:
    """The plan of a stack whose torch is repacked (no flavour plans it), and its wheels' plan."""
    stack = inputs.stack
    planned = wheels_plan(stack, requests.repack_request(stack), wheel_paths(stack))
    return repacked_plan(stack, inputs.request, planned, recipe_format, build_flags), planned


def register(app: typer.Typer) -> None:
    @app.command("init")
    def init(
        out_file: Annotated[Path, typer.Option("--out", help="The stack file to write.")] = Path("stack.toml"),
        route: Annotated[str, typer.Option("--from", help="How pytorch is made: wheels, index, source or channel.")] = "index",
        pytorch: Annotated[str, typer.Option("--pytorch", help="The release X.Y.Z.")] = "",
        cuda: Annotated[str, typer.Option("--cuda", help="cpu or CUDA X.Y.")] = "cpu",
        python: Annotated[str, typer.Option("--py", "--python", help="Comma list of Python X.Y.")] = "",
        arch_list: Annotated[str | None, typer.Option("--arch-list", help="CUDA: the arch list, e.g. 9.0.")] = None,
        wheels: Annotated[list[str] | None, typer.Option("--wheels", help="--from wheels: a wheel file or folder, relative to the stack file (repeatable).")] = None,
        match: Annotated[str | None, typer.Option("--match", help="--from channel: the pytorch's match spec.")] = None,
        source: Annotated[str | None, typer.Option("--source", help="--from source: a PyTorch checkout, tarball or URL (a path relative to the stack file).")] = None,
        with_: Annotated[str | None, typer.Option("--with", help="Companions: torchvision,torchaudio.")] = None,
        extension: Annotated[list[str] | None, typer.Option("--extension", metavar="SPEC", help="An extension SPEC (repeatable).")] = None,
        channel: Annotated[list[str] | None, typer.Option("--channel", "-c", help="A channel the stack installs next to (repeatable; default conda-forge).")] = None,
        stack_out: Annotated[str, typer.Option("--channel-out", help="The output channel, relative to the stack file.")] = "forge-channel",
        force: Annotated[bool, typer.Option("--force", help="Replace a stack file that exists.")] = False,
    ) -> None:
        """Write a commented stack file for a request, checked as `--stack` reads it: a team starts from a file
        that works and keeps it under version control."""
        if route not in ROUTES:
            raise UsageError(f"--from {route!r} is not a way to make pytorch", f"one of {', '.join(ROUTES)}")
        if not pytorch or not python:
            raise UsageError("init needs --pytorch X.Y.Z and --py X.Y", "e.g. torchforge init --pytorch 2.13.0 --py 3.11")
        if out_file.exists() and not force:
            raise UsageError(f"{out_file} exists", "give another --out, or --force to replace it")
        names = tuple(n.strip() for n in (with_ or "").split(",") if n.strip())
        text = stack_text(InitRequest(route, pytorch, cuda, tuple(p.strip() for p in python.split(",")), arch_list,
                                      tuple(wheels or ()), match, source, names, tuple(extension or ()),
                                      tuple(channel or ("conda-forge",)), stack_out))
        written = atomic_write(out_file, text)
        try:
            load.read(written)
        except UsageError:
            written.unlink()
            raise
        out.print(str(written))
        err.print(f"wrote {written}: build it with `torchforge build --stack {written}`")
        note("edit it to change the request; docs/stack-file.md lists every key")


def _for_python(stem: str, python: str, pythons: tuple[str, ...]) -> bool:
    """Whether a package of the stack goes in `python`'s environment: not when its build string names another of
    the stack's Pythons (py3.11, py311)."""
    build = stem.rsplit("-", 1)[-1]
    others = [p for p in pythons if p != python]
    return not any(f"py{p}" in build or f"py{p.replace('.', '')}" in build for p in others)


def write_lock(inputs: StackInputs, stems: list[str]) -> None:
    """The lock beside the stack file: per Python, the stack's packages and what they need, solved from the output
    channel and the channels it installs next to."""
    from torchforge.stackfile import lock

    stack, model = inputs.stack, inputs.stack.model
    channels = [str(stack.out), *stack.channels]
    environments = [lock.locked_environment([s for s in dict.fromkeys(stems) if _for_python(s, py, model.python)],
                                            channels, py, model.platform, model.pytorch.cuda)
                    for py in model.python]
    written = lock.write(stack.path, stack.lock_path, environments)
    count = sum(len(env.packages) for env in environments)
    err.print(f"locked {count} package file(s) of the stack in {written}")


def plan_view(the_plan: Plan) -> MatrixView:
    """`matrix --stack` of a plan no flavour makes: one row per recipe (the repacked packages, each extension)."""
    from torchforge.extensions.plan import matrix_cells, matrix_rows
    columns = ("id", "package", "build string", "for / after")
    repacked = [r for r in the_plan.recipes if r.kind != "extension"]
    rows = [{"id": r.id, "kind": r.kind, "packages": list(r.stems), "subdir": r.subdir, "python": r.python,
             "cuda": r.accel, "arch_list": r.arch_list or "", "note": r.note} for r in repacked]
    cells = [(r.id, "\n".join(s.rsplit("-", 1)[0] for s in r.stems), "\n".join(s.rsplit("-", 1)[1] for s in r.stems),
              r.note) for r in repacked]
    extensions = matrix_rows(the_plan)
    return MatrixView((*rows, *extensions), f"stack plan ({the_plan.flavour})", columns,
                      (*cells, *matrix_cells(extensions, len(columns))))
