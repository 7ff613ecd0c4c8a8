"""One uploader per target kind, behind the small `Uploader` protocol that `torchforge.upload` drives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from torchforge.proc import Runner
from torchforge.targets import Target, TargetKind
from torchforge.upload import Archive, ExistingPolicy, Outcome

# Called with the number of bytes sent since the last call.
Advance = Callable[[int], None]
Echo = Callable[[str], None]


@dataclass(frozen=True)
class PackageSpec:
    """What `promote` moves: NAME[/VERSION[/FILENAME]] (the shape anaconda-client's specs have)."""

    name: str
    version: str | None = None
    filename: str | None = None

    @classmethod
    def parse(cls, text: str) -> PackageSpec:
        parts = [p for p in text.strip("/").split("/") if p]
        if not parts or len(parts) > 4:
            from torchforge.errors import UsageError

            raise UsageError(f"{text!r} is not a package spec", "write NAME, NAME/VERSION or NAME/VERSION/FILENAME")
        # A FILENAME may carry its subdir (linux-64/x.conda), as anaconda.org basenames do; keep the file name.
        return cls(parts[0], parts[1] if len(parts) > 1 else None, parts[-1] if len(parts) > 2 else None)

    def matches(self, name: str, version: str, filename: str) -> bool:
        return (name == self.name and (self.version is None or version == self.version)
                and (self.filename is None or filename == self.filename))

    def __str__(self) -> str:
        return "/".join(p for p in (self.name, self.version, self.filename) if p)


class Uploader(Protocol):
    """What every target kind provides. Methods raise ForgeError subclasses; they never print."""

    target: Target

    def upload(self, archive: Archive, policy: ExistingPolicy, advance: Advance) -> Outcome:
        """Send one verified archive to every label of the target."""
        ...

    def verify(self, archives: Sequence[Archive]) -> list[str]:
        """Check that the target serves `archives` as sent; return one line per check done."""
        ...

    def promote(self, spec: PackageSpec | None, from_label: str, to_labels: Sequence[str], move: bool) -> list[str]:
        """Copy (or move) matching files from one label to others; return the files touched."""
        ...


def make_uploader(target: Target, runner: Runner, echo: Echo) -> Uploader:
    """The uploader for `target`. `runner.dry_run` makes every uploader only say what it would do."""
    if target.kind is TargetKind.DIRECTORY:
        from torchforge.uploaders.directory import DirectoryUploader

        return DirectoryUploader(target, dry_run=runner.dry_run, echo=echo)
    if target.kind is TargetKind.ANACONDA:
        from torchforge.uploaders.anaconda import AnacondaUploader

        return AnacondaUploader(target, runner=runner, echo=echo)
    from torchforge.uploaders.quetz import QuetzUploader

    return QuetzUploader(target, dry_run=runner.dry_run, echo=echo)
