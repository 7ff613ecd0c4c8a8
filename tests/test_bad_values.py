"""Values no build can use are refused before anything runs (issue 25 item 4): exit 2, a message that says what
is wrong and what would work, and nothing written. `--jobs 99999` once hung the build forever (GNU make's
jobserver pipe filled), and a build number beyond what the engines read failed after other packages were built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_torch_like import FIXTURE
from torchforge.cli import main

BUILD = ["build", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11", "--source", str(FIXTURE)]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return " ".join(capsys.readouterr().err.split())


def test_jobs_beyond_what_the_machine_can_run_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "forge"
    # In a child with a time limit: before the fix this build hung forever.
    result = subprocess.run([sys.executable, "-m", "torchforge.cli", *BUILD, "--jobs", "99999", "--out", str(out),
                             "--skip-preflight"], capture_output=True, text=True, timeout=300)
    message = " ".join(result.stderr.split())
    assert result.returncode == 2, message
    cores = os.cpu_count() or 1
    assert "--jobs 99999" in message and f"{cores} cores" in message and "leave --jobs out" in message, message
    assert not out.exists()


@pytest.fixture(scope="module")
def standin_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in channel for the cpu 3.11 recipes and the config that uses it instead of every real channel, so
    no network decides doctor's channel checks."""
    channel = tmp_path_factory.mktemp("standin") / "channel"
    assert main(["standin-channel", "--cuda", "cpu", "--py", "3.11", "--out", str(channel)]) == 0
    return channel / "torchforge.toml"


@pytest.mark.parametrize("command", [["doctor"], ["build", "--dry-run"]])
def test_doctor_and_a_dry_run_refuse_the_same_jobs(command: list[str], standin_config: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused([*command, "--cuda", "cpu", "--py", "3.11", "--jobs", "99999", "--out", str(tmp_path / "o")],
                       capsys)
    assert "--jobs 99999" in message
    # a reasonable value passes: exactly 0 (a failure of another kind, a crash (70) included, fails here)
    code = main([*command, "--cuda", "cpu", "--py", "3.11", "--jobs", "1", "--out", str(tmp_path / "o"),
                 "--config", str(standin_config)])
    captured = capsys.readouterr()
    assert code == 0, captured.out[-3000:] + captured.err[-3000:]


@pytest.mark.parametrize(("value", "why"), [("abc", "a whole number"), ("0", "a whole number"), ("-3", "a whole number"),
                                            ("1.5", "a whole number"), ("99999", "cores")])
def test_env_max_jobs_is_checked_like_jobs(value: str, why: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "forge"
    message = _refused([*BUILD, "--env", f"MAX_JOBS={value}", "--out", str(out), "--skip-preflight"], capsys)
    assert f"MAX_JOBS={value}" in message and why in message, message
    assert not out.exists()


def test_jobs_and_env_max_jobs_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused([*BUILD, "--jobs", "1", "--env", "MAX_JOBS=2", "--out", str(tmp_path / "o"), "--dry-run"],
                       capsys)
    assert "disagree" in message


@pytest.mark.parametrize("command", [["build", "--dry-run"], ["render", "--out", "recipes"], ["matrix"]])
def test_a_build_number_beyond_what_the_engines_read_is_refused(command: list[str], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    message = _refused([*command, "--cuda", "cpu", "--py", "3.11", "--build-number", str(2**64)], capsys)
    assert "--build-number 18446744073709551616" in message and "18446744073709551615" in message, message
    assert not (tmp_path / "recipes").exists()
    assert main([*command, "--cuda", "cpu", "--py", "3.11", "--build-number", str(2**64 - 1)]) == 0


def test_repack_refuses_a_negative_or_too_large_build_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = tmp_path / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    for number in ("-1", str(2**64)):
        assert main(["repack", str(wheel), "--out", str(tmp_path / "ch"), "--build-number", number]) == 2
        assert "--build-number" in capsys.readouterr().err
    assert not (tmp_path / "ch").exists()
