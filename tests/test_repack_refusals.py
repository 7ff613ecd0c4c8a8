"""`torchforge repack` refuses a wheel of a project it does not know how to repack (issue 25 item 1): a NumPy
or MarkupSafe wheel must never be published as `pytorch`. Exit 2, and nothing written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cached
from tests.test_adversarial import run_main
from torchforge.errors import ExitCode

# A real binary wheel of another project, small (about 20 kB) and built for this interpreter.
OTHER_PROJECT = "MarkupSafe==3.0.2"


@pytest.fixture(scope="session")
def foreign_wheel() -> Path:
    def download(dest: Path) -> None:
        subprocess.run([sys.executable, "-m", "pip", "download", OTHER_PROJECT, "--no-deps", "--only-binary=:all:",
                        "-d", str(dest), "--quiet"], check=True)

    wheels = sorted(cached("markupsafe-wheel", download).glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].name.startswith("MarkupSafe-3.0.2-cp"), wheels
    return wheels[0]


def test_a_wheel_of_another_project_is_refused_and_nothing_written(
        foreign_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chan = tmp_path / "chan"
    code, text = run_main(["repack", str(foreign_wheel), "--out", str(chan)], capsys)
    assert code == ExitCode.USAGE, text
    assert f"{foreign_wheel.name} is a wheel of 'MarkupSafe', which torchforge does not repack" in text
    assert "repack takes wheels of pytorch-triton, torch, torchaudio, torchvision, triton" in text
    assert not chan.exists()


def test_a_foreign_wheel_renamed_to_torch_is_refused_by_its_metadata(
        foreign_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    disguised = tmp_path / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    shutil.copy(foreign_wheel, disguised)
    chan = tmp_path / "chan"
    code, text = run_main(["repack", str(disguised), "--out", str(chan)], capsys)
    assert code == ExitCode.USAGE, text
    assert "is a wheel of 'MarkupSafe', which torchforge does not repack" in text
    assert not chan.exists()
