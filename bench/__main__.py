"""Run every bench_*.py module in this folder and print one table.

`python -m bench [--quick] [NAME ...]`: NAMEs run a subset; --quick runs each once at small sizes (CI).
Exit status 1 when a benchmark could not measure (a row marked failed, or an exception in a module).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import Row, timed  # noqa: F401  (re-exported for bench modules)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    names = [a for a in argv if a != "--quick"]
    console = Console()
    table = Table(title=f"torchforge benchmarks{' (quick: small sizes, not measurements)' if quick else ''}")
    for column in ("benchmark", "measure", "value", "note"):
        table.add_column(column)
    here = Path(__file__).parent
    modules = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    failed: list[str] = []
    for name in modules:
        if names and not any(n in name for n in names):
            continue
        console.print(f"[dim]running {name} ...[/dim]")
        try:
            rows = importlib.import_module(f"bench.{name}").run(quick)
        except Exception:  # a broken benchmark is reported with its traceback, and the others still run
            console.print(traceback.format_exc())
            rows = [Row(name.removeprefix("bench_"), "raised an exception (traceback above)", "-", ok=False)]
        for row in rows:
            table.add_row(row.benchmark, row.measure, row.value if row.ok else f"[red]{row.value} (failed)[/]", row.note)
            if not row.ok:
                failed.append(f"{row.benchmark}: {row.measure}")
    console.print(table)
    if failed:
        console.print(f"[red]{len(failed)} benchmark(s) failed:[/] " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
