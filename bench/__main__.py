"""Run every bench_*.py module in this folder and print one table. `python -m bench [NAME ...]` runs a subset."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import Row, timed  # noqa: F401  (re-exported for bench modules)


def main(names: list[str]) -> int:
    console = Console()
    table = Table(title="torchforge benchmarks")
    for column in ("benchmark", "measure", "value", "note"):
        table.add_column(column)
    here = Path(__file__).parent
    modules = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    for name in modules:
        if names and not any(n in name for n in names):
            continue
        console.print(f"[dim]running {name} ...[/dim]")
        for row in importlib.import_module(f"bench.{name}").run():
            table.add_row(row.benchmark, row.measure, row.value, row.note)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
