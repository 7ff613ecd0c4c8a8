"""Adversarial input for every command: malformed option values, outputs that are files, devices, read-only or
on another file system, corrupt and truncated archives of each format, and SIGKILL at several points of
`upload`, `build` and `repack` followed by a rerun that must succeed and leave a channel py-rattler solves.

Every case asserts its exit code and message, and that no traceback (and no "internal error", the CLI's
one-line form of an unexpected exception) was printed. Names are official-style (`py3.11_cpu_0`).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.rattler_in_child import solve
from tests.stubchannel import make_stub_channel, recipe_requirements
from tests.test_torch_like import FIXTURE as TORCH_LIKE, REQUEST as TORCH_LIKE_REQUEST, STEM as TORCH_LIKE_STEM
from tests.test_torch_like import offline_site, rendered_recipe
from tests.test_upload_helpers import ROOT, cli_env
from torchforge import fileops, localchannel
from torchforge.cli import main
from torchforge.errors import ExitCode

SCRATCH = fileops.SCRATCH_PREFIX + "*"


def assert_clean(text: str) -> None:
    assert "Traceback" not in text, text
    assert "internal error" not in text, text


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert_clean(text)
    return code, " ".join(text.split())  # rich wraps long lines; compare words, not line breaks


# ------------------------------------------------------------------------------------------- help text

COMMANDS = [["matrix"], ["render"], ["build"], ["upload"], ["channels"], ["promote"], ["repack"], ["ci"],
            ["explain"], ["doctor"], ["rpath"], ["rpath", "audit"], ["rpath", "fix"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_of_every_command_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # promote's NAME[/VERSION[/FILENAME]] crashed the help when it was read as rich markup.
    code, text = run_main([*command, "--help"], capsys)
    assert code == 0 and "Usage:" in text
    if command == ["promote"]:
        assert "NAME[/VERSION[/FILENAME]]" in text


# -------------------------------------------------------------------------------- malformed option values


@pytest.fixture(scope="module")
def junk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("junk")
    (root / "afile").write_text("not a folder\n")
    (root / "pkgs" / "linux-64").mkdir(parents=True)
    make_package(root / "pkgs" / "linux-64", name="hello")
    (root / "chan").mkdir()
    return {"file": str(root / "afile"), "dir": str(root), "pkgs": str(root / "pkgs"), "chan": str(root / "chan"),
            "new": str(root / "new")}


USAGE, REFUSED, FS = int(ExitCode.USAGE), int(ExitCode.REFUSED), int(ExitCode.FILESYSTEM)
SEL = "--cuda cpu --py 3.12"
# (command line, exit code, words the message must contain). {file} is a regular file, {dir} a folder,
# {new} a path that does not exist yet, {pkgs} a build output with one package, {chan} an empty folder.
MALFORMED: list[tuple[str, int, str]] = [
    ("matrix --pytorch abc", USAGE, "--pytorch expects a release version X.Y.Z"),
    ("matrix --pytorch ''", USAGE, "--pytorch is empty"),
    ("matrix --cuda ''", USAGE, "--cuda is empty"),
    ("matrix --cuda ,", USAGE, "--cuda is empty"),
    ("matrix --cuda 12", USAGE, "--cuda expects X.Y or cpu"),
    ("matrix --py ''", USAGE, "--py is empty"),
    ("matrix --py abc", USAGE, "--py expects X.Y"),
    ("matrix --platform solaris-64", USAGE, "unknown platform 'solaris-64'"),
    ("matrix --platform ''", USAGE, "--platform is empty"),
    ("matrix --arch-list ';;'", USAGE, "--arch-list is empty"),
    ("matrix --arch-list abc --cuda 12.4 --py 3.12", USAGE, "'abc' is not an arch value"),
    ("matrix --jetson ''", USAGE, "--jetson is empty"),
    ("matrix --jetson foo", REFUSED, "unknown Jetson profile 'foo'"),
    ("matrix --env x", USAGE, "--env expects NAME=VALUE"),
    ("matrix --build-number -1", USAGE, "--build-number"),
    ("matrix --gcc abc", USAGE, "--gcc expects a GCC version such as 12 or 11.4, got 'abc'"),
    ("matrix --gcc 99 --cuda 12.4 --py 3.12", REFUSED, "accepts GCC"),
    ("matrix --cuda 99.9 --py 3.12", REFUSED, "CUDA 99.9 is not a known toolkit"),
    ("render --gcc abc --out {new}", USAGE, "--gcc expects a GCC version"),
    ("render --format zip", USAGE, "--format"),
    ("render --out '' " + SEL, USAGE, "--out"),
    ("render --out {file} " + SEL, FS, "--out {file} is a file"),
    ("render --out /dev/null " + SEL, FS, "--out /dev/null is not a folder"),
    ("render --source '' " + SEL + " --out {new}", USAGE, "--source is empty"),
    ("render --magma-source '' --cuda 12.4 --py 3.12 --out {new}", USAGE, "--magma-source is empty"),
    ("render --cuda 99.9 --py 3.12 --out {new}", REFUSED, "cannot be built"),
    ("build --gcc abc --dry-run --out {new}", USAGE, "--gcc expects a GCC version"),
    ("build --engine make " + SEL + " --out {new}", USAGE, "unknown engine 'make'"),
    ("build --format zip", USAGE, "unknown --format 'zip'"),
    ("build --jobs 0", USAGE, "--jobs"),
    ("build --channel '' " + SEL + " --dry-run --out {new}", USAGE, "--channel '' is not a channel"),
    ("build --channel ::: " + SEL + " --dry-run --out {new}", USAGE, "--channel ':::' is not a channel"),
    ("build --out {file} " + SEL, FS, "--out {file} is a file"),
    ("build --out /dev/null " + SEL + " --skip-preflight", FS, "--out /dev/null is not a folder"),
    ("build --out '' " + SEL, USAGE, "--out"),
    # A refused selection exits 4 from build as from every command, with and without --dry-run.
    ("build --cuda 99.9 --py 3.12 --out {new}", REFUSED, "cannot be built"),
    ("build --cuda 99.9 --py 3.12 --out {new} --dry-run", REFUSED, "cannot be built"),
    ("build --cuda 99.9 --py 3.12 --out {new} --skip-preflight", REFUSED, "cannot be built"),
    ("doctor --cuda 99.9 --py 3.12 --out {new}", REFUSED, "cannot be built"),
    ("doctor --gcc abc", USAGE, "--gcc expects a GCC version"),
    ("doctor --channel ::: " + SEL, USAGE, "--channel ':::' is not a channel"),
    ("doctor --py '' ", USAGE, "--py is empty"),
    ("doctor --out {file} " + SEL, FS, "--out {file} is a file"),
    ("ci github --cuda 99.9 --py 3.12 --out {new}", REFUSED, "cannot be built"),
    ("ci github --cuda '' --out {new}", USAGE, "--cuda is empty"),
    ("ci bogus --out {new}", USAGE, "provider"),
    ("ci github --channel '' --out {new} " + SEL, USAGE, "--channel '' is not a channel"),
    ("ci gitlab --out {file} " + SEL, FS, "--out {file} is a file"),
    ("ci github --out /dev/null " + SEL, FS, "--out /dev/null is not a folder"),
    ("ci github --out {new} --runner-map abc --cuda 12.4 --py 3.12", USAGE, "--runner-map expects CUDA=LABEL"),
    ("ci github --out {new} --requirement '' " + SEL, USAGE, "--requirement is empty"),
    ("ci github --out {new} --upload-to quetz+https://user:s3cr3t@host/chan " + SEL, USAGE,
     "'quetz+https://***@host/chan' carries credentials in the URL"),
    ("upload --to file://{chan}", USAGE, "nothing to upload"),
    ("upload {file} --to file://{chan}", USAGE, "is not a conda archive"),
    ("upload --from {file} --to file://{chan}", USAGE, "no such folder"),
    ("upload --from {pkgs} --to ''", USAGE, "no target named ''"),
    ("upload --from {pkgs} --to file://{chan} --label ''", USAGE, "is not a valid label"),
    ("upload --from {pkgs} --to file://{chan} --force --skip-existing", USAGE, "contradict"),
    ("upload --from {pkgs} --to anaconda://x --api-url ftp://x", USAGE, "is not an http(s) URL"),
    ("upload --from {pkgs} --to anaconda://x --api-url https://a:s3cr3t@h", USAGE, "'https://***@h' carries credentials"),
    ("upload --from {pkgs} --to quetz+https://user:s3cr3t@host/chan", USAGE,
     "'quetz+https://***@host/chan' carries credentials in the URL"),
    ("upload --from {pkgs} --to https://user:s3cr3t@host/chan", USAGE, "'https://***@host/chan' carries credentials"),
    ("upload --from {pkgs} --to quetz+http://h:abc/chan", USAGE, "has an invalid port"),
    ("upload --from {pkgs} --to quetz+http:///chan", USAGE, "does not name a quetz channel"),
    # A regular file as the target: an error with every policy, never "skipped" with exit 0.
    ("upload --from {pkgs} --to file://{file}", FS, "target channel {file} is a file"),
    ("upload --from {pkgs} --to file://{file} --force", FS, "target channel {file} is a file"),
    ("upload --from {pkgs} --to file://{file} --skip-existing", FS, "target channel {file} is a file"),
    ("upload --from {pkgs} --to file://{file} --dry-run", FS, "target channel {file} is a file"),
    ("upload --from {pkgs} --to file:///dev/null --skip-existing", FS, "target channel /dev/null is not a folder"),
    ("channels --channels-dir {file}", FS, "--channels-dir {file} is a file"),
    ("promote --to file://{chan} --from-label rc", USAGE, "label 'rc' does not exist"),
    ("promote //// --to file://{chan} --from-label rc", USAGE, "'////' is not a package spec"),
    ("promote --to file://{file} --from-label rc", FS, "target channel {file} is a file"),
    ("promote --to anaconda://x --from-label rc --label rc", USAGE, "is also a --label"),
    ("rpath audit {file}", USAGE, "is not a package"),
    ("rpath audit {dir}/missing.conda", USAGE, "does not exist"),
    ("rpath audit {dir} --layout bogus", USAGE, "--layout"),
    ("rpath audit {dir} --nvidia-era cu99", USAGE, "unknown nvidia RPATH era 'cu99'"),
    ("rpath fix {file} --layout conda", USAGE, "is not a directory"),
    ("rpath fix {dir} --layout conda --nvidia-era cu99", USAGE, "unknown nvidia RPATH era 'cu99'"),
    ("repack {file} --out {new}", USAGE, "is not a wheel file name"),
    ("repack {dir}/torch-2.13.0-cp311-cp311-linux_x86_64.whl --out {new}", USAGE, "does not exist"),
    ("repack {dir}/x.whl --out ''", USAGE, "--out"),
    ("explain {dir}", USAGE, "does not exist or is not a file"),
    ("explain /dev/null", USAGE, "does not exist or is not a file"),
]


@pytest.mark.parametrize(("line", "code", "words"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_values_get_a_message_and_their_exit_code(
        line: str, code: int, words: str, junk: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    got, text = run_main(shlex.split(line.format(**junk)), capsys)
    assert got == code, text
    assert words.format(**junk) in text
    assert "s3cr3t" not in text  # credentials given in a URL are never repeated
    assert not Path(junk["new"]).exists(), "a refused command wrote output"


@pytest.mark.parametrize("wheel_bytes", [b"", b"PK\x05\x06" + b"\0" * 18], ids=["empty", "empty-zip"])
def test_zstd_level_is_checked_before_any_work(wheel_bytes: bytes, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The level is refused before the wheel is read: a wheel that cannot be read at all gets the level's message,
    not the wheel's (how fast that is on the 190 MB torch wheel is measured in bench/bench_rpath.py)."""
    wheel = tmp_path / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(wheel_bytes)
    code, text = run_main(["repack", str(wheel), "--out", str(tmp_path / "chan"), "--zstd-level", "99"], capsys)
    assert code == USAGE and "--zstd-level 99 is outside zstd's levels 1..22" in text, text
    assert not (tmp_path / "chan").exists()


# ------------------------------------------------------------------------- corrupt and truncated archives


@dataclass(frozen=True)
class Damaged:
    path: Path
    how: str


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> list[Damaged]:
    root = tmp_path_factory.mktemp("damaged")
    src = root / "src"
    conda = make_package(src / "linux-64", name="hello", payload_bytes=300_000).read_bytes()
    bz2 = make_package(src / "linux-64", name="world", fmt=".tar.bz2", payload_bytes=300_000).read_bytes()
    out: list[Damaged] = []

    def put(name: str, data: bytes, how: str) -> None:
        folder = root / how / "linux-64"
        folder.mkdir(parents=True)
        (folder / name).write_bytes(data)
        out.append(Damaged(folder / name, how))

    put("hello-1.0-py3.11_cpu_0.conda", os.urandom(4096), "conda-garbage")
    put("hello-1.0-py3.11_cpu_0.conda", conda[: len(conda) // 2], "conda-truncated")
    # A valid zip (CRCs match) whose inner payload stream is cut: only reading the zstd stream finds it.
    inner = root / "inner.conda"
    with zipfile.ZipFile(src / "linux-64" / "hello-1.0-py3.11_cpu_0.conda") as zin, zipfile.ZipFile(inner, "w") as zout:
        for info in zin.infolist():
            blob = zin.read(info)
            zout.writestr(info, blob[: len(blob) // 2] if info.filename.startswith("pkg-") else blob)
    put("hello-1.0-py3.11_cpu_0.conda", inner.read_bytes(), "conda-inner-truncated")
    put("world-1.0-py3.11_cpu_0.tar.bz2", bz2[: len(bz2) // 2], "bz2-truncated")
    put("world-1.0-py3.11_cpu_0.tar.bz2", os.urandom(4096), "bz2-garbage")
    return out


@pytest.fixture(scope="module")
def damaged_wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from tests.test_wheel_repair import build_hello_wheel

    root = tmp_path_factory.mktemp("damaged-wheels")
    good = build_hello_wheel(root, name="torch").read_bytes()
    wheels = []
    for how, data in (("garbage", os.urandom(4096)), ("truncated", good[: len(good) // 2]),
                      ("bitflip", good[:200] + bytes([good[200] ^ 0xFF]) + good[201:])):
        folder = root / how
        folder.mkdir()
        path = folder / f"torch-2.13.0-cp{sys.version_info.major}{sys.version_info.minor}-cp"
        path = Path(f"{path}{sys.version_info.major}{sys.version_info.minor}-linux_x86_64.whl")
        path.write_bytes(data)
        wheels.append(path)
    return wheels


def test_upload_refuses_every_damaged_archive(damaged: list[Damaged], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for item in damaged:
        code, text = run_main(["upload", str(item.path), "--to", (tmp_path / "chan").as_uri()], capsys)
        assert code == USAGE, (item.how, text)
        assert f"{item.path} is not a readable archive" in text, (item.how, text)
        assert not (tmp_path / "chan").exists(), item.how


def test_rpath_audit_refuses_every_damaged_archive(damaged: list[Damaged], damaged_wheels: list[Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for path in [d.path for d in damaged] + damaged_wheels:
        code, text = run_main(["rpath", "audit", str(path)], capsys)
        assert code == USAGE, (path, text)  # not 130 "aborted": the truncated payload is a damaged archive
        assert f"{path} is not a readable archive" in text, (path, text)


def test_repack_refuses_damaged_wheels_before_touching_the_channel(
        damaged_wheels: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for wheel in damaged_wheels:
        code, text = run_main(["repack", str(wheel), "--out", str(tmp_path / "chan")], capsys)
        assert code == USAGE, (wheel, text)
        assert f"{wheel} is not a readable archive" in text, (wheel, text)
        assert not (tmp_path / "chan").exists()


# -------------------------------------------------------------- outputs on read-only and other file systems


@dataclass(frozen=True)
class Mounts:
    readonly: Path
    other: Path  # a tmpfs: another file system than the test's temporary folder


@pytest.fixture(scope="module")
def mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounts]:
    root = tmp_path_factory.mktemp("mounts")
    ro, other = root / "ro", root / "other"
    ro.mkdir()
    other.mkdir()
    done: list[Path] = []
    try:
        for where, options in ((ro, "ro,size=1m"), (other, "size=512m")):
            result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}")
            done.append(where)
        assert os.stat(other).st_dev != os.stat(root).st_dev
        yield Mounts(ro, other)
    finally:
        for where in reversed(done):
            subprocess.run(["umount", "-l", str(where)], check=False)


READONLY_CASES = [
    ("render --out {ro}/recipes " + SEL, "--out: cannot use {ro}/recipes: Read-only file system"),
    ("ci github --out {ro} --wheel {self_wheel} " + SEL, "cannot use {ro}/.torchforge: Read-only file system"),  # its wheel goes first
    ("build --out {ro}/chan " + SEL + " --skip-preflight", "--out: cannot use {ro}/chan: Read-only file system"),
    ("upload --from {pkgs} --to file://{ro}/chan", "channel folder: cannot use {ro}/chan: Read-only file system"),
    ("upload --from {pkgs} --to file://{ro}", "Read-only file system"),
    ("repack {wheel} --out {ro}/chan", "cannot use {ro}/chan: Read-only file system"),
]


@pytest.mark.parametrize(("line", "words"), READONLY_CASES, ids=[c[0].split()[0] + "-" + str(i) for i, c in enumerate(READONLY_CASES)])
def test_read_only_output_is_a_file_system_error(line: str, words: str, mounts: Mounts, junk: dict[str, str],
                                                 hello_wheel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.golden.ci_regenerate import self_wheel

    values = {**junk, "ro": str(mounts.readonly), "wheel": str(hello_wheel)}
    if "{self_wheel}" in line:  # built offline (hatchling from the test extra), not by `ci` asking PyPI
        values["self_wheel"] = str(self_wheel())
    code, text = run_main(shlex.split(line.format(**values)), capsys)
    assert code == FS, text
    assert words.format(**values) in text
    assert "the file system is read-only: choose a writable folder" in text


@pytest.fixture(scope="module")
def hello_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real CPython wheel of a project named torch, with a C extension (repack turns it into
    pytorch-1.0-whl_pyX.Y_cpu_0)."""
    from tests.test_wheel_repair import build_hello_wheel

    return build_hello_wheel(tmp_path_factory.mktemp("hello-wheel"), name="torch")


def test_move_into_place_crosses_file_systems(mounts: Mounts, tmp_path: Path) -> None:
    source = tmp_path / "folder"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("payload\n")
    with pytest.raises(OSError) as raised:
        os.replace(source, mounts.other / "probe")
    assert raised.value.errno == errno.EXDEV  # the situation the fallback exists for
    fileops.move_into_place(source, mounts.other / "folder")
    assert (mounts.other / "folder" / "sub" / "f.txt").read_text() == "payload\n"
    assert not source.exists() and not list(mounts.other.glob(SCRATCH))


def test_every_output_works_on_another_file_system(mounts: Mounts, junk: dict[str, str], hello_wheel: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    other = mounts.other
    code, text = run_main(["render", *SEL.split(), "--out", str(other / "recipes")], capsys)
    assert code == 0, text
    assert (other / "recipes" / "pytorch-2.5.1-cpu-py312-linux_64" / "meta.yaml").is_file()
    code, text = run_main(["render", *SEL.split(), "--out", str(other), "--force"], capsys)  # the mount point itself
    assert code == 0, text
    from tests.golden.ci_regenerate import self_wheel

    code, text = run_main(["ci", "gitlab", *SEL.split(), "--out", str(other), "--wheel", str(self_wheel())], capsys)
    assert code == 0 and (other / ".gitlab-ci.yml").is_file(), text
    code, text = run_main(["upload", "--from", junk["pkgs"], "--to", (other / "chan").as_uri()], capsys)
    assert code == 0 and "verified: install from" in text, text
    code, text = run_main(["repack", str(hello_wheel), "--out", str(other / "chan")], capsys)
    assert code == 0, text
    assert sorted(p.name for p in (other / "chan" / "linux-64").glob("*.conda")) == [
        "hello-1.0-py3.11_cpu_0.conda", f"pytorch-1.0-whl_py{sys.version_info.major}.{sys.version_info.minor}_cpu_0.conda"]
    assert not list(other.rglob(SCRATCH))


# ------------------------------------------------------------------------------------- SIGKILL and rerun


def _foreground_signals() -> None:
    # As a terminal's foreground job: a test run started in the background (`make test &`, a CI runner) has
    # SIGINT ignored, the child would inherit that, and Python then installs no Ctrl-C handler at all.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "torchforge.cli", *argv], env=cli_env(), cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_foreground_signals)


def kill_when(argv: list[str], point: Callable[[], bool], log: Path, timeout: float = 600) -> None:
    """Run torchforge ARGV and SIGKILL its whole process group the moment `point()` holds."""
    proc = _spawn(argv, log)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if point():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return
            time.sleep(0.002)
        pytest.fail(f"the kill point was never reached (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rerun(argv: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "torchforge.cli", *argv], env=cli_env(), cwd=ROOT,
                            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert_clean(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _listed(channel: Path, subdir: str = "linux-64") -> dict[str, dict[str, object]]:
    try:
        data = json.loads((channel / subdir / "repodata.json").read_text())
    except (OSError, ValueError):
        return {}
    return {**data.get("packages", {}), **data.get("packages.conda", {})}


def unindex(channel: Path, filename: str, subdir: str = "linux-64") -> None:
    """The channel's index without `filename`, the archive left where it is."""
    path = channel / subdir / "repodata.json"
    data = json.loads(path.read_text())
    for key in ("packages", "packages.conda"):
        data.get(key, {}).pop(filename, None)
    path.write_text(json.dumps(data))


def published_unindexed(channel: Path, filename: str) -> Callable[[], bool]:
    """The moment between the rename into the channel and the index naming it (the old orphan window)."""
    return lambda: (channel / "linux-64" / filename).exists() and filename not in _listed(channel)


def scratch_with(channel: Path, pattern: str) -> Callable[[], bool]:
    return lambda: any(True for _ in channel.glob(f"{fileops.SCRATCH_PREFIX}{pattern}"))


def assert_converged(channel: Path, filename: str, stub_channels: tuple[Path, ...] = ()) -> None:
    """Nothing left over, the file listed with its own sha256, and py-rattler solves it from the channel."""
    import hashlib

    assert not list(channel.rglob(SCRATCH)), list(channel.rglob(SCRATCH))
    assert not (channel / ".tmp").exists()
    path = channel / "linux-64" / filename
    record = _listed(channel)[filename]
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["size"] == path.stat().st_size
    name, version, build = localchannel.archive_stem(filename).rsplit("-", 2)
    urls = [channel.as_uri(), *(c.as_uri() for c in stub_channels)]
    records = solve(urls, [f"{name} =={version} {build}"], cache=channel.parent / f"gw-{time.time_ns()}")
    assert filename in {r.file_name for r in records}


@pytest.mark.slow
def test_upload_killed_mid_copy_of_a_big_package_then_rerun(big_package: Path, tmp_path: Path) -> None:
    chan = tmp_path / "chan"
    argv = ["upload", str(big_package), "--to", chan.as_uri()]
    # The 300 MiB copy runs in 8 MiB chunks: kill once the partial copy in the channel's scratch has data.
    kill_when(argv, lambda: any(p.stat().st_size > 0 for p in chan.glob(f"{SCRATCH}/{big_package.name}")),
              tmp_path / "killed.log")
    left = list(chan.glob(SCRATCH))
    assert left and not (chan / "linux-64" / big_package.name).exists()
    result = rerun(argv)
    assert "uploaded" in result.stdout and "verified: install from" in result.stdout
    assert_converged(chan, big_package.name)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["published-not-indexed", "during-verify"])
def test_upload_killed_then_rerun_converges(point: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    pkg = make_package(out / "linux-64", name="hello", version="2.13.0", build="py3.11_cpu_0")
    chan = tmp_path / "chan"
    argv = ["upload", "--from", str(out), "--to", chan.as_uri()]
    points = {
        "published-not-indexed": published_unindexed(chan, pkg.name),
        "during-verify": scratch_with(chan, "verify-*"),
    }
    kill_when(argv, points[point], tmp_path / "killed.log")
    result = rerun(argv)  # the default policy: a rerun must not fail with "already exists"
    assert pkg.name in result.stdout and "verified: install from" in result.stdout
    assert_converged(chan, pkg.name)


PY = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.mark.slow
@pytest.mark.parametrize(("point", "whom"), [("published-not-indexed", "process"), ("during-verify", "process"),
                                             ("during-verify", "group")])
def test_ctrl_c_is_a_message_and_exit_130_and_leaves_nothing(point: str, whom: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Files enough that py-rattler is still extracting them into the check's package cache when Ctrl-C comes
    # (before the fix its threads went on writing there while the folder was removed: exit 10, ENOTEMPTY).
    pkg = make_package(out / "linux-64", name="hello", version="2.13.0", build="py3.11_cpu_0",
                       extra_files=8000 if point == "during-verify" else 0)
    chan = tmp_path / "chan"
    argv = ["upload", "--from", str(out), "--to", chan.as_uri()]
    proc = _spawn(argv, tmp_path / "interrupted.log")
    try:
        deadline = time.monotonic() + 300
        interrupt_point = {
            "published-not-indexed": published_unindexed(chan, pkg.name),  # the index runs in a child process then
            "during-verify": scratch_with(chan, "verify-*/torchforge-verify-*/pkgs/*/share/hello/d020"),
        }[point]
        while proc.poll() is None and not interrupt_point() and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, (tmp_path / "interrupted.log").read_text()
        # What Ctrl-C sends: to the foreground process, or (a terminal's) to its whole process group.
        if whom == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == int(ExitCode.INTERRUPTED), (tmp_path / "interrupted.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (tmp_path / "interrupted.log").read_text()
    assert_clean(text)
    assert "interrupted; rerun the same command to resume" in text and "aborted" not in text
    assert not list(chan.glob(SCRATCH))  # an interrupted run cleans up after itself
    rerun(argv)
    assert_converged(chan, pkg.name)


@pytest.fixture(scope="module")
def python_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A channel with a stand-in python, for solving a repacked package with its dependency."""
    channel = tmp_path_factory.mktemp("python-stub")
    make_stub_channel(channel, [f"python >={PY},<{PY}.99"])
    return channel


@pytest.fixture(scope="module")
def torch_like_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    channel = tmp_path_factory.mktemp("stubs")
    make_stub_channel(channel, [*recipe_requirements(rendered_recipe()), "pip"])
    return channel


@pytest.mark.slow
@pytest.mark.parametrize("point", ["during-engine", "published-not-indexed"])
def test_build_killed_then_rerun_converges(point: str, torch_like_stubs: Path, tmp_path: Path) -> None:
    out = tmp_path / "forge"
    filename = f"{TORCH_LIKE_STEM}.conda"
    argv = ["build", *TORCH_LIKE_REQUEST, "--source", str(TORCH_LIKE), "--out", str(out),
            "--config", str(offline_site(torch_like_stubs)), "--skip-preflight"]
    points = {
        # The engine has written into its staging folder (beyond the owner lock file).
        "during-engine": lambda: any(p.name != ".owner" for p in out.glob(f"{SCRATCH.rstrip('*')}staging-*/*")),
        "published-not-indexed": published_unindexed(out, filename),
    }
    kill_when(argv, points[point], tmp_path / "killed.log")
    if point == "during-engine":
        assert list(out.glob(SCRATCH)), "the killed build's staging should be there for the rerun to remove"
    result = rerun(argv)
    if point == "published-not-indexed":  # the archive was complete: the rerun indexes and reuses it
        assert f"reuse {TORCH_LIKE_STEM}: already in" in result.stderr
    assert_converged(out, filename, (torch_like_stubs,))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["while-unpacking", "published-not-indexed"])
def test_repack_killed_then_rerun_converges(point: str, hello_wheel: Path, python_stub: Path, tmp_path: Path) -> None:
    chan = tmp_path / "chan"
    filename = f"pytorch-1.0-whl_py{sys.version_info.major}.{sys.version_info.minor}_cpu_0.conda"
    argv = ["repack", str(hello_wheel), "--out", str(chan)]
    if point == "while-unpacking":
        kill_when(argv, lambda: any(chan.glob(f"{SCRATCH.rstrip('*')}repack-*/torchforge-repack-*/pkg")),
                  tmp_path / "killed.log")
    else:
        # repack merges each record into the index in-process right after the rename (issue 35): microseconds,
        # which a poller catches only on a loaded machine. The state such a kill leaves is made instead: the
        # archive complete in the channel, the index without it.
        rerun(argv)
        unindex(chan, filename)
        assert (chan / "linux-64" / filename).is_file() and filename not in _listed(chan)
    result = rerun(argv)  # the same command, no --replace
    if point == "published-not-indexed":  # complete but unindexed: indexed by the rerun and reused
        assert "reused: already repacked from this wheel" in result.stdout
    assert_converged(chan, filename, (python_stub,))


def test_scratch_of_a_live_process_is_kept_and_of_a_killed_one_removed(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from torchforge import fileops\n"
            "with fileops.scratch(Path(sys.argv[1]), 'probe') as d:\n"
            "    (d / 'data').write_bytes(b'x' * 1000); print(d, flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=cli_env(), start_new_session=True)
    try:
        assert proc.stdout is not None
        folder = Path(proc.stdout.readline().strip())
        assert fileops.clean_stale(tmp_path) == [] and folder.is_dir()  # its owner lives: kept
        with fileops.scratch(tmp_path, "mine") as mine:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            assert fileops.clean_stale(tmp_path) == [folder]  # its owner died: removed; ours is kept
            assert mine.is_dir() and not folder.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert not list(tmp_path.glob(SCRATCH))


def test_a_scratch_folder_whose_removal_was_cut_short_is_removed_at_once(tmp_path: Path) -> None:
    """rmtree of a scratch folder can take its owner file and be killed before the folder goes (seen in CI:
    a `publish-` folder kept by the rerun of a build killed as it published). Only a `new-` folder, whose
    creator may be between mkdtemp and its owner file, gets the grace period."""
    cut_short = tmp_path / f"{fileops.SCRATCH_PREFIX}publish-abc123"
    (cut_short / "pkg").mkdir(parents=True)
    being_made = tmp_path / f"{fileops.SCRATCH_PREFIX}new-def456"
    being_made.mkdir()
    assert fileops.clean_stale(tmp_path) == [cut_short]
    assert being_made.is_dir() and not cut_short.exists()


def test_taking_the_lock_repairs_an_index_that_disagrees_with_the_folder(tmp_path: Path) -> None:
    """Both halves of a killed writer: an archive renamed in but not indexed, and one unlinked (promote --move,
    unpublish) before the index dropped it. The next writer's lock puts repodata.json right."""
    chan = tmp_path / "chan"
    kept = localchannel.publish(make_package(tmp_path / "a" / "linux-64", name="kept"), chan, "linux-64").path
    gone = localchannel.publish(make_package(tmp_path / "b" / "linux-64", name="gone"), chan, "linux-64").path
    gone.unlink()
    late = make_package(chan / "linux-64", name="late")  # complete, in place, not indexed
    (chan / ".tmp").mkdir()  # index_fs's scratch, left by a killed index
    assert set(_listed(chan)) == {kept.name, gone.name}
    with localchannel.locked(chan):
        pass
    assert set(_listed(chan)) == {kept.name, late.name}
    assert not (chan / ".tmp").exists()


def test_audit_killed_mid_extraction_leaves_nothing_after_the_rerun(big_package: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`rpath audit` of an archive extracts it into the user's private scratch root ($TMPDIR/torchforge-<uid>);
    a SIGKILL leaves that folder behind, and the next run that uses the root removes it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    root = tmp_path / f"torchforge-{os.getuid()}"
    extracting = lambda: any(p.is_dir() and any(p.iterdir()) for p in root.glob(f"{SCRATCH}audit-*/pkg"))  # noqa: E731
    kill_when(["rpath", "audit", str(big_package)], extracting, tmp_path / "killed.log")
    assert [p.name for p in root.iterdir()], "the killed audit left its scratch folder"
    rerun(["rpath", "audit", str(big_package)])
    assert list(root.iterdir()) == []
