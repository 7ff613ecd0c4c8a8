"""`torchforge standin-channel` and `torchforge install`: the offline try-out of the README's quick start (which
tests/test_docs.py runs whole), and what each says when the input is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.rattler_in_child import channel_records, specs_without_a_match
from torchforge.cli import main
from torchforge.errors import ExitCode

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
# 2.9.0 builds the conda-forge flavour by default: these tests are about the official flavour's stand-ins.
SELECTION = ["--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", HERE, "--source", str(FIXTURE)]


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


@pytest.mark.parametrize("flavour", ["official", "conda-forge"])
def test_standin_channel_refuses_a_python_this_machine_lacks_and_a_file_as_out(
        flavour: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # PyTorch 2.9.0 takes Python 3.10-3.13 (pytorch.toml, conda_forge.toml); with an empty PATH no other python is
    # found, as on a machine without it.
    lacking = "3.10" if HERE != "3.10" else "3.12"
    monkeypatch.setenv("PATH", str(tmp_path))
    code = main(["standin-channel", "--pytorch", "2.9.0", "--flavour", flavour, "--cuda", "cpu", "--py", lacking,
                 "--out", str(tmp_path / "s")])
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


# ---- the conda-forge flavour (the default for 2.6+) ----------------------------------------------------------

SPLIT = Path(__file__).parent / "fixtures" / "torch_split"
CUDA = ["--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", HERE]


@pytest.fixture(scope="module")
def flavour_standin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    channel = tmp_path_factory.mktemp("tryout-cf") / "standin"
    import contextlib
    import io

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(["standin-channel", *CUDA, "--out", str(channel)]) == 0
    return channel, stderr.getvalue()


def test_for_2_6_and_later_the_stand_ins_follow_builds_flavour_and_satisfy_every_rendered_requirement(
        flavour_standin: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    from torchforge import sequence
    from torchforge.flavours import Request
    from torchforge.standin import plan_requirements

    channel, _ = flavour_standin
    records = channel_records(channel)
    names = {r.name for r in records}
    # conda-forge's names (cuDNN, NCCL, MAGMA and what their -dev packages bring), none of the official flavour's
    assert {"libcudnn-dev", "libcudnn", "nccl", "libmagma-devel", "libmagma", "cuda-version", "python", "pip"} <= names
    assert not names & {"pytorch-mutex", "magma-cuda130", "pytorch", "libtorch", "pytorch-gpu"}
    # every requirement rattler-build renders for the recipe is satisfied by a package of the channel
    the_plan = sequence.plan("conda-forge", Request("2.13.0", "13.0", HERE, "linux-64", "9.0"), "rattler-build")
    assert specs_without_a_match(channel, plan_requirements(the_plan)) == []
    assert tomllib.loads((channel / "torchforge.toml").read_text()) == {
        "channels": {"replace": [f"file://{channel.resolve()}"]}}
    assert not list(channel.glob(".torchforge-tmp-*"))


def test_conda_forge_stand_ins_carry_their_sonames_and_run_exports(flavour_standin: tuple[Path, str],
                                                                   tmp_path: Path) -> None:
    from conda_package_streaming import package_streaming

    from torchforge import elf

    channel, _ = flavour_standin
    (cudnn,) = (channel / "linux-64").glob("libcudnn-9*.conda")
    files = {m.name: tar.extractfile(m).read() for tar, m in package_streaming.stream_conda_component(str(cudnn))
             if m.isfile()}
    library = tmp_path / "libcudnn.so.9"
    library.write_bytes(files["lib/libcudnn.so.9"])
    assert elf.read_elf(library).soname == "libcudnn.so.9"
    (dev,) = (channel / "linux-64").glob("libcudnn-dev-9*.conda")
    exports = next(json.loads(tar.extractfile(m).read()) for tar, m in
                   package_streaming.stream_conda_component(str(dev), component="info") if m.name == "info/run_exports.json")
    assert exports == {"weak": ["libcudnn >=9,<10.0a0"]}


def test_standin_channel_says_which_flavour_and_that_these_are_stand_ins(flavour_standin: tuple[Path, str]) -> None:
    _, stderr = flavour_standin
    text = " ".join(stderr.split())
    assert "flavour conda-forge: PyTorch 2.13.0 published no official conda package" in text
    assert "STAND-IN package(s)" in text and "NOT the real ones" in text and "conda-forge flavour" in text


@pytest.mark.parametrize("argv, official", [(["--pytorch", "2.13.0", "--flavour", "official"], True),
                                            (["--pytorch", "2.9.0"], False), (["--pytorch", "2.5.1"], True)])
def test_the_flavour_is_chosen_as_build_chooses_it(argv: list[str], official: bool, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["standin-channel", *argv, "--cuda", "cpu", "--py", HERE, "--out", str(tmp_path / "s")]) == 0
    names = {r.name for r in channel_records(tmp_path / "s")}
    assert ("pytorch-mutex" in names) is official  # the official flavour's cpu recipe requires it; conda-forge's none
    assert ("mkl-devel" in names) is not official  # conda-forge's cpu libtorch builds with MKL from conda-forge
    assert f"flavour {'official' if official else 'conda-forge'}" in capsys.readouterr().err


def test_the_stand_ins_are_for_the_platform_of_the_build_and_none_for_a_platform_it_does_not_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["standin-channel", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", HERE]
    assert main([*argv, "--platform", "linux-aarch64", "--out", str(tmp_path / "arm")]) == 0
    assert sorted(p.name for p in (tmp_path / "arm").iterdir() if p.is_dir()) == ["linux-aarch64", "noarch"]
    index = json.loads((tmp_path / "arm" / "linux-aarch64" / "repodata.json").read_text())
    assert {r["subdir"] for r in index["packages.conda"].values()} == {"linux-aarch64"}
    capsys.readouterr()
    assert main([*argv, "--platform", "win-64", "--out", str(tmp_path / "win")]) == ExitCode.USAGE
    refusal = " ".join(capsys.readouterr().err.split())  # build's refusal (it builds on linux), for the stand-ins too
    assert "(it builds on linux): there is no build to stand in for" in refusal and not (tmp_path / "win").exists()


def test_a_run_killed_while_writing_leaves_nothing_and_the_rerun_converges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchforge import standin

    real, calls = standin.write_stub, []

    def interrupted(stub, out_dir, subdir=standin.SUBDIR):
        calls.append(stub.name)
        if len(calls) == 5:
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of writing the packages
        return real(stub, out_dir, subdir)

    monkeypatch.setattr(standin, "write_stub", interrupted)
    out = tmp_path / "standin"
    argv = ["standin-channel", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", HERE, "--out", str(out)]
    assert main(argv) == ExitCode.INTERRUPTED
    # no package, no index, no config, no scratch folder: only the channel's lock file, which every writer keeps
    assert [p.name for p in out.rglob("*")] == [".torchforge.lock"]
    monkeypatch.setattr(standin, "write_stub", real)
    assert main(argv) == 0 and (out / "torchforge.toml").is_file()
    first = sorted(p.name for p in (out / "linux-64").glob("*.conda"))
    assert main(argv) == 0 and sorted(p.name for p in (out / "linux-64").glob("*.conda")) == first


@pytest.mark.slow
def test_built_against_the_written_channel_installed_and_imported_with_cudnn_from_the_prefix(
        flavour_standin: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CUDA case of the README's quick start (which runs the cpu one): `standin-channel`, `build` with its
    config (the embedded engine), `install` of the metapackage with a driver (CONDA_OVERRIDE_CUDA: this machine has
    none), import with nothing on LD_LIBRARY_PATH."""
    import os
    import shutil

    channel, _ = flavour_standin
    source = Path(shutil.copytree(SPLIT, tmp_path / "torch_split", ignore=shutil.ignore_patterns("build", "*.egg-info")))
    out = tmp_path / "my-channel"
    assert main(["build", *CUDA, "--source", str(source), "--engine", "rattler-build", "--config",
                 str(channel / "torchforge.toml"), "--out", str(out)]) == 0, capsys.readouterr().err[-4000:]
    monkeypatch.setenv("CONDA_OVERRIDE_CUDA", "13.0")
    prefix = tmp_path / "env"
    capsys.readouterr()
    assert main(["install", "pytorch-gpu", "--channel", str(out), "--channel", str(channel), "--prefix", str(prefix)]) == 0
    installed = capsys.readouterr().out
    for name in ("pytorch-gpu-2.13.0-cuda130_", "pytorch-2.13.0-cuda130_", "libtorch-2.13.0-cuda130_", "libcudnn-9-",
                 "nccl-2", "libmagma-"):
        assert name in installed, (name, installed)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = ("import torch; print(torch.__version__, torch.ones_sum(3), torch.cuda_built()); "
             "print([l.split()[-1] for l in open('/proc/self/maps') if 'libcudnn.so.9' in l][0])")
    done = subprocess.run([str(prefix / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    version, cudnn = done.stdout.splitlines()
    assert version == "2.13.0 3.0 True" and Path(cudnn).resolve().parent == (prefix / "lib").resolve()
    # without a driver the same channel offers no CUDA build: the solver says so
    monkeypatch.setenv("CONDA_OVERRIDE_CUDA", "")
    assert main(["install", "pytorch-gpu", "--channel", str(out), "--channel", str(channel),
                 "--prefix", str(tmp_path / "none")]) == ExitCode.USAGE


# ---- --for and --extension: the stand-ins of an extension's build for a pytorch a channel has (README's block) ----

SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
FOR = "pytorch ==2.13.0 whl_*"


@pytest.fixture(scope="module")
def repacked_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A channel holding a pytorch named, indexed and pinned as `torchforge repack` writes the torch 2.13.0 CPU
    wheel for this machine's Python (planning reads only its record)."""
    from tests.pkgfactory import make_package
    from torchforge.localchannel import index

    channel = tmp_path_factory.mktemp("repacked") / "torch-channel"
    nodot_next = f"{sys.version_info.major}.{sys.version_info.minor + 1}"
    make_package(channel / "linux-64", name="pytorch", version="2.13.0", build=f"whl_py{HERE}_cpu_0",
                 depends=(f"python >={HERE},<{nodot_next}.0a0", "filelock", "networkx >=2.5.1", "sympy >=1.13.3"))
    index(channel)
    return channel


def test_standin_channel_for_a_channels_pytorch_stands_in_for_its_requirements_and_its_extension(
        repacked_like: Path, tmp_path: Path) -> None:
    """`standin-channel --for SPEC --channel CH --extension SDIST`: what that pytorch requires (at the versions it
    asks: networkx >=2.5.1) and what the extension's recipe installs, for the pytorch's Python; a package built
    against the stand-in python (it requires the python_abi that python exports) installs beside it. Before,
    standin-channel had no --for: the stand-ins were the quick start's (networkx 1.0, which the repacked pytorch
    refuses), and its python_abi refused its own python (`python 3.11.* *_cpython` against python-3.11-stub_0)."""
    out = tmp_path / "standin-ext"
    done = subprocess.run([sys.executable, "-m", "torchforge.cli", "standin-channel", "--for", FOR, "--channel",
                           str(repacked_like), "--extension", str(SCATTER), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = channel_records(out)
    names = {r.name: r for r in records}
    assert {"python", "filelock", "networkx", "sympy", "setuptools", "wheel", "pip"} <= set(names), sorted(names)
    assert "pytorch" not in names  # the channel's own
    assert names["networkx"].version == "2.5.1"
    said = " ".join(done.stderr.split())
    assert f"for the requirements of pytorch-2.13.0-whl_py{HERE}_cpu_0" in said and "STAND-IN" in said
    assert f"build with --channel {out}" in said
    from torchforge.prefix import install
    installed = install(["python", f"python_abi {HERE}.* *_cp{HERE.replace('.', '')}", "pytorch"],
                        [str(out), str(repacked_like)], tmp_path / "prefix")
    assert any("pytorch" in line for line in installed.packages), installed.packages


def test_the_wheel_of_an_extensions_stand_ins_builds_wheels_with_this_machines_setuptools(
        repacked_like: Path, tmp_path: Path) -> None:
    """torch-scatter's recipe installs setuptools and wheel: the stand-in python imports this machine's setuptools,
    which before 70.1 has no bdist_wheel without the `wheel` project. The channel's `wheel` then is the real one
    (before: an empty stand-in, and the build failed with "invalid command 'bdist_wheel'"): in a prefix of the
    channel, setuptools finds the command."""
    from torchforge.extensions.standins import BUILDS_WHEELS
    from torchforge.prefix import install

    out = tmp_path / "standin-ext"
    done = subprocess.run([sys.executable, "-m", "torchforge.cli", "standin-channel", "--for", FOR, "--channel",
                           str(repacked_like), "--extension", str(SCATTER), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    install(["python", "setuptools", "wheel"], [str(out)], tmp_path / "prefix")
    ran = subprocess.run([str(tmp_path / "prefix" / "bin" / "python"), "-c", BUILDS_WHEELS + "\nimport setuptools\n"
                          "from setuptools.dist import Distribution\n"
                          "assert Distribution().get_command_class('bdist_wheel')\n"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]


@pytest.mark.parametrize("args, says, works", [
    (["--extension", "torch==2.13.0"], "torch is one of the stack's own packages, not an extension", "--with"),
    (["--extension", str(SCATTER), "--extension", "torch-scatter==2.1.2"], "are both torch-scatter 2.1.2",
     "keep the one source"),
    (["--channel", "CHANNEL", "--extension", str(SCATTER)], "--channel says where --for's pytorch is", "add --for SPEC"),
    (["--for", "pytorch ==9.9.9", "--channel", "CHANNEL", "--extension", str(SCATTER)], "pytorch ==9.9.9", ""),
])
def test_standin_channel_refuses_an_extension_build_does_not_make_and_says_what_would_work(
        args: list[str], says: str, works: str, repacked_like: Path, tmp_path: Path) -> None:
    """Each refused before anything is written, exit 2, no traceback (before: `--extension torch==2.13.0` and two
    SPECs of one package wrote a channel without a word, and build refused them only afterwards)."""
    selection = [] if "--for" in args or "--channel" in args else ["--pytorch", "2.13.0", "--cuda", "cpu", "--py", HERE]
    argv = [a.replace("CHANNEL", str(repacked_like)) for a in args]
    done = subprocess.run([sys.executable, "-m", "torchforge.cli", "standin-channel", *selection, *argv, "--out",
                           str(tmp_path / "s")], capture_output=True, text=True)
    said = " ".join(done.stderr.split())
    assert done.returncode == ExitCode.USAGE and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert says in said and works in said and "what would work" in said, said
    assert not (tmp_path / "s").exists()
