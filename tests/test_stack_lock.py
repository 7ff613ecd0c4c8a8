"""A stack file end to end on the CPU (issue 39): the real torch 2.13.0 CPU wheel repacked and torch-scatter 2.1.2
built from its sdist by `build --stack`, with the team's own small package (team-utils, a pure-Python sdist
made here) whose requirement sortedcollections no channel has: the stack file's `[channels] wheels` folder holds
the real PyPI wheels (tests/fixtures/wheels), and the build brings it and sortedcontainers, which it requires in
turn, into the output channel; all next to a stand-in conda-forge channel (tests/test_extension_build's, whose
carried packages are pytorch's own requirements). The lock beside the file names every package file;
`install --stack` installs exactly those into a fresh prefix, where scatter_add / scatter_max agree with plain
torch and team-utils runs on the brought-along sortedcollections; `verify --stack` passes, and fails naming the file once one package of the prefix is another build; a lock
whose file the channel no longer holds, or holds with another sha256, is refused before anything is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.rattler_in_child import install_without_dependencies
from tests.test_closure import WHEELS
from tests.test_extension_build import CHECK, PY, SCATTER, SCATTER_BUILDS, channels, scatter_compile_cache  # noqa: F401  (the shared channels fixture)
from tests.tool_venvs import ensure
from torchforge.cli import main
from torchforge.fileops import sha256_file
from torchforge.localchannel import index
from torchforge.stackfile import lock as stack_lock

# xdist_group: the suite's torch-scatter builds run one after another on one worker, the first filling the
# shared compile cache (tests.test_extension_build.scatter_compile_cache), the others taking every object from it
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(SCATTER_BUILDS),
              pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")]

STACK = """\
# the team's CPU stack
python = ["3.11"]

[pytorch]
from = "wheels"
version = "2.13.0"
cuda = "cpu"
wheels = ["wheels"]

[[extensions]]
spec = "{scatter}"

[[extensions]]
spec = "sdists/team_utils-1.0.tar.gz"

[channels]
next_to = ["{standins}"]
out = "channel"
wheels = ["{requirement_wheels}"]
"""

# the team's own package: pure Python, with a requirement (sortedcollections) that no channel of the stack has
TEAM_UTILS = {
    "PKG-INFO": "Metadata-Version: 2.2\nName: team-utils\nVersion: 1.0\nRequires-Dist: sortedcollections>=2\n",
    "pyproject.toml": ('[build-system]\nrequires = ["setuptools", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
                       '[project]\nname = "team-utils"\nversion = "1.0"\ndependencies = ["sortedcollections>=2"]\n'),
    "team_utils/__init__.py": ("from sortedcollections import ValueSortedDict\n\n\n"
                               "def ranked(scores):\n    return list(ValueSortedDict(scores).keys())\n"),
}
TEAM_CHECK = "import team_utils; print(team_utils.ranked({'a': 3, 'b': 1, 'c': 2}))"


def team_utils_sdist(folder: Path) -> Path:
    """team_utils-1.0.tar.gz in folder, from TEAM_UTILS."""
    import io
    import tarfile
    folder.mkdir(parents=True, exist_ok=True)
    sdist = folder / "team_utils-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in TEAM_UTILS.items():
            data = text.encode()
            member = tarfile.TarInfo(f"team_utils-1.0/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return sdist


@pytest.fixture(scope="module")
def built(channels: tuple[Path, Path], torch_wheel: Path,  # noqa: F811
          tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stack built once for the module: its stack file (the lock beside it)."""
    root = tmp_path_factory.mktemp("team")
    # the output channel starts as a hard-link copy of the shared repack of this wheel: `build --stack` repacks
    # into it and finds each package already repacked from this wheel
    shutil.copytree(channels[0], root / "channel", copy_function=os.link)
    (root / "wheels").mkdir()
    os.symlink(torch_wheel, root / "wheels" / torch_wheel.name)
    stack = root / "stack.toml"
    team_utils_sdist(root / "sdists")
    stack.write_text(STACK.format(scatter=SCATTER, standins=channels[1], requirement_wheels=WHEELS))
    with pytest.MonkeyPatch.context() as patch:
        cache = root / "cache" / "torchforge" / "extensions"
        cache.mkdir(parents=True)
        (cache / "metadata-torch-2.13.0").symlink_to(ensure("torchcpu").parent)
        patch.setenv("XDG_CACHE_HOME", str(root / "cache"))
        assert main(["build", "--stack", str(stack), "--engine", "rattler-build", "--jobs", "2",
                     "--cache", str(scatter_compile_cache(tmp_path_factory))]) == 0
    return stack


@pytest.fixture(scope="module")
def installed(built: Path) -> Path:
    prefix = built.parent / "prefix"
    assert main(["install", "--stack", str(built), "--prefix", str(prefix)]) == 0
    return prefix


def test_the_lock_names_every_package_file_of_the_stack(built: Path) -> None:
    lock = stack_lock.read(built.with_suffix(".lock"))
    (env,) = lock.environments
    by_name = {p.name: p for p in env.packages}
    assert {"pytorch", "torch-scatter", "team-utils", "python", "filelock", "fsspec"} <= set(by_name), sorted(by_name)
    out = (built.parent / "channel").as_uri()
    for brought in ("sortedcollections", "sortedcontainers"):  # brought along into the output channel
        assert by_name[brought].channel == out and by_name[brought].build == "whl_py3.11_0", by_name[brought]
    scatter = by_name["torch-scatter"]
    archive = built.parent / "channel" / scatter.subdir / scatter.file
    assert scatter.file.startswith("torch-scatter-2.1.2-pt2.13.0_cpu_") and scatter.sha256 == sha256_file(archive)
    assert by_name["pytorch"].build == "whl_py3.11_cpu_0" and by_name["pytorch"].arch == ()
    assert by_name["filelock"].channel == Path(built.read_text().split('next_to = ["')[1].split('"')[0]).as_uri()
    assert lock.stack_sha256 == sha256_file(built)


def test_install_of_the_lock_runs_torch_scatter_against_torch(built: Path, installed: Path) -> None:
    (env,) = stack_lock.read(built.with_suffix(".lock")).environments
    records = {json.loads(p.read_text())["fn"] for p in (installed / "conda-meta").glob("*.json")}
    assert records == {p.file for p in env.packages}
    done = subprocess.run([str(installed / "bin" / "python"), "-c", CHECK], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch_scatter 2.1.2 ok against torch 2.13.0" in done.stdout
    team = subprocess.run([str(installed / "bin" / "python"), "-c", TEAM_CHECK], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    assert team.returncode == 0 and team.stdout.split() == ["['b',", "'c',", "'a']"], team.stderr[-3000:]


def test_verify_of_the_stack_passes_and_names_a_swapped_package(
        built: Path, installed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(installed), "--stack", str(built), "--want", "cpu"]) == 0
    assert "exactly the" in capsys.readouterr().out
    # the same prefix with fsspec swapped for another build of it (a real record, installed by py-rattler)
    swapped = tmp_path / "swapped"
    shutil.copytree(installed, swapped, symlinks=True, copy_function=os.link)
    (old,) = (swapped / "conda-meta").glob("fsspec-*.json")
    version = json.loads(old.read_text())["version"]
    make_package(tmp_path / "other" / "linux-64", "fsspec", version, "other_1", fmt=".conda")
    index(tmp_path / "other")
    other = tmp_path / "other-prefix"
    install_without_dependencies(tmp_path / "other", "fsspec", "other_1", other, tmp_path / "pkgs")
    for path in json.loads(old.read_text())["files"]:
        (swapped / path).unlink(missing_ok=True)
    old.unlink()
    (new,) = (other / "conda-meta").glob("fsspec-*.json")
    shutil.copy(new, swapped / "conda-meta" / new.name)
    capsys.readouterr()
    assert main(["verify", str(swapped), "--stack", str(built), "--want", "cpu"]) == 8
    printed = " ".join(capsys.readouterr().out.split())
    assert f"different fsspec: fsspec-{version}-other_1.conda" in printed.replace("│ ", "").replace(" │", "")


@pytest.mark.parametrize("change", ["sha256", "file"])
def test_a_lock_the_channel_no_longer_matches_is_refused_before_installing(
        built: Path, change: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = built.parent / f"changed-{change}.toml"
    shutil.copy(built, other)
    lock = stack_lock.read(built.with_suffix(".lock"))
    (env,) = lock.environments
    scatter = next(p for p in env.packages if p.name == "torch-scatter")
    if change == "sha256":
        changed = scatter.model_copy(update={"sha256": "0" * 64})
    else:
        changed = scatter.model_copy(update={"build": scatter.build.replace("_0", "_7"),
                                             "file": scatter.file.replace("_0.conda", "_7.conda")})
    packages = tuple(changed if p is scatter else p for p in env.packages)
    env = env.model_copy(update={"packages": packages})
    other.with_suffix(".lock").write_text(stack_lock.render(lock.model_copy(update={"environments": (env,)})))
    prefix = tmp_path / "prefix"
    assert main(["install", "--stack", str(other), "--prefix", str(prefix)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    words = ("sha256 " + scatter.sha256 if change == "sha256" else f"no longer holds {changed.file}")
    assert words in err and "nothing was installed" in err, err
    assert not prefix.exists()
