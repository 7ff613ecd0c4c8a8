"""Every --extension SPEC is read before anything is planned, and a SPEC that cannot be one is a usage error (exit 2)
saying what would work (issue 40 items 2-5, 11): `matrix` and `build --dry-run` as a user types them, with the
real torch-scatter 2.1.2 sdist and sdists laid out as setuptools writes them."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.test_upload_helpers import cli
from torchforge.errors import UsageError
from torchforge.extensions.plan import planned_source
from torchforge.extensions.sdist import parse_spec
from torchforge.proc import Runner

SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
MATRIX = ("matrix", "--json", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--flavour", "official")


def sdist_named(folder: Path, name: str, stem: str = "renamed-1.0") -> Path:
    """torch-scatter 2.1.2's real files under `stem`/, its PKG-INFO's Name replaced by `name`."""
    archive = folder / f"{stem}.tar.gz"
    with tarfile.open(SCATTER) as source, tarfile.open(archive, "w:gz") as out:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name == "torch_scatter-2.1.2/PKG-INFO":
                data = data.decode().replace("Name: torch_scatter", f"Name: {name}", 1).encode()
            member.name = member.name.replace("torch_scatter-2.1.2", stem, 1)
            member.size = len(data)
            out.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return archive


def refused(*specs: str, cwd: Path | None = None, dry_build: Path | None = None) -> str:
    args = (("build", "--dry-run", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--out", str(dry_build))
            if dry_build else MATRIX)
    done = cli(*args, *(a for spec in specs for a in ("--extension", spec)), cwd=cwd)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "build plan" not in done.stderr  # refused before anything is planned
    return " ".join(done.stderr.split())


def test_an_empty_spec_is_a_usage_error_and_packs_nothing(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("raise SystemExit('never read')\n")  # the folder it would have packed
    assert "an empty SPEC names no source" in refused("", cwd=tmp_path)
    with pytest.raises(UsageError, match="an empty SPEC names no source"):
        parse_spec("  ")


def test_a_folder_that_is_not_a_source_tree_is_not_packed(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "hostname").write_text("box\n")
    text = refused(str(etc))
    assert f"the folder {etc} is not a Python source tree (no pyproject.toml, setup.py, PKG-INFO in it)" in text
    assert "NAME==VERSION" in text


def test_a_name_that_is_not_a_package_name_is_refused_before_it_names_anything(tmp_path: Path) -> None:
    sdist = sdist_named(tmp_path, "a; rm -rf / #")
    text = refused(str(sdist), dry_build=tmp_path / "out")
    assert "'a; rm -rf / #' is not a package name (PEP 508" in text
    assert "recipes/" not in text and not (tmp_path / "out").exists()


def test_the_stacks_own_packages_are_not_extensions(tmp_path: Path) -> None:
    text = refused("torch==2.13.0")
    assert "torch is one of the stack's own packages, not an extension" in text and "--with" in text
    local = sdist_named(tmp_path, "pytorch", "pytorch-2.13.0")
    for spec in ("pytorch==2.13.0", "libtorch==2.13.0", "torchvision==0.28.0", "torchaudio==2.11.0", "triton==3.5.0",
                 "nvidia-cublas-cu12==12.8.4.1", "cuda-cudart==12.8.90", "TorchVision==0.28.0", "Triton==3.5.0", str(local)):
        with pytest.raises(UsageError, match="is one of the stack's own packages"):
            planned_source(parse_spec(spec), Runner())
    assert planned_source(parse_spec("torch-scatter==2.1.2"), Runner()).name == "torch-scatter"  # one of theirs


def test_two_sources_of_one_package_are_refused(tmp_path: Path) -> None:
    text = refused("torch-scatter==2.1.2", str(SCATTER))
    assert f"--extension '{SCATTER}' and --extension 'torch-scatter==2.1.2' are both torch-scatter 2.1.2" in text
    assert "are both torch-scatter 2.1.2" in refused(str(SCATTER), str(SCATTER))


def test_a_git_source_that_cannot_be_archived_names_the_url_and_revision(tmp_path: Path) -> None:
    missing = f"git+file://{tmp_path}/no-such-repo.git@v2.1.2"
    text = refused(missing)
    assert f"git cannot archive revision 'v2.1.2' of file://{tmp_path}/no-such-repo.git" in text
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "setup.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    assert "git cannot archive revision 'v9.9' of" in refused(f"git+file://{repo}@v9.9")


def test_a_git_revision_or_url_that_git_would_read_as_an_option_is_refused() -> None:
    assert "the git revision '--output=/tmp/x' starts with '-'" in refused("git+file:///srv/repo.git@--output=/tmp/x")
    with pytest.raises(UsageError, match="the git URL '--upload-pack=touch' starts with '-'"):
        parse_spec("git+--upload-pack=touch@v1")
