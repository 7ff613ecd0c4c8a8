"""Requirements brought along (issue 38's dependency closure), typed as a user types them: a channel's pytorch
requires sortedcollections, which no channel of the build provides (nor conda-forge, as far as
torchforge/data/conda_forge_names.toml knows); its wheel, and that of sortedcontainers it requires in turn, are in
a folder of real PyPI wheels (tests/fixtures/wheels, served with `--wheels DIR`: pip --find-links, no index), so the
plan repacks both into --out before anything builds. Without the wheel, the build is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.test_conda_forge_split import python_folder
from tests.test_have_pytorch import _steps
from tests.test_upload_helpers import cli
from torchforge.localchannel import index

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "tests" / "fixtures" / "wheels"
FOR = "pytorch ==2.13.0 whl_*"
PYTORCH = "pytorch-2.13.0-whl_py3.12_cpu_0"
BROUGHT = ["sortedcollections-2.1.0-whl_py3.12_0", "sortedcontainers-2.4.0-whl_py3.12_0"]


@pytest.fixture
def channel(tmp_path: Path) -> Path:
    """A pytorch package (named as `repack` names the torch 2.13.0 CPU wheel) requiring python, filelock and
    sortedcollections; the channel has python and filelock."""
    folder = tmp_path / "chan"
    make_package(folder / "linux-64", name="pytorch", version="2.13.0", build="whl_py3.12_cpu_0",
                 depends=("python >=3.12,<3.13.0a0", "filelock", "sortedcollections >=2"))
    make_package(folder / "linux-64", name="python", version="3.12.0", build="h0123456_0")
    make_package(folder / "noarch", name="filelock", version="3.0", build="pyhd8ed1ab_0", subdir="noarch")
    index(folder)
    return folder


def _build(channel: Path, out: Path, tmp_path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    # XDG_CACHE_HOME: the wheels pip takes are kept under the test's folder, not the user's cache
    return cli("build", "--for", FOR, "--channel", str(channel), "--out", str(out), *more,
               env={**os.environ, "COLUMNS": "400", "XDG_CACHE_HOME": str(tmp_path / "cache")})


def _names(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "linux-64").glob("*.conda")}


def test_a_requirement_and_its_own_are_brought_along_and_install(channel: Path, tmp_path: Path) -> None:
    """The dry run plans both packages as rows, before any build, and writes nothing into --out; the build repacks
    them into --out; `torchforge install` puts them into a fresh prefix next to the channel, and this machine's
    Python imports them from it. Before: refused ("requirements no channel of the build provides")."""
    out = tmp_path / "out"
    done = _build(channel, out, tmp_path, "--dry-run", "--wheels", str(WHEELS))
    assert done.returncode == 0, done.stderr
    assert _steps(done.stdout + done.stderr) == BROUGHT, done.stderr
    assert not out.exists()
    rows = json.loads(cli("matrix", "--for", FOR, "--channel", str(channel), "--wheels", str(WHEELS), "--json",
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}).stdout)
    assert [(r["kind"], r["file"]) for r in rows[1:]] == [("requirement", stem) for stem in BROUGHT], rows
    done = _build(channel, out, tmp_path, "--wheels", str(WHEELS), "--skip-preflight")
    assert done.returncode == 0, done.stderr
    assert sorted(_names(out)) == [f"{stem}.conda" for stem in BROUGHT]
    records = json.loads((out / "linux-64" / "repodata.json").read_text())["packages.conda"]
    depends = {r["name"]: r["depends"] for r in records.values()}
    assert depends["sortedcollections"] == ["python >=3.12,<3.13.0a0", "sortedcontainers"], depends
    prefix = tmp_path / "prefix"
    done = cli("install", "sortedcollections", "pytorch", "--channel", str(out), "--channel", str(channel),
               "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    site = prefix / "lib" / "python3.12" / "site-packages"
    ran = subprocess.run([sys.executable, "-c", "import sortedcollections as s, sortedcontainers as c; "
                          "print(list(s.ValueSortedDict({'a': 2, 'b': 1}).keys()), c.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    keys, where = ran.stdout.strip().rsplit(" ", 1)
    assert keys == "['b', 'a']" and Path(where).is_relative_to(site), ran.stdout


def test_a_rerun_reuses_what_it_brought_along(channel: Path, tmp_path: Path) -> None:
    """A second build plans nothing to bring along (--out provides the names now) and rewrites no package; with
    --out's packages of the same wheels gone from its index but the files there, the repack reuses them (same
    wheel sha256 and plan) rather than building them again."""
    out = tmp_path / "out"
    assert _build(channel, out, tmp_path, "--wheels", str(WHEELS), "--skip-preflight").returncode == 0
    first = _names(out)
    again = _build(channel, out, tmp_path, "--wheels", str(WHEELS), "--skip-preflight", "--dry-run")
    assert again.returncode == 0 and _steps(again.stdout + again.stderr) == [], again.stderr
    # an index that does not list them yet (as after a run killed between writing and indexing): planned again,
    # and the repack finds each file made from the same wheel with the same plan, and reuses it
    repodata = out / "linux-64" / "repodata.json"
    listed = json.loads(repodata.read_text())
    listed["packages.conda"] = {k: v for k, v in listed["packages.conda"].items() if not k.startswith("sorted")}
    repodata.write_text(json.dumps(listed))
    done = _build(channel, out, tmp_path, "--wheels", str(WHEELS), "--skip-preflight")
    assert done.returncode == 0, done.stderr
    assert _steps(done.stdout + done.stderr) == BROUGHT and " ".join(done.stderr.split()).count("(reused)") == 2
    assert _names(out) == first


def test_a_requirement_no_wheel_is_had_for_is_refused_before_anything_builds(channel: Path, tmp_path: Path) -> None:
    """The wheel folder lacks sortedcollections: refused (exit 4, RefusedError), naming the requirement, who needs
    it and every place looked in, the channel and the wheel folder; --out is not created."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    out = tmp_path / "out"
    done = _build(channel, out, tmp_path, "--dry-run", "--wheels", str(empty))
    assert done.returncode == 4, done.stderr
    said = " ".join(done.stderr.split())
    assert f"sortedcollections >=2 (required by {PYTORCH}; {channel}: no sortedcollections" in said, said
    assert f"wheels: {empty} (pip --find-links, no index)" in said and "sortedcollections>=2" in said, said
    assert "add a channel that has them" in said and "--wheels DIR" in said and "pypi_to_conda.toml" in said
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize(("args", "says"), [
    (("--for", FOR, "--wheels", "{tmp}/none"), "--wheels {tmp}/none is not a folder"),
    (("--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--wheels", "{tmp}"), "--wheels brings along"),
])
def test_wheels_without_a_folder_or_a_channel_pytorch_is_a_usage_error(args: tuple[str, ...], says: str,
                                                                       channel: Path, tmp_path: Path) -> None:
    done = cli("build", "--dry-run", *(a.format(tmp=tmp_path) for a in args), "--channel", str(channel),
               "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and says.format(tmp=tmp_path) in " ".join(done.stderr.split()), done.stderr


def test_the_official_flavours_build_brings_its_extensions_requirements_along_too(channel: Path,
                                                                                 tmp_path: Path) -> None:
    """The official flavour's build is the sequencer's, as every flavour's (issue 43): --wheels with --extension
    is taken, and its extension is planned after the pytorch it is built for (what it brings along is read at
    build time, after the sdist's metadata: a dry run reads neither)."""
    done = cli("build", "--dry-run", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--wheels", str(tmp_path),
               "--extension", "torch-scatter==2.1.2", "--channel", str(channel), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    said = done.stderr
    assert said.index("build pytorch-2.5.1-py3.12_cpu_0") < said.index("build torch-scatter-2.1.2-pt2.5.1_cpu_"), said


def test_a_binary_wheel_is_brought_along_with_its_library(tmp_path: Path) -> None:
    """A requirement whose wheel is a binary one (MarkupSafe 3.0.2 for CPython 3.12, manylinux): pip takes the cp312
    wheel for the pytorch's Python, the repack passes its RPATH audit, and the installed extension module loads in the
    suite's CPython 3.12 from the prefix."""
    folder = tmp_path / "chan"
    make_package(folder / "linux-64", name="pytorch", version="2.13.0", build="whl_py3.12_cpu_0",
                 depends=("python >=3.12,<3.13.0a0", "markupsafe >=2"))
    make_package(folder / "linux-64", name="python", version="3.12.0", build="h0123456_0")
    index(folder)
    out = tmp_path / "out"
    done = _build(folder, out, tmp_path, "--wheels", str(WHEELS), "--skip-preflight")
    assert done.returncode == 0, done.stderr
    assert sorted(_names(out)) == ["markupsafe-3.0.2-whl_py3.12_0.conda"]
    prefix = tmp_path / "prefix"
    assert cli("install", "markupsafe", "--channel", str(out), "--channel", str(folder), "--prefix",
               str(prefix)).returncode == 0
    site = prefix / "lib" / "python3.12" / "site-packages"
    assert (site / "markupsafe" / "_speedups.cpython-312-x86_64-linux-gnu.so").is_file()
    python312 = python_folder("3.12") / "python3.12"  # the suite's CPython 3.12 (tests/test_conda_forge_split.py)
    ran = subprocess.run([str(python312), "-c", "from markupsafe import _speedups; print(_speedups._escape_inner('<a>'))"],
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout.strip() == "&lt;a&gt;", ran.stderr


def test_two_requirements_of_one_name_that_one_wheel_cannot_meet_are_refused(tmp_path: Path) -> None:
    """pytorch requires sortedcontainers (brought along: 2.4.0) and, again, sortedcontainers <2: one name is one
    package in the channel, and the version brought along cannot meet the second, which is refused, naming both."""
    folder = tmp_path / "chan"
    make_package(folder / "linux-64", name="pytorch", version="2.13.0", build="whl_py3.12_cpu_0",
                 depends=("python >=3.12,<3.13.0a0", "sortedcontainers", "sortedcollections", "sortedcontainers <2"))
    index(folder)
    done = _build(folder, tmp_path / "out", tmp_path, "--dry-run", "--wheels", str(WHEELS))
    assert done.returncode == 4, done.stderr
    refused = " ".join(done.stderr.split()).split("provides:")[1].split("what would work")[0]
    assert f"sortedcontainers <2 (required by {PYTORCH};" in refused, refused
    assert "sortedcontainers-2.4.0-py2.py3-none-any.whl is brought along for another requirement, and 2.4.0 does " \
           "not satisfy sortedcontainers <2" in refused and "sortedcollections" not in refused, refused


def _simple_index(root: Path) -> Path:
    """A PEP 503 index (file://) of the fixture wheels: one folder per project, as a mirror of PyPI serves them."""
    for wheel in sorted(WHEELS.glob("*.whl")):
        project = root / wheel.name.split("-")[0].lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).symlink_to(wheel)
        (project / "index.html").write_text("".join(f'<a href="{w.name}">{w.name}</a>\n'
                                                    for w in sorted(project.glob("*.whl"))))
    return root


def test_without_wheels_the_wheels_come_from_pips_own_index(channel: Path, tmp_path: Path) -> None:
    """No --wheels: pip's own configuration says where the wheels come from (here PIP_INDEX_URL, a file:// mirror of
    the fixture wheels, in place of PyPI), and the refusal says that is where it looked."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "COLUMNS": "400",
           "PIP_INDEX_URL": _simple_index(tmp_path / "simple").as_uri(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(channel), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 0 and _steps(done.stdout + done.stderr) == BROUGHT, done.stderr
    (tmp_path / "simple" / "sortedcollections" / "index.html").write_text("")
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(channel), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 4 and "wheels: pip's index (PyPI, or as pip's own configuration says)" in \
        " ".join(done.stderr.split()), done.stderr


def pure_sdist(folder: Path, name: str, dependencies: list[str]) -> Path:
    """A sdist of a one-module project `name` 1.0 that states its requirements (pyproject.toml [project]), so
    reading them runs none of its code."""
    import tarfile
    tree = folder / f"{name}-1.0"
    (tree / name.replace("-", "_")).mkdir(parents=True)
    (tree / name.replace("-", "_") / "__init__.py").write_text("")
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\ndependencies = {json.dumps(dependencies)}\n')
    sdist = folder / f"{name.replace('-', '_')}-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(tree, arcname=tree.name)
    return sdist


def test_an_extensions_requirement_no_wheel_is_had_for_is_refused_before_anything_builds(
        channel: Path, tmp_path: Path) -> None:
    """An extension whose sdist requires a project no channel has and no wheel folder holds: the build (not a dry
    run, which reads no sdist) is refused (exit 4) before anything builds, naming it and the extension's package;
    what pytorch itself requires and the wheels have is not refused, and nothing is written into --out."""
    sdist = pure_sdist(tmp_path, "needs-absent", ["tf-absent-project>=1", "sortedcontainers"])
    out = tmp_path / "out"
    done = _build(channel, out, tmp_path, "--extension", str(sdist), "--wheels", str(WHEELS), "--engine",
                  "rattler-build", "--skip-preflight")
    assert done.returncode == 4, done.stderr
    refused = " ".join(done.stderr.split()).split("provides:")[1].split("what would work")[0]
    assert "tf-absent-project >=1 (required by needs-absent-1.0-pt2.13.0_cpu_" in refused, refused
    assert f"wheels: {WHEELS} (pip --find-links, no index)" in refused, refused
    assert "sortedcontainers" not in refused and "sortedcollections" not in refused, refused
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize(("requirement", "refused"), [("filelock >=2,<4", False), ("filelock >=3.20", True),
                                                      ("filelock 3.0.*", False), ("filelock ==3.0 py_0", True)])
def test_a_channel_provides_a_requirement_only_with_a_version_that_matches_it(
        requirement: str, refused: bool, tmp_path: Path) -> None:
    """The channel has filelock 3.0 (build pyhd8ed1ab_0): a requirement it matches by conda's rules is provided;
    one it does not (a newer version, another build) is refused before anything builds, naming the version the
    channel has, not planned as if the name were enough (before: any filelock was taken as provided)."""
    folder = tmp_path / "chan"
    make_package(folder / "linux-64", name="pytorch", version="2.13.0", build="whl_py3.12_cpu_0",
                 depends=("python >=3.12,<3.13.0a0", requirement))
    make_package(folder / "noarch", name="filelock", version="3.0", build="pyhd8ed1ab_0", subdir="noarch")
    index(folder)
    done = _build(folder, tmp_path / "out", tmp_path, "--dry-run", "--wheels", str(WHEELS))
    said = " ".join(done.stderr.split())
    if not refused:
        assert done.returncode == 0 and _steps(done.stdout + done.stderr) == [], done.stderr
        return
    assert done.returncode == 4, done.stderr
    assert f"{requirement} (required by {PYTORCH}; {folder}: filelock 3.0, none matching {requirement}" in said, said


def test_render_and_ci_take_the_wheel_folders_too(channel: Path, tmp_path: Path) -> None:
    """`render --wheels` plans what it brings along from those wheels alone (no recipe folder: the repack makes
    them); `ci --wheels DIR` (a folder of the repository) plans from it and gives every build job `--wheels DIR`, so
    the job brings them along from its checkout. Before: no such option (exit 2)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "400"}
    done = cli("render", "--for", FOR, "--channel", str(channel), "--wheels", str(WHEELS), "--out",
               str(tmp_path / "recipes"), env=env)
    assert done.returncode == 0, done.stderr
    assert "--find-links" in done.stderr and str(WHEELS) in done.stderr, done.stderr
    repo = tmp_path / "repo"
    (repo / "wheels").mkdir(parents=True)
    for wheel in WHEELS.glob("sorted*.whl"):
        (repo / "wheels" / wheel.name).symlink_to(wheel)
    done = cli("ci", "github", "--out", str(repo), "--for", FOR, "--channel", str(channel), "--wheels", "wheels",
               "--extension", "torch-scatter==2.1.2", env=env)
    assert done.returncode == 0, done.stderr
    workflow = (repo / ".github" / "workflows" / "torchforge.yml").read_text()
    assert "--wheels wheels" in workflow and "--extension torch-scatter==2.1.2" in workflow, workflow
    assert "--find-links " + str(repo / "wheels") in " ".join(done.stderr.split()), done.stderr
    done = cli("ci", "github", "--out", str(repo), "--for", FOR, "--channel", str(channel), "--wheels",
               str(tmp_path / "elsewhere"), "--extension", "torch-scatter==2.1.2", "--force", env=env)
    assert done.returncode == 2 and "--wheels" in done.stderr, done.stderr


CHANNEL_STACK = """\
python = ["3.12"]

[pytorch]
from = "channel"
version = "2.13.0"
cuda = "cpu"
match = "pytorch ==2.13.0 whl_*"

[channels]
next_to = ["chan"]
out = "out"
wheels = ["{wheels}"]
"""


def test_a_stack_files_wheel_folders_bring_along_what_the_flags_do(channel: Path, tmp_path: Path) -> None:
    """[channels] wheels is --wheels: `build --stack --dry-run` plans the same packages to bring along; a folder
    that is not there is refused with its line (exit 2)."""
    (tmp_path / "wheels").symlink_to(WHEELS)
    stack = tmp_path / "stack.toml"
    stack.write_text(CHANNEL_STACK.format(wheels="wheels"))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "400"}
    done = cli("build", "--stack", str(stack), "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert _steps(done.stdout + done.stderr) == BROUGHT, done.stderr
    stack.write_text(CHANNEL_STACK.format(wheels="no-such-folder"))
    done = cli("build", "--stack", str(stack), "--dry-run", env=env)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and f"{stack}:12: channels.wheels: entry 1" in said and "no folder at" in said, said
