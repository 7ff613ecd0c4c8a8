"""`torchforge upload`, `torchforge channels` and `torchforge promote`: thin wrappers over torchforge.upload."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from torchforge.console import err, note, out, warn
from torchforge.errors import UsageError
from torchforge.labels import check_label, check_labels
from torchforge.proc import Runner
from torchforge.targets import Target, default_channels_dir, load_all, resolve
from torchforge.archives import Archive, collect, inspect_all
from torchforge.upload import make_uploader, upload_all
from torchforge.uploaders.base import ExistingPolicy, Outcome, PackageSpec

# Files smaller than this upload in a blink; a progress bar would only flicker.
PROGRESS_MIN_BYTES = 8 << 20


@contextmanager
def _progress(archives: list[Archive]) -> Iterator[Callable[[Archive], Callable[[int], None]]]:
    """A rich progress bar per large archive on stderr (disabled when stderr is not a terminal)."""
    show = err.is_terminal and any(a.size >= PROGRESS_MIN_BYTES for a in archives)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=err, transient=True, disable=not show,
    ) as progress:
        def advance_for(archive: Archive) -> Callable[[int], None]:
            if archive.size < PROGRESS_MIN_BYTES:
                return lambda _n: None
            task = progress.add_task(archive.filename, total=archive.size)
            return lambda n: progress.advance(task, n)

        yield advance_for


def _print_columns(rows: list[tuple[str, ...]]) -> None:
    """Plain aligned columns on stdout: package file names are long, and a wrapped table is unreadable
    and ungreppable when stdout is a pipe."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), markup=False)


def _target(to: str, labels: list[str], api_url: str | None, channels_dir: Path | None) -> Target:
    return resolve(to, channels_dir, tuple(labels), api_url)


def upload(
    packages: list[Path] = typer.Argument(None, help="Package files (.conda or .tar.bz2).", show_default=False),
    from_dir: Optional[Path] = typer.Option(None, "--from", help="Upload every package in OUT/<subdir>/ (a build output)."),
    to: str = typer.Option(..., "--to", help="file:///path, anaconda://OWNER, quetz+http(s)://HOST[:PORT]/CHANNEL or a name from `torchforge channels`."),
    label: list[str] = typer.Option([], "--label", "-l", help="Label(s) to upload to (repeatable; default: the target's, else main)."),
    api_url: Optional[str] = typer.Option(None, "--api-url", help="API of an anaconda.org-compatible server."),
    skip_existing: bool = typer.Option(False, "--skip-existing", help="Leave files that already exist on the target."),
    force: bool = typer.Option(False, "--force", help="Replace files that already exist on the target."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check the target serves what was sent."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be sent and run; send nothing."),
    channels_dir: Optional[Path] = typer.Option(None, "--channels-dir", help="Folder of named targets (default: ./channels)."),
) -> None:
    """Upload packages to a channel: verify each archive, send it, then check the channel serves it."""
    if skip_existing and force:
        raise UsageError("--skip-existing and --force contradict each other", "pass one of them")
    policy = ExistingPolicy.FORCE if force else ExistingPolicy.SKIP if skip_existing else ExistingPolicy.FAIL
    target = _target(to, label, api_url, channels_dir)
    archives = inspect_all(collect(packages or [], from_dir))
    note(f"{len(archives)} archive(s) verified; uploading to {target.url} label(s) {', '.join(target.labels)}")
    runner = Runner(dry_run=dry_run, echo=note)
    uploader = make_uploader(target, runner, echo=note)
    with _progress(archives) as advance_for:
        sent = upload_all(uploader, archives, policy, advance_for=advance_for, on_retry=warn)
    rows = [("file", "subdir", "bytes", "sha256", "result")]
    rows += [(s.archive.filename, s.archive.subdir, str(s.archive.size), s.archive.sha256[:16], s.outcome.value)
             for s in sent]
    _print_columns(rows)
    if dry_run or not verify:
        return
    # Skipped files are whatever the target already had; what was sent (or found identical) is checked.
    checked = [s.archive for s in sent if s.outcome in (Outcome.UPLOADED, Outcome.REPLACED, Outcome.IDENTICAL)]
    for line in uploader.verify(checked):
        out.print(f"verified: {line}", markup=False)


def channels(
    channels_dir: Optional[Path] = typer.Option(None, "--channels-dir", help="Folder of named targets (default: ./channels)."),
) -> None:
    """List the named targets in channels/*.toml (never their tokens: only which variable holds one)."""
    folder = channels_dir or default_channels_dir()
    targets = load_all(folder)
    if not targets:
        warn(f"no named targets in {folder}")
        return
    rows = [("name", "kind", "where", "labels", "token from", "description")]
    for name, t in targets.items():
        where = t.url + (f" via {t.api_url}" if t.api_url else "")
        # Only whether a variable is set is shown, never its value.
        token = ",".join(f"${v}" + ("(set)" if os.environ.get(v) else "") for v in t.token_vars) or "-"
        rows.append((name, t.kind.value, where, ",".join(t.labels), token, t.description))
    _print_columns(rows)


def promote(
    spec: Optional[str] = typer.Argument(None, help="NAME[/VERSION[/FILENAME]] to promote (default: all; anaconda needs NAME/VERSION)."),
    to: str = typer.Option(..., "--to", help="Target whose labels change (URL or named target)."),
    from_label: str = typer.Option(..., "--from-label", help="Label the packages are in now, e.g. rc."),
    label: list[str] = typer.Option(["main"], "--label", "-l", help="Label(s) to promote to (repeatable)."),
    move: bool = typer.Option(False, "--move", help="Remove from --from-label afterwards (default: copy)."),
    api_url: Optional[str] = typer.Option(None, "--api-url", help="API of an anaconda.org-compatible server."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; change nothing."),
    channels_dir: Optional[Path] = typer.Option(None, "--channels-dir", help="Folder of named targets (default: ./channels)."),
) -> None:
    """Copy or move packages between labels of one target, the way releases went from test to main."""
    from_label = check_label(from_label, "--from-label")
    to_labels = check_labels(label, "--label")
    if from_label in to_labels:
        raise UsageError(f"--from-label {from_label} is also a --label", "promote to a different label")
    target = _target(to, [], api_url, channels_dir)
    runner = Runner(dry_run=dry_run, echo=note)
    uploader = make_uploader(target, runner, echo=note)
    parsed = PackageSpec.parse(spec) if spec else None
    done = uploader.promote(parsed, from_label, to_labels, move)
    verb = "moved" if move else "copied"
    for name in done:
        out.print(f"{'would be ' if dry_run else ''}{verb}: {name} {from_label} -> {', '.join(to_labels)}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("upload")(upload)
    app.command("channels")(channels)
    app.command("promote")(promote)
