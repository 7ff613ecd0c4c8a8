"""Console output. Library modules never print; commands use these two consoles."""

from __future__ import annotations

import sys

from rich.console import Console

# Results (tables, JSON, paths) go to stdout; progress, warnings and errors go to stderr,
# so `torchforge matrix --json | jq` stays clean.
# Wide when not a terminal (pipes, CI logs): tables of long variant ids stay one row per variant.
_WIDTH = None if sys.stdout.isatty() else 220
out = Console(highlight=False, emoji=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True, width=None if sys.stderr.isatty() else 220)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", markup=True)


def note(message: str) -> None:
    err.print(message, markup=False)
