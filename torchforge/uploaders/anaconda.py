"""`anaconda://OWNER` targets, through the real anaconda-client CLI (`anaconda upload/copy/move`).

The token reaches the client through its own environment variables (BINSTAR_API_TOKEN, which it reads
before ANACONDA_API_TOKEN), never through argv, where `ps` and shell history would show it; the Runner masks
it in every line shown or logged. An `api_url` is written as `url:` into a private, temporary
BINSTAR_CONFIG_DIR (the client's `-s` takes a site alias, not a URL), so the user's own config is untouched.
Telemetry of anaconda-cli-base is on by default; it is turned off for every call.

The client exits 1 for every failure, so its output decides what happened: 401 -> AuthError (not retried),
409 "already exists" -> ExistsError, 5xx or a dropped connection -> TransientError (retried).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torchforge import fileops
from torchforge.errors import ToolMissingError, UploadFailedError, UsageError
from torchforge.labels import check_labels
from torchforge.proc import Command, Runner
from torchforge.targets import Credential, Target, find_token
from torchforge.archives import Archive
from torchforge.uploaders.base import (
    Advance, AuthError, Echo, ExistingPolicy, ExistsError, Outcome, PackageSpec, TransientError, with_retries,
)

DEFAULT_API_URL = "https://api.anaconda.org"
CLIENT_TIMEOUT_S = 6 * 3600  # PyTorch archives are hundreds of MB on slow uplinks
HTTP_TIMEOUT_S = 60

_AUTH = re.compile(r"Unauthorized|\b401\)|401 Client Error")
_EXISTS = re.compile(r"Distribution already exists|already exists for package|Conflict: .*409")
_TRANSIENT = re.compile(
    r"ServerError|, 5\d\d\)|\b5\d\d Server Error|ConnectionError|Connection aborted|RemoteDisconnected|"
    r"ConnectionResetError|Connection reset|Max retries exceeded|Read timed out|API server is unavailable"
)


def find_client(runner: Runner) -> str:
    """The anaconda executable: $TORCHFORGE_ANACONDA, else `anaconda` on PATH."""
    explicit = os.environ.get("TORCHFORGE_ANACONDA")
    hint = ("install anaconda-client in its own venv (it pins click): python -m venv ~/.venv-anaconda && "
            "~/.venv-anaconda/bin/pip install anaconda-client; then export TORCHFORGE_ANACONDA=~/.venv-anaconda/bin/anaconda")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ToolMissingError(f"$TORCHFORGE_ANACONDA={explicit} is not an executable file", hint)
        return explicit
    if runner.dry_run and shutil.which("anaconda") is None:
        return "anaconda"  # a dry run shows the command even where the client is not installed
    return runner.which("anaconda", hint)


def _last_error_line(output: str) -> str:
    for line in output.splitlines():
        if re.match(r"^\w+(Error|Conflict|Unauthorized|NotFound)\b.*:", line.strip()) or line.startswith(
            ("Unauthorized", "Conflict", "ServerError", "BinstarError", "UserError", "ConnectionError", "NotFound")
        ):
            return line.strip()
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


class AnacondaUploader:
    def __init__(self, target: Target, runner: Runner, echo: Echo) -> None:
        assert target.owner is not None
        self.target = target
        self.owner: str = target.owner
        self.runner = runner
        self.echo = echo
        self.api_url = (target.api_url or DEFAULT_API_URL).rstrip("/")
        self._credential: Credential | None = None
        self._had_transient: set[str] = set()

    # -- credentials and the client's environment -------------------------------------------------------------
    def credential(self) -> Credential | None:
        if self._credential is None:
            self._credential = find_token(self.target)
        if self._credential is None and not self.runner.dry_run:
            names = " or ".join(f"${v}" for v in self.target.token_vars)
            raise AuthError(
                f"no anaconda.org token for {self.target.name}",
                f"set {names} to a token with upload rights for {self.owner} "
                f"(anaconda.org > Settings > Access), or store it with "
                f"`keyring set torchforge {self.target.name}`",
            )
        return self._credential

    @contextmanager
    def _client_env(self) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
        cred = self.credential()
        env = {"OTEL_SDK_DISABLED": "true", "ANACONDA_TELEMETRY_ENABLED": "false"}
        secrets: tuple[str, ...] = ()
        if cred is not None:
            env["BINSTAR_API_TOKEN"] = cred.value
            env["ANACONDA_API_TOKEN"] = cred.value
            secrets = (cred.value,)
        if self.target.api_url is None:
            yield env, secrets
            return
        # A private config folder holding only the API URL; the token is never written to it.
        with fileops.private_scratch("anaconda") as tmp:
            (tmp / "data").mkdir()
            (tmp / "data" / "config.yaml").write_text(f"url: {json.dumps(self.api_url)}\n", encoding="utf-8")
            env["BINSTAR_CONFIG_DIR"] = str(tmp)
            yield env, secrets

    def _run(self, argv: list[str], what: str) -> str:
        """Run the client; classify a failure from its output. Returns the (masked) output."""
        with self._client_env() as (env, secrets):
            command = Command(tuple(argv), env=env, secrets=secrets)
            result = self.runner.run(command, check=False, timeout=CLIENT_TIMEOUT_S)
        if result.returncode == 0:
            return result.output
        output = result.output
        reason = _last_error_line(output)
        if _AUTH.search(output):
            names = " or ".join(f"${v}" for v in self.target.token_vars)
            source = self._credential.source if self._credential else "no token"
            raise AuthError(
                f"{what}: {self.api_url} refused the token from {source} ({reason})",
                f"set {names} to a valid token with write access to {self.owner}",
            )
        if _EXISTS.search(output):
            raise ExistsError(f"{what}: {reason}", "pass --skip-existing to keep it, or --force to replace it")
        if _TRANSIENT.search(output):
            raise TransientError(reason)
        raise UploadFailedError(f"{what}: anaconda-client failed: {reason}",
                                "run the command shown above with --verbose after `anaconda`")

    # -- Uploader protocol -----------------------------------------------------------------------------------
    def upload(self, archive: Archive, policy: ExistingPolicy, advance: Advance) -> Outcome:
        argv = [find_client(self.runner), "upload", "--user", self.owner]
        for label in self.target.labels:
            argv += ["--label", label]
        argv.append("--no-progress")
        if policy is ExistingPolicy.SKIP:
            argv.append("--skip-existing")
        elif policy is ExistingPolicy.FORCE:
            argv.append("--force")
        argv.append(str(archive.path))
        try:
            output = self._run(argv, f"upload of {archive.filename}")
        except TransientError:
            self._had_transient.add(archive.filename)
            raise
        except ExistsError:
            # The server's copy may be exactly ours: sent by an earlier attempt whose connection dropped (that
            # attempt succeeded), or by an interrupted run that is being rerun (nothing to do: it converges).
            if self._remote_matches(archive):
                advance(archive.size)
                return Outcome.UPLOADED if archive.filename in self._had_transient else Outcome.IDENTICAL
            raise
        if self.runner.dry_run:
            return Outcome.DRY_RUN
        advance(archive.size)
        if "Distribution already exists. Skipping upload." in output:
            return Outcome.SKIPPED
        if "already exists. Removing." in output:
            return Outcome.REPLACED
        return Outcome.UPLOADED

    # -- verification through the REST API (the client has no command that prints sha256) ----------------------
    def _api_get(self, path: str) -> dict[str, object] | None:
        """GET api_url/path with the token in a header; None on 404. Transient errors raise TransientError."""
        cred = self.credential()
        request = urllib.request.Request(f"{self.api_url}/{path}", method="GET")
        if cred is not None:
            request.add_header("Authorization", f"token {cred.value}")
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code in (401, 403):
                raise AuthError(f"{self.api_url} refused the token ({exc.code})",
                                f"set {' or '.join('$' + v for v in self.target.token_vars)}") from None
            if exc.code >= 500:
                raise TransientError(f"GET {path}: {exc.code}") from None
            raise UploadFailedError(f"GET {self.api_url}/{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise TransientError(f"GET {path}: {exc}") from None

    def _dist(self, archive: Archive) -> dict[str, object] | None:
        return self._api_get(f"dist/{self.owner}/{archive.name}/{archive.version}/{archive.subdir}/{archive.filename}")

    def _remote_matches(self, archive: Archive) -> bool:
        try:
            dist = self._dist(archive)
        except (TransientError, UploadFailedError):
            return False
        return bool(dist) and dist.get("sha256") == archive.sha256 and dist.get("size") == archive.size  # type: ignore[union-attr]

    def verify(self, archives: Sequence[Archive]) -> list[str]:
        lines: list[str] = []
        for archive in archives:
            dist = with_retries(lambda a=archive: self._dist(a), f"check of {archive.filename}")
            where = f"{self.owner}/{archive.name}/{archive.version}/{archive.subdir}/{archive.filename}"
            if dist is None:
                raise UploadFailedError(f"{self.api_url} does not list {where} after upload")
            sha, size = dist.get("sha256"), dist.get("size")
            if sha != archive.sha256 or size != archive.size:
                raise UploadFailedError(
                    f"{where} on {self.api_url} has sha256 {sha} size {size}; sent {archive.sha256} size {archive.size}",
                    "the transfer was damaged or another upload replaced it; upload again with --force",
                )
            labels = [str(x) for x in dist.get("labels", [])]  # type: ignore[union-attr]
            missing = [label for label in self.target.labels if label not in labels]
            if missing:
                raise UploadFailedError(f"{where} is not in label(s) {', '.join(missing)} (has {', '.join(labels)})")
            lines.append(f"listed {where} sha256 {archive.sha256[:12]}… {archive.size} bytes, labels {', '.join(labels)}")
        return lines

    def promote(self, spec: PackageSpec | None, from_label: str, to_labels: Sequence[str], move: bool) -> list[str]:
        if spec is None or spec.version is None:
            raise UsageError("promoting on anaconda.org needs NAME/VERSION or NAME/VERSION/FILENAME",
                             "e.g. torchforge promote --to anaconda://OWNER --from-label rc pytorch/2.5.1")
        check_labels((from_label, *to_labels), self.target.name)  # they become URL path parts on the server
        client = find_client(self.runner)
        target_spec = f"{self.owner}/{spec.name}/{spec.version}"
        if spec.filename is not None:
            release = self._release(spec)
            basenames = [str(d["basename"]) for d in release if str(d["basename"]).endswith("/" + spec.filename)]
            if not basenames:
                raise UsageError(f"{target_spec} has no file {spec.filename}")
            specs = [f"{target_spec}/{b}" for b in basenames]
        else:
            specs = [target_spec]
        for one in specs:
            # `anaconda move` takes one destination: copy to the others first (copy needs the source label).
            for label in (to_labels[1:] if move else to_labels):
                self._run([client, "copy", one, "--to-owner", self.owner, "--from-label", from_label,
                           "--to-label", label], f"copy of {one}")
            if move:
                self._run([client, "move", one, "--from-label", from_label, "--to-label", to_labels[0]],
                          f"move of {one}")
        if self.runner.dry_run:
            return specs
        # `anaconda move` logs its errors and still exits 0, so the server's labels are the only proof.
        done: list[str] = []
        for dist in self._release(spec):
            basename = str(dist["basename"])
            if spec.filename is not None and not basename.endswith("/" + spec.filename):
                continue
            labels = [str(x) for x in dist.get("labels", [])]  # type: ignore[union-attr]
            if any(label not in labels for label in to_labels) or (move and from_label in labels):
                raise UploadFailedError(f"{basename} has labels {', '.join(labels)} after promotion",
                                        f"expected {', '.join(to_labels)}" + (f" without {from_label}" if move else ""))
            done.append(basename)
        return done

    def _release(self, spec: PackageSpec) -> list[dict[str, object]]:
        release = self._api_get(f"release/{self.owner}/{spec.name}/{spec.version}")
        if release is None:
            raise UsageError(f"{self.owner}/{spec.name}/{spec.version} does not exist on {self.api_url}")
        return list(release.get("distributions", []))  # type: ignore[arg-type]
