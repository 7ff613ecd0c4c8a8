"""An extension's SPEC to a checked local sdist and its metadata in conda names (torchforge/extensions), on the
real PyPI sdists of causal-conv1d 1.7.0, mamba-ssm 2.3.2.post1 and torch-scatter 2.1.2 (tests/fixtures/sdists),
with pip in a venv where the CPU torch 2.13.0 is importable (tests/tool_venvs.py `torchcpu`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.hostile import CLIMB, Member, hostile_tarball
from tests.tool_venvs import ensure
from torchforge.errors import ArchiveError, ToolFailedError, UsageError
from torchforge.extensions.metadata import read_metadata, switches, to_conda
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.proc import Runner

SDISTS = Path(__file__).parent / "fixtures" / "sdists"
CAUSAL = SDISTS / "causal_conv1d-1.7.0.tar.gz"
MAMBA = SDISTS / "mamba_ssm-2.3.2.post1.tar.gz"
SCATTER = SDISTS / "torch_scatter-2.1.2.tar.gz"


@pytest.fixture(scope="module")
def torch_python() -> str:
    return str(ensure("torchcpu") / "python")


def resolved(spec: str, tmp_path: Path, python: str) -> Path:
    return fetch(parse_spec(spec), tmp_path / "sdist", python, Runner())


def test_causal_conv1d_archive_requirements_in_conda_names(tmp_path: Path, torch_python: str) -> None:
    archive = resolved(str(CAUSAL), tmp_path, torch_python)
    meta = read_metadata(archive, torch_python, Runner(), tmp_path)
    assert (meta.name, meta.version, meta.conda_name) == ("causal_conv1d", "1.7.0", "causal-conv1d")
    assert to_conda(meta.requires, "3.11", drop=True) == ("packaging", "ninja")  # torch: pinned exactly instead
    assert to_conda(meta.build_requires, "3.11", drop=False) == ("setuptools", "wheel")


def test_mamba_requirements_mapped_and_extras_left_out(tmp_path: Path, torch_python: str) -> None:
    meta = read_metadata(resolved(str(MAMBA), tmp_path, torch_python), torch_python, Runner(), tmp_path)
    run = to_conda(meta.requires, "3.11", drop=True)
    # setuptools stays (its dist-info requires it: `pip check` fails without it); extras: not run deps
    assert run == ("tilelang ==0.1.8", "apache-tvm-ffi <=0.1.9", "quack-kernels >=0.3.4", "triton >=3.5.0", "ninja",
                   "einops", "transformers", "packaging", "setuptools >=61.0.0")
    assert to_conda(meta.build_requires, "3.11", drop=False) == ("setuptools >=61.0.0", "wheel", "packaging", "ninja")


def test_a_setup_py_only_sdist_builds_with_setuptools_and_wheel(tmp_path: Path, torch_python: str) -> None:
    meta = read_metadata(resolved(str(SCATTER), tmp_path, torch_python), torch_python, Runner(), tmp_path)
    assert (meta.name, meta.version, meta.requires, meta.build_requires) == (
        "torch_scatter", "2.1.2", ('pytest; extra == "test"', 'pytest-cov; extra == "test"'), ("setuptools", "wheel"))
    assert to_conda(meta.requires, "3.11", drop=True) == ()


# PyPI's sha256 of the sdist (tests/fixtures/sdists/README.md, as https://pypi.org/simple/torch-scatter/ lists it)
SCATTER_SHA256 = "69b3aa435f2424ac6a1bfb6ff702da6eb73b33ca0db38fb26989c74159258e47"


def local_index(root: Path, sha256: str) -> str:
    """PyPI's simple page of torch-scatter, its one sdist entry served from a local folder (PEP 503: the project's
    page lists each file with its `#sha256=`): pip's configuration names this index alone."""
    (root / "torch-scatter").mkdir(parents=True)
    shutil.copy(SCATTER, root / SCATTER.name)
    (root / "torch-scatter" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../{SCATTER.name}#sha256={sha256}">{SCATTER.name}</a>'
        '<a href="../torch_scatter-2.1.1.tar.gz#sha256=00">torch_scatter-2.1.1.tar.gz</a></body></html>\n')
    return root.as_uri()


@pytest.fixture()
def only_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """pip's own configuration set aside (no file, no PIP_* variable), so the index below is the only one."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return tmp_path / "simple"


def test_name_and_version_resolved_on_the_package_index(only_index: Path, tmp_path: Path, torch_python: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The indexes pip's own configuration names (here one local index): the real sdist comes back, checked
    against the index's sha256, downloaded without pip preparing (running) it and without the network."""
    monkeypatch.setenv("PIP_INDEX_URL", local_index(only_index, SCATTER_SHA256))
    archive = resolved("torch-scatter==2.1.2", tmp_path, torch_python)
    assert archive.name == SCATTER.name and archive.read_bytes() == SCATTER.read_bytes()
    with pytest.raises(UsageError, match=f"no sdist of torch-scatter 2.1.3 on {only_index.as_uri()}"):
        resolved("torch-scatter==2.1.3", tmp_path / "other", torch_python)


def test_an_sdist_whose_bytes_differ_from_the_index_is_refused(only_index: Path, tmp_path: Path, torch_python: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", local_index(only_index, "0" * 64))
    with pytest.raises(ToolFailedError, match=f"has sha256 {SCATTER_SHA256}, the index says 0000"):
        resolved("torch-scatter==2.1.2", tmp_path, torch_python)
    assert not list((tmp_path / "sdist").iterdir())  # nothing half-written left


def test_a_folder_and_a_git_revision_become_archives(tmp_path: Path, torch_python: str) -> None:
    with tarfile.open(SCATTER) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    tree = tmp_path / "src" / "torch_scatter-2.1.2"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(tree)]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "import"], ["tag", "v2.1.2"]):
        subprocess.run([*git, *argv], check=True)
    (tree / "untracked.txt").write_text("not in the git archive\n")
    packed = resolved(str(tree), tmp_path / "a", torch_python)
    assert read_metadata(packed, torch_python, Runner(), tmp_path).version == "2.1.2"
    with tarfile.open(packed) as tar:
        names = tar.getnames()
    assert "torch_scatter-2.1.2/untracked.txt" in names and not any("/.git/" in n for n in names)
    from_git = resolved(f"git+file://{tree}@v2.1.2", tmp_path / "b", torch_python)
    with tarfile.open(from_git) as tar:
        names = tar.getnames()
    assert "torch_scatter-2.1.2/setup.py" in names and "torch_scatter-2.1.2/untracked.txt" not in names
    assert read_metadata(from_git, torch_python, Runner(), tmp_path).name == "torch_scatter"


def test_an_sdist_with_a_member_outside_its_folder_is_refused(tmp_path: Path, torch_python: str) -> None:
    bad = hostile_tarball(tmp_path / "evil-1.0.tar.gz", "evil-1.0", {"setup.py": b"import setuptools\n"},
                          (Member(CLIMB + "tmp/evil.txt"),))
    with pytest.raises(ArchiveError, match="climbs out of its folder"):
        resolved(str(bad), tmp_path, torch_python)


@pytest.mark.parametrize(("spec", "why"), [
    ("torch-scatter", "not NAME==VERSION"),
    ("./missing-1.0.tar.gz", "no such file or folder"),
    ("git+https://example.invalid/repo.git", "needs a revision"),
    ("git+ssh://git@example.invalid/repo", "needs a revision"),
])
def test_a_spec_torchforge_cannot_read_says_what_would_work(spec: str, why: str) -> None:
    with pytest.raises(UsageError, match=why) as caught:
        parse_spec(spec)
    assert "NAME==VERSION" in str(caught.value)


def test_the_packages_own_switches_come_from_the_data() -> None:
    """The switches that turn off the prebuilt-wheel download (setup.py:43 of causal-conv1d 1.7.0, setup.py:41
    of mamba-ssm 2.3.2.post1) and the CUDA checks while pip reads the metadata."""
    assert switches("causal_conv1d").build_env == (("CAUSAL_CONV1D_FORCE_BUILD", "TRUE"),)
    assert switches("mamba-ssm").build_env == (("MAMBA_FORCE_BUILD", "TRUE"),)
    assert switches("torch-scatter").build_env == ()
    for sdist, variable in ((CAUSAL, "CAUSAL_CONV1D_FORCE_BUILD"), (MAMBA, "MAMBA_FORCE_BUILD")):
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/setup.py"))
            text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
        assert f'os.getenv("{variable}", "FALSE") == "TRUE"' in text
    assert shutil.which("git")


def test_torch_scatter_builds_its_cuda_kernels_in_a_cuda_build_only() -> None:
    """torch-scatter 2.1.2 compiles its CUDA kernels only where torch sees a GPU, unless FORCE_CUDA is '1'
    (setup.py:21 of the real sdist): set for CUDA builds, never for CPU ones."""
    assert switches("torch-scatter").cuda_env == (("FORCE_CUDA", "1"),)
    assert switches("torch-scatter").build_env == () and switches("causal-conv1d").cuda_env == ()
    with tarfile.open(SCATTER) as tar:
        text = tar.extractfile("torch_scatter-2.1.2/setup.py").read().decode()  # type: ignore[union-attr]
    lines = text.splitlines()
    assert lines[20] == "if os.getenv('FORCE_CUDA', '0') == '1':" and lines[21].strip() == "suffices = ['cuda', 'cpu']"
