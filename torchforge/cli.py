"""The torchforge command line: parses flags, calls the library, maps ForgeError to an exit code."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.markup import escape

from torchforge import __version__
from torchforge.console import err
from torchforge.errors import ExitCode, ForgeError

# Each module in torchforge.commands registers its own sub-commands.
COMMAND_MODULES: tuple[str, ...] = (
    "selection",
    "build",
    "upload",
    "rpath",
    "ci",
    "diagnose",
    "doctor",
)

app = typer.Typer(
    name="torchforge",
    help="Conda recipes and packages for PyTorch and MAGMA, built the way the official ones were.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"torchforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """torchforge: render, build, repair and publish PyTorch and MAGMA conda packages."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"torchforge.commands.{_name}").register(app)


def main(argv: list[str] | None = None) -> int:
    try:
        # With standalone_mode=False click returns a typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
    except ForgeError as exc:
        # Messages carry paths and server text: escape them so brackets are never read as markup.
        err.print(f"[red]error:[/red] {escape(exc.message)}", markup=True)
        if exc.hint:
            err.print(f"  [bold]what would work:[/bold] {escape(exc.hint)}", markup=True)
        return int(exc.exit_code)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as exc:  # usage errors (unknown option, bad value) from the vendored click
        show = getattr(exc, "show", None)
        if callable(show):
            show(file=sys.stderr)
        else:
            err.print(f"error: {exc}")
        return int(ExitCode.USAGE)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
