"""Upload sequencing shared by every target: pick the uploader, send verified archives with retries, report.

What is sent and how each archive is checked lives in `torchforge.archives`; the per-target work (copy +
index, anaconda-client, quetz HTTP) in `torchforge.uploaders`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torchforge.archives import Archive
from torchforge.proc import Runner
from torchforge.targets import Target, TargetKind
from torchforge.uploaders.base import Echo, ExistingPolicy, Outcome, RetryPolicy, Uploader, with_retries


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


@dataclass(frozen=True)
class Sent:
    archive: Archive
    outcome: Outcome


def upload_all(
    uploader: Uploader,
    archives: Sequence[Archive],
    policy: ExistingPolicy,
    *,
    advance_for: Callable[[Archive], Callable[[int], None]],
    on_retry: Callable[[str], None] | None = None,
    retry: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
) -> list[Sent]:
    """Upload `archives` one by one with retries. Stops at the first permanent failure (auth, exists, 4xx)."""
    sent: list[Sent] = []
    for archive in archives:
        advance = advance_for(archive)

        def attempt(archive: Archive = archive, advance: Callable[[int], None] = advance) -> Outcome:
            return uploader.upload(archive, policy, advance)

        outcome = with_retries(attempt, f"upload of {archive.filename}", retry, on_retry, sleep)
        sent.append(Sent(archive, outcome))
    return sent
