"""`quetz+http(s)://HOST[:PORT]/CHANNEL` targets: the quetz REST API, spoken with the standard library.

Upload is `POST /api/channels/{channel}/files/` (multipart field `files`, form field `force` to overwrite),
authenticated with the `X-API-Key` header. The body is streamed from disk in chunks, so a 500 MB archive is
never held in memory and the progress bar follows what was actually sent. quetz indexes in a background
task, so the post-upload check polls the channel for a while before it declares a file missing.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence

from torchforge.errors import UploadFailedError, UsageError
from torchforge.targets import Credential, Target, find_token
from torchforge.archives import Archive
from torchforge.uploaders.base import (
    Advance, AuthError, Echo, ExistingPolicy, ExistsError, Outcome, PackageSpec, TransientError,
)
from torchforge.uploaders.rattler_check import check_channel

CHUNK = 1 << 20
UPLOAD_TIMEOUT_S = 600  # per socket operation, not for the whole transfer
INDEX_WAIT_S = 60.0


class QuetzUploader:
    def __init__(self, target: Target, dry_run: bool, echo: Echo) -> None:
        assert target.base_url is not None and target.channel is not None
        if target.labels != ("main",):
            raise UsageError(
                f"quetz channels have no labels (asked for {', '.join(target.labels)})",
                f"use one quetz channel per stage instead, e.g. quetz+{target.base_url}/{target.channel}-rc",
            )
        self.target = target
        self.base: str = target.base_url
        self.channel: str = target.channel
        self.dry_run = dry_run
        self.echo = echo
        self._credential: Credential | None = None

    def credential(self) -> Credential:
        if self._credential is None:
            self._credential = find_token(self.target)
        if self._credential is None:
            names = " or ".join(f"${v}" for v in self.target.token_vars)
            raise AuthError(f"no quetz API key for {self.target.url}",
                            f"set {names} to an API key of a user who may upload to channel {self.channel}")
        return self._credential

    @property
    def channel_url(self) -> str:
        return f"{self.base}/get/{self.channel}"

    def upload(self, archive: Archive, policy: ExistingPolicy, advance: Advance) -> Outcome:
        url = f"{self.base}/api/channels/{self.channel}/files/"
        force = policy is ExistingPolicy.FORCE
        if self.dry_run:
            self.echo(f"[dry-run] POST {url} files={archive.filename}" + (" force=true" if force else "")
                      + " X-API-Key: ***")
            return Outcome.DRY_RUN
        key = self.credential().value
        boundary = f"torchforge-{uuid.uuid4().hex}"
        head = b""
        if force:
            head += (f'--{boundary}\r\nContent-Disposition: form-data; name="force"\r\n\r\ntrue\r\n').encode()
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{archive.filename}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        def body() -> Iterator[bytes]:
            yield head
            with archive.path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    advance(len(chunk))
                    yield chunk
            yield tail

        request = urllib.request.Request(url, data=body(), method="POST")
        request.add_header("X-API-Key", key)
        request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
        request.add_header("Content-Length", str(len(head) + archive.size + len(tail)))
        try:
            with urllib.request.urlopen(request, timeout=UPLOAD_TIMEOUT_S) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code == 409:
                if policy is ExistingPolicy.SKIP:
                    return Outcome.SKIPPED
                if self._serves_same(archive):  # a rerun after an interruption: the channel has these bytes
                    return Outcome.IDENTICAL
                raise ExistsError(f"{archive.filename} already exists in quetz channel {self.channel} ({detail})",
                                  "pass --skip-existing to keep it, or --force to replace it") from None
            if exc.code in (401, 403):
                names = " or ".join(f"${v}" for v in self.target.token_vars)
                raise AuthError(
                    f"{self.base} refused the API key from {self._credential.source if self._credential else '?'}"
                    f" ({exc.code}: {detail})",
                    f"set {names} to the key of a user with upload rights on channel {self.channel}",
                ) from None
            if exc.code >= 500:
                raise TransientError(f"HTTP {exc.code}: {detail}") from None
            raise UploadFailedError(f"{self.base} rejected {archive.filename}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TransientError(f"{type(reason).__name__}: {reason}") from None
        return Outcome.REPLACED if force else Outcome.UPLOADED

    def _serves_same(self, archive: Archive) -> bool:
        try:
            check_channel(self.channel_url, [archive], install=False)
        except UploadFailedError:
            return False
        return True

    def verify(self, archives: Sequence[Archive]) -> list[str]:
        # Reads the channel as a client would (no API key): a public channel must serve what was sent.
        return check_channel(self.channel_url, archives, wait_s=INDEX_WAIT_S)

    def promote(self, spec: PackageSpec | None, from_label: str, to_labels: Sequence[str], move: bool) -> list[str]:
        raise UsageError("quetz channels have no labels to promote between",
                         "upload the same files to the release channel with `torchforge upload --to quetz+.../CHANNEL`")


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc.code)
    return str(payload.get("detail", payload)) if isinstance(payload, dict) else str(payload)
