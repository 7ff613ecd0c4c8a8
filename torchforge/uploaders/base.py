"""The types every upload target and the upload sequencer share: one home, so dependencies point one way
(commands -> torchforge.upload -> uploaders.<kind> -> uploaders.base -> archives)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from torchforge.archives import Archive
from torchforge.errors import UploadFailedError, UsageError
from torchforge.targets import Target

# Called with the number of bytes sent since the last call.
Advance = Callable[[int], None]
Echo = Callable[[str], None]


class ExistingPolicy(str, Enum):
    """What to do when the target already has a file with the same name."""

    FAIL = "fail"
    SKIP = "skip"
    FORCE = "force"


class Outcome(str, Enum):
    UPLOADED = "uploaded"
    REPLACED = "replaced"
    IDENTICAL = "identical"  # the target already had these exact bytes: a rerun converges instead of failing
    SKIPPED = "skipped"
    DRY_RUN = "dry-run"


class TransientError(Exception):
    """A failure worth retrying (5xx, reset connection). Never escapes `with_retries`."""


class AuthError(UploadFailedError):
    """The target refused the credentials; retrying cannot help."""


class ExistsError(UploadFailedError):
    """The target already has this file and the policy is FAIL."""


T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    first_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 30.0


def with_retries(
    action: Callable[[], T],
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `action`; on TransientError wait (exponential back-off) and try again, up to `policy.attempts`."""
    delay = policy.first_delay
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except TransientError as exc:
            if attempt == policy.attempts:
                raise UploadFailedError(
                    f"{what}: gave up after {attempt} attempts: {exc}",
                    "the server kept failing; try again later or check its status",
                ) from exc
            if on_retry is not None:
                on_retry(f"{what}: {exc}; retrying in {delay:.1f}s (attempt {attempt + 1}/{policy.attempts})")
            sleep(delay)
            delay = min(delay * policy.factor, policy.max_delay)
    raise AssertionError("unreachable")


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
