"""The torchforge command line: parses flags, calls the library, maps ForgeError to an exit code."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer
from rich.markup import escape

from torchforge import __version__
from torchforge.console import err
from torchforge.errors import ExitCode, ForgeError
from torchforge.fileops import translate

# Each module in torchforge.commands registers its own sub-commands.
COMMAND_MODULES: tuple[str, ...] = (
    "selection",
    "build",
    "upload",
    "rpath",
    "binaries",
    "ci",
    "diagnose",
    "doctor",
    "tryout",
    "stack",
)

app = typer.Typer(
    name="torchforge",
    help="Conda recipes and packages for PyTorch and MAGMA, built the way the official ones were.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help text is plain text: NAME[/VERSION[/FILENAME]] and 8.0;9.0 lists must not be read as rich markup.
    rich_markup_mode=None,
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


def _report(exc: ForgeError) -> int:
    # Messages carry paths and server text: escape them so brackets are never read as markup.
    err.print(f"[red]error:[/red] {escape(exc.message)}", markup=True)
    if exc.hint:
        err.print(f"  [bold]what would work:[/bold] {escape(exc.hint)}", markup=True)
    return int(exc.exit_code)


def main(argv: list[str] | None = None) -> int:
    """Run one command. The only place that catches: every failure becomes a message and one exit code."""
    try:
        # With standalone_mode=False click returns a typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
    except ForgeError as exc:
        return _report(exc)
    except OSError as exc:  # a file-system error no library code expected: say which path and what would work
        return _report(translate(exc))
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort as exc:
        # typer turns an EOFError that escaped a command into Abort (once printed as "aborted", exit 130): a bug.
        return _internal(exc.__cause__ or exc)
    except typer.TyperException as exc:  # usage errors (unknown option, bad value) from the vendored click
        show = getattr(exc, "show", None)
        if callable(show):
            show(file=sys.stderr)
        else:
            err.print(f"error: {exc}")
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        err.print("interrupted; rerun the same command to resume", markup=False)
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: one line, not a traceback, and how to get the details
        return _internal(exc)
    if result == ExitCode.INTERRUPTED:
        # typer turns Ctrl-C inside a command into this return value, silently; no command exits 130 itself.
        err.print("interrupted; rerun the same command to resume", markup=False)
    return result if isinstance(result, int) else 0


def _internal(exc: BaseException) -> int:
    if os.environ.get("TORCHFORGE_DEBUG"):
        traceback.print_exception(exc)
    err.print(f"internal error: {type(exc).__name__}: {exc}", markup=False)
    err.print("  this is a torchforge bug: please report it with the command line "
              "(TORCHFORGE_DEBUG=1 shows where it happened)", markup=False)
    return int(ExitCode.INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
