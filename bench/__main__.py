"""Run every bench_*.py module in this folder and print one table.

`python -m bench [--quick] [NAME ...]`: NAMEs run a subset; --quick runs each once at small sizes (CI).
Exit status 1 when a benchmark could not measure (a row marked failed, or an exception in a module). A skipped
benchmark is listed as such in the last lines; in CI (strict skips, as tests/conftest.py) it fails the run
unless tests/skips_allowed.py allows it (`bench/bench_NAME.py::`).
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
    skipped: list[tuple[str, str]] = []
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
            value = row.value if row.ok else f"[red]{row.value} (failed)[/]"
            table.add_row(row.benchmark, row.measure, "[yellow]skipped[/]" if row.skipped else value,
                          row.skipped or row.note)
            if not row.ok:
                failed.append(f"{row.benchmark}: {row.measure}")
            if row.skipped:
                skipped.append((f"bench/{name}.py::", f"{row.benchmark}: {row.measure}: {row.skipped}"))
    console.print(table)
    return _summary(console, failed, skipped)


def _summary(console: Console, failed: list[str], skipped: list[tuple[str, str]]) -> int:
    """The last lines: what failed, then what did not run and why (a skip is not a pass)."""
    from tests.skips_allowed import allowed, strict

    if failed:
        console.print(f"[red]{len(failed)} benchmark(s) failed:[/] " + "; ".join(failed))
    for node, why in skipped:
        verdict = "allowed (tests/skips_allowed.py)" if allowed(node, why) else \
            "NOT allowed: fails the run" if strict() else "not allowed in CI"
        console.print(f"[yellow]SKIPPED, not run:[/] {why} ({verdict})", soft_wrap=True)
    refused = [node for node, why in skipped if strict() and not allowed(node, why)]
    return 1 if failed or refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
