"""`torchforge standin-channel` and `torchforge install`: the offline try-out of the README's quick start (which
tests/test_docs.py runs whole), and what each says when the input is wrong."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.errors import ExitCode

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
SELECTION = ["--pytorch", "2.9.0", "--cuda", "cpu", "--py", HERE, "--source", str(FIXTURE)]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    channel = tmp_path_factory.mktemp("tryout") / "standin"
    assert main(["standin-channel", *SELECTION, "--out", str(channel)]) == 0
    return channel


def test_the_standin_channel_satisfies_the_recipe_and_replaces_every_data_channel(standin: Path) -> None:
    names = {p.name for p in (standin / "linux-64").glob("*.conda")}
    # From the rendered 2.9.0 cpu recipe: its pins, the stand-in python of this machine, rattler-build's pip.
    assert {f"python-{HERE}-stub_0.conda", "pytorch-mutex-1.0-cpu.conda", "pip-1.0-stub_0.conda",
            "llvm-openmp-15.0-stub_0.conda"} <= names
    assert (standin / "linux-64" / "repodata.json").is_file() and (standin / "noarch" / "repodata.json").is_file()
    config = tomllib.loads((standin / "torchforge.toml").read_text())
    assert config == {"channels": {"replace": [f"file://{standin.resolve()}"]}}
    assert not list(standin.glob(".torchforge-tmp-*"))


def test_a_rerun_converges_to_the_same_channel(standin: Path) -> None:
    before = sorted(p.name for p in (standin / "linux-64").glob("*.conda"))
    assert main(["standin-channel", *SELECTION, "--out", str(standin)]) == 0
    assert sorted(p.name for p in (standin / "linux-64").glob("*.conda")) == before


def test_install_solves_into_a_new_prefix_whose_python_runs_there(standin: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "env"
    assert main(["install", "python", "--channel", str(standin), "--prefix", str(prefix)]) == 0
    assert f"python-{HERE}-stub_0" in capsys.readouterr().out
    result = subprocess.run([str(prefix / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and Path(result.stdout.strip()) == prefix


@pytest.mark.parametrize("case", ["not-a-channel", "prefix-not-empty", "unsolvable", "no-channel"])
def test_install_refuses_bad_input_with_what_would_work(case: str, standin: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    prefix, channel, spec = tmp_path / "env", str(standin), "python"
    if case == "not-a-channel":
        channel = str(tmp_path)
    elif case == "prefix-not-empty":
        prefix.mkdir()
        (prefix / "keep.txt").write_text("mine\n")
    elif case == "unsolvable":
        spec = "pytorch"  # the stand-in channel has pytorch's requirements, not pytorch
    argv = ["install", spec, "--prefix", str(prefix), *([] if case == "no-channel" else ["--channel", channel])]
    assert main(argv) == ExitCode.USAGE
    text = " ".join(capsys.readouterr().err.split())
    expected = {"not-a-channel": "is not a channel folder", "prefix-not-empty": "is not an empty folder",
                "unsolvable": "cannot be installed from", "no-channel": "--channel"}[case]
    assert expected in text and "Traceback" not in text
    if case == "prefix-not-empty":
        assert sorted(p.name for p in prefix.iterdir()) == ["keep.txt"]
    elif case != "no-channel":
        assert not prefix.exists()


def test_standin_channel_refuses_a_python_this_machine_lacks_and_a_file_as_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # PyTorch 2.9.0 takes Python 3.10-3.13 (pytorch.toml); with an empty PATH no other python is found, as on a machine without it.
    lacking = "3.10" if HERE != "3.10" else "3.12"
    monkeypatch.setenv("PATH", str(tmp_path))
    code = main(["standin-channel", "--pytorch", "2.9.0", "--cuda", "cpu", "--py", lacking, "--out", str(tmp_path / "s")])
    assert code == ExitCode.TOOL_MISSING and "--py X.Y" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    assert main(["standin-channel", *SELECTION, "--out", str(afile)]) == ExitCode.FILESYSTEM


@pytest.mark.parametrize("command", ["standin-channel", "install"])
def test_help_says_what_the_command_is_for(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("STAND-IN" in text) if command == "standin-channel" else ("conda create" in text)
