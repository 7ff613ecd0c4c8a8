"""`torchforge upload --to file://...`: real archives, real py-rattler index, solve and install."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.rattler_in_child import solve, solve_and_install
from tests.test_upload_helpers import cli, cli_env
from torchforge.archives import ArchiveError, inspect_archive

pytestmark = pytest.mark.slow


def _out(tmp: Path) -> Path:
    """A build output folder: hello (linux-64, depends on world) and world (noarch, .tar.bz2)."""
    out = tmp / "out"
    make_package(out / "linux-64", name="hello", depends=["world"])
    make_package(out / "noarch", name="world", subdir="noarch", fmt=".tar.bz2")
    return out


def _repodata_files(channel: Path, subdir: str) -> dict[str, dict[str, object]]:
    data = json.loads((channel / subdir / "repodata.json").read_text())
    return {**data.get("packages", {}), **data.get("packages.conda", {})}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="installs linux-64 test packages")
def test_upload_from_output_then_solve_and_install(tmp_path: Path) -> None:
    out = _out(tmp_path)
    chan = tmp_path / "chan"
    result = cli("upload", "--from", str(out), "--to", chan.as_uri())
    assert result.returncode == 0, result.stderr
    assert "hello-1.0-py3.11_cpu_0.conda" in result.stdout and "uploaded" in result.stdout
    assert "(solved with dependencies from the channel)" in result.stdout
    listed = _repodata_files(chan, "linux-64")["hello-1.0-py3.11_cpu_0.conda"]
    local = inspect_archive(out / "linux-64" / "hello-1.0-py3.11_cpu_0.conda")
    assert (listed["sha256"], listed["size"]) == (local.sha256, local.size)
    assert "world-1.0-py3.11_cpu_0.tar.bz2" in _repodata_files(chan, "noarch")
    prefix = tmp_path / "prefix"
    solve_and_install([chan.as_uri()], ["hello"], prefix, cache=tmp_path)  # as a user's client would
    assert (prefix / "share" / "hello" / "hello.txt").read_text() == "hello from hello 1.0\n"
    assert (prefix / "share" / "world" / "hello.txt").is_file()
    # Published files are readable by others (a web server serving the channel).
    assert (chan / "linux-64" / "hello-1.0-py3.11_cpu_0.conda").stat().st_mode & 0o044 == 0o044


def test_existing_file_fail_skip_force(tmp_path: Path) -> None:
    out = _out(tmp_path)
    chan = tmp_path / "chan"
    assert cli("upload", "--from", str(out), "--to", chan.as_uri(), "--no-verify").returncode == 0

    # The same bytes again (a rerun after an interruption): nothing to do, and the channel is verified.
    again = cli("upload", "--from", str(out), "--to", chan.as_uri())
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("identical") == 2
    assert "verified: install from" in again.stdout

    # A rebuilt package with the same name but other content: refused, kept, or replaced with --force.
    rebuilt = tmp_path / "rebuilt"
    new = make_package(rebuilt / "linux-64", name="hello", depends=["world"], payload_bytes=5000)
    refused = cli("upload", str(new), "--to", chan.as_uri())
    assert refused.returncode == 7
    assert "hello-1.0-py3.11_cpu_0.conda already exists with other content" in refused.stderr
    assert "--skip-existing" in refused.stderr and "--force" in refused.stderr

    skipped = cli("upload", str(new), "--to", chan.as_uri(), "--skip-existing")
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.count("skipped") == 1
    listed = _repodata_files(chan, "linux-64")["hello-1.0-py3.11_cpu_0.conda"]
    assert listed["sha256"] != inspect_archive(new).sha256

    forced = cli("upload", str(new), "--to", chan.as_uri(), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "replaced" in forced.stdout
    listed = _repodata_files(chan, "linux-64")["hello-1.0-py3.11_cpu_0.conda"]
    assert listed["sha256"] == inspect_archive(new).sha256

    both = cli("upload", str(new), "--to", chan.as_uri(), "--force", "--skip-existing")
    assert both.returncode == 2 and "contradict" in both.stderr


def test_corrupt_and_misplaced_archives_are_refused(tmp_path: Path) -> None:
    good = make_package(tmp_path / "linux-64", name="good")
    truncated = tmp_path / "linux-64" / "trunc-1.0-py3.11_cpu_0.conda"
    data = make_package(tmp_path / "src" / "linux-64", name="trunc").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    misplaced = make_package(tmp_path / "osx-arm64", name="mis")  # built for linux-64
    renamed = tmp_path / "linux-64" / "other-1.0-py3.11_cpu_0.tar.bz2"
    renamed.write_bytes(make_package(tmp_path / "src2" / "linux-64", name="orig", fmt=".tar.bz2").read_bytes())
    chan = tmp_path / "chan"

    for bad, words in [
        (truncated, "is not a readable archive"),
        (misplaced, "is built for linux-64 but sits in osx-arm64/"),
        (renamed, "file name does not match its metadata"),
        (tmp_path / "missing-1.0-0.conda", "does not exist"),
    ]:
        with pytest.raises(ArchiveError, match=words):
            inspect_archive(bad)
        # Together with a good file: the bad one stops the whole run before anything is sent.
        result = cli("upload", str(good), str(bad), "--to", chan.as_uri())
        assert result.returncode == 2, (bad, result.stderr)
        assert words in result.stderr.replace("\n", " ") or words in result.stderr
        assert not (chan / "linux-64" / "good-1.0-py3.11_cpu_0.conda").exists()


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    out = _out(tmp_path)
    chan = tmp_path / "chan"
    result = cli("upload", "--from", str(out), "--to", chan.as_uri(), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"[dry-run] copy {out / 'linux-64' / 'hello-1.0-py3.11_cpu_0.conda'} -> {chan / 'linux-64'}" in result.stderr
    assert not chan.exists()


# Each writer: says it is ready, waits for the test's "go" (a start barrier: neither begins before both are
# started), prints when it began and ended (CLOCK_MONOTONIC, one clock for every process of the machine), and
# publishes its packages one by one into the same channel, through the CLI or the library.
CONCURRENT = """
import sys
import time
from pathlib import Path

from torchforge.archives import inspect_archive
from torchforge.cli import main
from torchforge.localchannel import publish

barrier, mode, chan, files = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4:]
(barrier / f"ready-{Path(files[0]).name}").touch()
while not (barrier / "go").exists():
    time.sleep(0.001)
began = time.monotonic()
if mode == "cli":
    code = main(["upload", *files, "--to", chan.as_uri(), "--no-verify"])
else:
    for f in files:
        a = inspect_archive(Path(f))
        publish(a.path, chan, a.subdir)
    code = 0
print(began, time.monotonic(), flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("via_cli", [True, False], ids=["cli", "library"])
def test_concurrent_uploads_leave_a_valid_index(tmp_path: Path, via_cli: bool) -> None:
    chan, barrier = tmp_path / "chan", tmp_path / "barrier"
    barrier.mkdir()
    groups: list[list[Path]] = [[], []]
    for i in range(6):
        groups[i % 2].append(make_package(tmp_path / f"pk{i % 2}" / "linux-64", name=f"pkg{i}"))
    argvs = [[sys.executable, "-c", CONCURRENT, str(barrier), "cli" if via_cli else "library", str(chan), *map(str, g)]
             for g in groups]
    procs = [subprocess.Popen(a, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argvs]
    try:
        for _ in range(30_000):  # both writers started, their imports done, before either may write
            if len(list(barrier.glob("ready-*"))) == 2 or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        (barrier / "go").touch()
    finally:
        # Wait for both before asserting, so a failure never leaves a process running behind the test.
        outcomes = [(*proc.communicate(timeout=300), proc.returncode) for proc in procs]
    for out, err, returncode in outcomes:
        assert returncode == 0, err
    spans = [tuple(map(float, out.split()[-2:])) for out, _, _ in outcomes]
    # The writers overlapped: each began before the other ended.
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    listed = _repodata_files(chan, "linux-64")
    assert sorted(listed) == sorted(f"pkg{i}-1.0-py3.11_cpu_0.conda" for i in range(6))
    assert not list(chan.rglob(".torchforge-tmp-*"))  # no scratch or partial copy left by either writer
    records = solve([chan.as_uri()], [f"pkg{i}" for i in range(6)], cache=tmp_path)
    assert sorted(r.name for r in records) == sorted(f"pkg{i}" for i in range(6))


def test_labels_and_promote(tmp_path: Path) -> None:
    out = _out(tmp_path)
    chan = tmp_path / "chan"
    up = cli("upload", "--from", str(out), "--to", chan.as_uri(), "--label", "rc")
    assert up.returncode == 0, up.stderr
    assert "install from " + (chan / "label" / "rc").as_uri() in up.stdout
    assert "hello-1.0-py3.11_cpu_0.conda" in _repodata_files(chan / "label" / "rc", "linux-64")
    assert not (chan / "linux-64").exists()

    dry = cli("promote", "--to", chan.as_uri(), "--from-label", "rc", "--label", "main", "hello", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would be copied: linux-64/hello-1.0-py3.11_cpu_0.conda rc -> main" in dry.stdout
    assert not (chan / "linux-64").exists()

    copied = cli("promote", "--to", chan.as_uri(), "--from-label", "rc", "--label", "main", "hello/1.0")
    assert copied.returncode == 0, copied.stderr
    assert "copied: linux-64/hello-1.0-py3.11_cpu_0.conda rc -> main" in copied.stdout
    assert "hello-1.0-py3.11_cpu_0.conda" in _repodata_files(chan, "linux-64")
    assert "hello-1.0-py3.11_cpu_0.conda" in _repodata_files(chan / "label" / "rc", "linux-64")

    moved = cli("promote", "--to", chan.as_uri(), "--from-label", "rc", "--move")
    assert moved.returncode == 0, moved.stderr
    assert "world-1.0-py3.11_cpu_0.tar.bz2" in _repodata_files(chan, "noarch")
    assert _repodata_files(chan / "label" / "rc", "linux-64") == {}
    assert _repodata_files(chan / "label" / "rc", "noarch") == {}

    missing = cli("promote", "--to", chan.as_uri(), "--from-label", "beta")
    assert missing.returncode == 2 and "label 'beta' does not exist" in missing.stderr
    assert "main, rc" in missing.stderr


def test_a_big_package_streams_through_every_copy_and_hash_loop(big_package: Path, tmp_path: Path) -> None:
    """300 MiB: the archive check (1 MiB reads of every inner stream and of the file for its hashes), the
    copy into the channel (8 MiB chunks with progress) and the identical-file comparison all loop many times."""
    import hashlib

    from torchforge import localchannel

    size = big_package.stat().st_size
    assert size > 32 * max(localchannel.COPY_CHUNK, 1 << 20)
    archive = inspect_archive(big_package)
    whole = big_package.read_bytes()
    assert (archive.sha256, archive.md5, archive.size) == (hashlib.sha256(whole).hexdigest(),
                                                           hashlib.md5(whole).hexdigest(), size)
    del whole
    calls: list[int] = []
    chan = tmp_path / "chan"
    first = localchannel.publish(big_package, chan, "linux-64", progress=calls.append)
    assert first.placed is localchannel.Placed.ADDED
    assert sum(calls) == size and len(calls) == -(-size // localchannel.COPY_CHUNK)
    assert _repodata_files(chan, "linux-64")[big_package.name]["sha256"] == archive.sha256
    again = localchannel.publish(big_package, chan, "linux-64", progress=calls.append)
    assert again.placed is localchannel.Placed.IDENTICAL and sum(calls) == size  # compared, not copied again


def test_a_file_url_is_percent_decoded_as_conda_reads_it(tmp_path: Path) -> None:
    from torchforge.localchannel import folder_of

    out = _out(tmp_path)
    url = (tmp_path / "my channel").as_uri()  # file:///.../my%20channel
    assert "%20" in url
    result = cli("upload", "--from", str(out), "--to", url)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "my channel" / "linux-64" / "hello-1.0-py3.11_cpu_0.conda").is_file()
    assert not (tmp_path / "my%20channel").exists()
    assert "verified: install from" in result.stdout
    # A --channel argument of build and doctor names the same folder.
    assert folder_of(url) == tmp_path / "my channel"
