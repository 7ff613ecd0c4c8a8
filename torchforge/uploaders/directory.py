"""`file:///path` targets: a conda channel folder, written with torchforge.localchannel (atomic, locked).

Labels map to sub-channels the way anaconda.org lays out its URLs: `main` is the folder itself, any other
label L is `<folder>/label/L`, so `conda install -c file:///folder/label/rc` reads the rc label.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchforge import fileops, localchannel
from torchforge.errors import UsageError
from torchforge.labels import check_label
from torchforge.targets import Target
from torchforge.archives import SUBDIR_RE, Archive, inspect_archive
from torchforge.uploaders.base import Advance, Echo, ExistingPolicy, ExistsError, Outcome, PackageSpec
from torchforge.uploaders.rattler_check import check_channel


_OUTCOME = {localchannel.Placed.ADDED: Outcome.UPLOADED, localchannel.Placed.REPLACED: Outcome.REPLACED,
            localchannel.Placed.IDENTICAL: Outcome.IDENTICAL}


class DirectoryUploader:
    def __init__(self, target: Target, dry_run: bool, echo: Echo) -> None:
        assert target.path is not None
        self.target = target
        self.root: Path = fileops.check_dir(target.path, "target channel")  # before anything is sent, even in a dry run
        self.dry_run = dry_run
        self.echo = echo

    def label_dir(self, label: str) -> Path:
        """The folder of `label`; the label rule keeps it inside the channel, whoever called."""
        check_label(label, self.target.name)
        return self.root if label == "main" else self.root / "label" / label

    def upload(self, archive: Archive, policy: ExistingPolicy, advance: Advance) -> Outcome:
        outcomes: list[Outcome] = []
        for label in self.target.labels:
            channel = self.label_dir(label)
            dest = channel / archive.subdir / archive.filename
            if self.dry_run:
                self.echo(f"[dry-run] copy {archive.path} -> {dest} and re-index {channel}")
                outcomes.append(Outcome.DRY_RUN)
                continue
            try:
                published = localchannel.publish(archive.path, channel, archive.subdir,
                                                 replace=policy is ExistingPolicy.FORCE, progress=advance)
            except localchannel.ArchiveExistsError:
                if policy is ExistingPolicy.SKIP:
                    outcomes.append(Outcome.SKIPPED)
                    continue
                raise ExistsError(
                    f"{dest} already exists with other content",
                    "pass --skip-existing to keep it, or --force to replace it",
                ) from None
            outcomes.append(_OUTCOME[published.placed])
        # One line per file: "skipped" only if every label already had it.
        for wanted in (Outcome.DRY_RUN, Outcome.REPLACED, Outcome.UPLOADED, Outcome.IDENTICAL):
            if wanted in outcomes:
                return wanted
        return Outcome.SKIPPED

    def verify(self, archives: Sequence[Archive]) -> list[str]:
        lines: list[str] = []
        for label in self.target.labels:
            channel = self.label_dir(label)
            with fileops.scratch(channel, "verify") as work:
                lines += check_channel(channel.as_uri(), archives, work=work)
        return lines

    def _files(self, label: str, spec: PackageSpec | None) -> list[Path]:
        channel = self.label_dir(label)
        if not channel.is_dir():
            raise UsageError(f"label {label!r} does not exist in {self.root}", f"labels there: {self.labels()}")
        found: list[Path] = []
        for sub in sorted(p for p in channel.iterdir() if p.is_dir() and SUBDIR_RE.match(p.name)):
            for path in sorted(sub.iterdir()):
                if not path.name.endswith(localchannel.ARCHIVE_SUFFIXES) or path.name.startswith("."):
                    continue
                if spec is None:
                    found.append(path)
                    continue
                archive = inspect_archive(path)
                if spec.matches(archive.name, archive.version, path.name):
                    found.append(path)
        return found

    def labels(self) -> str:
        names = ["main"] if self.root.is_dir() else []
        label_root = self.root / "label"
        if label_root.is_dir():
            names += sorted(p.name for p in label_root.iterdir() if p.is_dir())
        return ", ".join(names) or "none"

    def promote(self, spec: PackageSpec | None, from_label: str, to_labels: Sequence[str], move: bool) -> list[str]:
        source = self.label_dir(from_label)
        files = self._files(from_label, spec)
        if not files:
            raise UsageError(f"nothing matches {spec or 'any package'} in label {from_label!r} of {self.root}")
        done: list[str] = []
        for path in files:
            subdir = path.parent.name
            for label in to_labels:
                dest_channel = self.label_dir(label)
                if self.dry_run:
                    self.echo(f"[dry-run] copy {path} -> {dest_channel / subdir / path.name} and re-index")
                    continue
                try:  # an identical file there means already promoted: promotion is idempotent
                    localchannel.publish(path, dest_channel, subdir)
                except localchannel.ArchiveExistsError as exc:
                    raise ExistsError(f"{exc.path} exists in label {label!r} with other content",
                                      f"remove it from label {label!r} first, or upload the file there with --force") from None
            if move:
                if self.dry_run:
                    self.echo(f"[dry-run] remove {path} and re-index {source}")
                else:
                    localchannel.unpublish(source, subdir, path.name)
            done.append(f"{subdir}/{path.name}")
        return done
