"""Console output. Library modules never print; commands use these two consoles."""

from __future__ import annotations

from rich.console import Console

# Results (tables, JSON, paths) go to stdout; progress, warnings and errors go to stderr,
# so `torchforge matrix --json | jq` stays clean.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", markup=True)


def note(message: str) -> None:
    err.print(message, markup=False)
