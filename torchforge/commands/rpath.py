"""`torchforge rpath audit|fix`: thin wrappers over torchforge.rpath."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from torchforge.console import err, note, out
from torchforge.errors import AuditFailedError
from torchforge.proc import Runner
from torchforge.rpath import AuditReport, Layout, audit, audit_tree, summarize
from torchforge.rpath.fix import apply_plan, plan_fix


def _table(report: AuditReport, show_all: bool) -> Table:
    flagged = report.flagged_files()
    table = Table(title=f"{report.source} ({report.layout.value} layout)")
    for column in ("file", "tag", "search path", "needed → where", "flags"):
        table.add_column(column, overflow="fold")
    by_file: dict[str, list[str]] = {}
    for finding in report.findings:
        by_file.setdefault(finding.file, []).append(f"{finding.kind.value}: {finding.detail}")
    shown = {f.file for f in report.files}
    for file in report.files:
        if not show_all and file.file not in flagged:
            continue
        needed = ", ".join(f"{r.needed}→{r.where}" for r in file.resolutions if r.where != "system")
        flags = "\n".join(by_file.get(file.file, [])) or "ok"
        table.add_row(file.file, file.tag, ":".join(file.entries), needed, f"[red]{flags}[/red]" if flags != "ok" else flags)
    for file, flags in by_file.items():  # findings on non-ELF entries (symlinks, unreadable files)
        if file not in shown:
            table.add_row(file, "-", "", "", "[red]" + "\n".join(flags) + "[/red]")
    return table


def _print(report: AuditReport, as_json: bool, show_all: bool) -> None:
    if as_json:
        out.print(report.to_json(), markup=False)
        return
    if report.findings or show_all:
        out.print(_table(report, show_all))
    status = "clean" if report.ok else f"{len(report.findings)} problem(s) in {len(report.flagged_files())} file(s)"
    out.print(f"{len(report.files)} ELF files audited: {status}", markup=False)


def register(app: typer.Typer) -> None:
    rpath_app = typer.Typer(help="Audit and fix RPATHs of ELF files in packages, wheels and prefixes.", no_args_is_help=True)
    app.add_typer(rpath_app, name="rpath")

    @rpath_app.command("audit")
    def audit_cmd(
        path: Path = typer.Argument(..., help=".conda, .tar.bz2 or .whl file, or a directory (unpacked package or prefix)."),
        layout: Layout | None = typer.Option(None, "--layout", help="Expected layout (default: detected)."),
        nvidia_era: str = typer.Option("cu12", "--nvidia-era", help="nvidia-pip RPATH list (wheel-nvidia): cu12 or cu13."),
        as_json: bool = typer.Option(False, "--json", help="Print the full report as JSON."),
        show_all: bool = typer.Option(False, "--all", help="List every ELF file, not only flagged ones."),
    ) -> None:
        """Read every ELF file (never run it) and flag what would break at import time."""
        report = audit(path, layout, nvidia_era=nvidia_era)
        _print(report, as_json, show_all)
        if not report.ok:
            raise typer.Exit(int(AuditFailedError.exit_code))

    @rpath_app.command("fix")
    def fix_cmd(
        path: Path = typer.Argument(..., help="An unpacked package tree or prefix."),
        layout: Layout = typer.Option(..., "--layout", help="conda, wheel-bundled or wheel-nvidia."),
        bundle: list[Path] = typer.Option([], "--bundle", help="Library to copy into torch/lib (hash-renamed unless exempt)."),
        nvidia_era: str = typer.Option("cu12", "--nvidia-era", help="nvidia-pip RPATH list: cu12 or cu13."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the patchelf commands; change nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print the audit after the fix as JSON."),
    ) -> None:
        """Plan the RPATH changes, apply them atomically, then audit (non-zero exit if anything remains)."""
        from torchforge.errors import UsageError

        if not path.is_dir():
            raise UsageError(f"{path} is not a directory", "unpack the package first, or use `torchforge repack`")
        plan = plan_fix(path, layout, bundle=bundle, nvidia_era=nvidia_era)
        note(f"{len(plan.changes)} file(s) to change, {len(plan.unchanged)} already right")
        runner = Runner(dry_run=dry_run, echo=(lambda line: err.print(line, markup=False)) if dry_run else None)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err,
                      transient=True, disable=dry_run or not plan.changes) as progress:
            task = progress.add_task("patching", total=len(plan.changes))

            def step(file: str) -> None:
                progress.update(task, advance=1, description=f"patching {file}")

            apply_plan(plan, runner, on_file=step)
        report = audit_tree(path, layout, nvidia_era=nvidia_era)
        _print(report, as_json, show_all=False)
        if not report.ok and not dry_run:
            raise AuditFailedError(f"audit after fix: {summarize(report.findings)}",
                                   "libraries that are neither in the package nor declared dependencies need --bundle")
        if not report.ok:
            raise typer.Exit(int(AuditFailedError.exit_code))
