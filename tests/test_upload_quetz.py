"""`torchforge upload --to quetz+http://...` against a real quetz-server on 127.0.0.1 with sqlite."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import tool_venvs
from tests.hostile import cases, hostile_package
from tests.pkgfactory import make_package
from tests.rattler_in_child import solve_and_install
from tests.test_upload_helpers import cli
from torchforge.archives import inspect_archive

pytestmark = [pytest.mark.slow, pytest.mark.network_services]

CONFIG = Path(__file__).parent / "fixtures" / "quetz" / "quetz_config.toml"
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class Quetz:
    url: str
    key: str
    log: Path

    def api(self, method: str, path: str, payload: object | None = None, key: str | None = None) -> int:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("X-API-Key", key if key is not None else self.key)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def channel(self, name: str) -> str:
        status = self.api("POST", "/api/channels", {"name": name, "private": False})
        assert status == 201, status
        return f"quetz+{self.url}/{name}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def quetz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quetz]:
    bin_dir = tool_venvs.ensure("quetz")
    work = tmp_path_factory.mktemp("quetz")
    shutil.copy(CONFIG, work / "quetz_config.toml")
    env = {**os.environ, "HOME": str(work)}
    created = subprocess.run([str(bin_dir / "quetz"), "create", "deploy", "--copy-conf", "quetz_config.toml", "--dev"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=120)
    match = re.search(r'Test API key created for user "\w+": (\w+)', created.stdout + created.stderr)
    assert match, created.stdout + created.stderr
    port = _free_port()
    log = work / "server.log"
    with log.open("w") as log_fh:
        # Its own session, so the whole process group (uvicorn and any children) can be stopped at the end.
        server = subprocess.Popen(
            [str(bin_dir / "quetz"), "start", "deploy", "--no-supervisor", "--host", "127.0.0.1", "--port", str(port)],
            cwd=work, env=env, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/channels", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"quetz did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield Quetz(url, match.group(1), log)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)


def test_upload_skip_force_then_solve_and_install(quetz: Quetz, tmp_path: Path) -> None:
    target = quetz.channel("torchforge")
    out = tmp_path / "out"
    hello = make_package(out / "linux-64", name="hello", depends=["world"], payload_bytes=50_000)
    make_package(out / "noarch", name="world", subdir="noarch", fmt=".tar.bz2")
    env = {"QUETZ_API_KEY": quetz.key}

    up = cli("upload", "--from", str(out), "--to", target, env=env)
    assert up.returncode == 0, up.stderr
    assert up.stdout.count("uploaded") == 2
    assert "(solved with dependencies from the channel)" in up.stdout
    assert quetz.key not in up.stdout + up.stderr

    # The same bytes again (a rerun after an interruption): the channel already serves them, nothing fails.
    again = cli("upload", str(hello), "--to", target, env=env)
    assert again.returncode == 0, again.stderr
    assert "identical" in again.stdout

    rebuilt = make_package(tmp_path / "rebuilt" / "linux-64", name="hello", depends=["world"], payload_bytes=9_000)
    refused = cli("upload", str(rebuilt), "--to", target, env=env)
    assert refused.returncode == 7
    assert "already exists in quetz channel torchforge" in refused.stderr and "--skip-existing" in refused.stderr

    skipped = cli("upload", "--from", str(out), "--to", target, "--skip-existing", env=env)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.count("skipped") == 2

    forced = cli("upload", str(rebuilt), "--to", target, "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert "replaced" in forced.stdout
    assert f"sha256 {inspect_archive(rebuilt).sha256[:12]}" in forced.stdout  # the server now serves the new file

    prefix = tmp_path / "prefix"
    solve_and_install([f"{quetz.url}/get/torchforge"], ["hello"], prefix, cache=tmp_path)
    assert (prefix / "share" / "hello" / "blob.bin").stat().st_size == 9_000
    assert (prefix / "share" / "world" / "hello.txt").is_file()


def test_bad_key_is_not_retried(quetz: Quetz, tmp_path: Path) -> None:
    target = quetz.channel("keys")
    pkg = make_package(tmp_path / "linux-64")
    result = cli("upload", str(pkg), "--to", target, env={"QUETZ_API_KEY": "wrong-key-123"})
    assert result.returncode == 7
    assert "refused the API key from $QUETZ_API_KEY (401" in result.stderr
    assert "set $QUETZ_API_KEY" in result.stderr
    assert "retrying" not in result.stderr

    missing = cli("upload", str(pkg), "--to", target, env={"QUETZ_API_KEY": ""})
    assert missing.returncode == 7 and "no quetz API key" in missing.stderr


def test_quetz_has_no_labels(quetz: Quetz, tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "linux-64")
    result = cli("upload", str(pkg), "--to", f"quetz+{quetz.url}/x", "--label", "rc", env={"QUETZ_API_KEY": quetz.key})
    assert result.returncode == 2
    assert "quetz channels have no labels" in result.stderr


@pytest.mark.parametrize("label", ["../../../ESCAPED", "..", "rc\n"])
def test_a_hostile_label_is_refused_by_the_label_rule_before_anything_is_sent(quetz: Quetz, tmp_path: Path,
                                                                              label: str) -> None:
    name = "hostile-" + hashlib.sha256(label.encode()).hexdigest()[:8]
    target = quetz.channel(name)
    pkg = make_package(tmp_path / "linux-64")
    env = {"QUETZ_API_KEY": quetz.key}
    for argv in (("upload", str(pkg), "--to", target, "--label", label),
                 ("promote", "--to", target, "--from-label", label),
                 ("promote", "--to", target, "--from-label", "rc", "--label", label, "--move")):
        result = cli(*argv, env=env)
        assert result.returncode == 2, (argv, result.stderr)
        assert "is not a valid label" in result.stderr and "letters, digits" in result.stderr
    with urllib.request.urlopen(f"{quetz.url}/api/channels/{name}/packages", timeout=30) as response:
        assert json.loads(response.read()) == []  # nothing reached the server


def test_server_gone_is_retried_then_reported(tmp_path: Path) -> None:
    # Nothing listens on this port: every attempt is refused, so torchforge retries and then gives up clearly.
    port = _free_port()
    pkg = make_package(tmp_path / "linux-64")
    result = cli("upload", str(pkg), "--to", f"quetz+http://127.0.0.1:{port}/c", env={"QUETZ_API_KEY": "k"})
    assert result.returncode == 7
    assert result.stderr.count("retrying") == 3
    assert "gave up after 4 attempts" in result.stderr and "ConnectionRefusedError" in result.stderr


@pytest.mark.parametrize("case_id", ["dotdot", "symlink", "device"])
def test_a_package_with_a_member_outside_its_prefix_is_refused_before_sending(case_id: str, quetz: Quetz,
                                                                               tmp_path: Path) -> None:
    # It was sent, then the server's install check died; now the pre-send check refuses it (exit 2).
    case = {c.id: c for c in cases(tmp_path / "victim.txt", tmp_path / "outside")}[case_id]
    package = hostile_package(tmp_path / "out" / "linux-64", case.members)
    channel = f"hostile-{case_id}"
    target = quetz.channel(channel)
    result = cli("upload", str(package), "--to", target, env={"QUETZ_API_KEY": quetz.key})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{package}: member '{case.refused}' {case.why}" in " ".join(result.stderr.split())
    with urllib.request.urlopen(f"{quetz.url}/api/channels/{channel}/packages", timeout=30) as response:
        assert json.load(response) == []
    assert f"/api/channels/{channel}/files" not in quetz.log.read_text()


def test_a_package_of_many_chunks_is_streamed_piece_by_piece_and_served_whole(
        quetz: Quetz, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quetz's upload API takes one multipart POST; torchforge streams its body from disk in CHUNK pieces (1 MiB).
    A package of several pieces goes out piece by piece, and quetz serves back exactly its bytes."""
    import hashlib

    from torchforge.targets import parse_url
    from torchforge.uploaders.base import ExistingPolicy, Outcome
    from torchforge.uploaders.quetz import CHUNK, QuetzUploader

    target = parse_url(quetz.channel("chunks"))
    archive = inspect_archive(make_package(tmp_path / "out" / "linux-64", name="big", payload_bytes=3 * CHUNK + 4321))
    assert archive.size > 3 * CHUNK  # the payload is incompressible: the archive is really this big
    monkeypatch.setenv("QUETZ_API_KEY", quetz.key)
    uploader = QuetzUploader(target, dry_run=False, echo=print)
    pieces: list[int] = []
    assert uploader.upload(archive, ExistingPolicy.FAIL, pieces.append) is Outcome.UPLOADED
    assert len(pieces) == -(-archive.size // CHUNK) and sum(pieces) == archive.size
    lines = uploader.verify([archive])  # listed with the sha256 and size sent, then installed from the channel
    assert f"listed linux-64/{archive.filename} sha256 {archive.sha256[:12]}… {archive.size} bytes" in lines
    with urllib.request.urlopen(f"{quetz.url}/get/chunks/linux-64/{archive.filename}", timeout=60) as response:
        served = response.read()
    assert len(served) == archive.size and hashlib.sha256(served).hexdigest() == archive.sha256
