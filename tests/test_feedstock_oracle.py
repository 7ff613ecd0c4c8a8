"""The conda-forge flavour checked against conda-forge/pytorch-cpu-feedstock itself, not against our own table.

tests/data/feedstock holds the feedstock's recipe/ and .ci_support/ at each release commit the table names
(scripts/feedstock_snapshots.py refreshes them from a clone). These tests read the table's facts again from
those files, check the table's choice of commit, and render the feedstock's own recipe with the real
conda-build next to torchforge's render of the same job (tests/feedstock_oracle.py).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "feedstock"
TABLE = tomllib.loads((ROOT / "torchforge" / "data" / "conda_forge.toml").read_text(encoding="utf-8"))


def test_the_snapshots_are_the_tables_commits() -> None:
    folders = {p.name for p in SNAPSHOTS.iterdir() if p.is_dir()}
    assert folders == {c for r in TABLE["releases"].values() for c in (r["commit"], *r.get("earlier_builds", ()))}


def test_a_release_with_a_branch_is_read_at_the_branchs_tip() -> None:
    """The table's rule: the tip of the branch vX.Y.x where the feedstock has one for that release (its later
    builds there carry newer build numbers and patches, e.g. 2.9.1's build 5 at e42c757b)."""
    branches = tomllib.loads((SNAPSHOTS / "BRANCHES.toml").read_text(encoding="utf-8"))
    for version, release in TABLE["releases"].items():
        tips = [b["commit"] for b in branches.values() if b["version"] == version]
        if tips:
            assert release["commit"] == tips[0], f"{version}: the table reads {release['commit'][:8]}, " \
                                                 f"the tip of its branch is {tips[0][:8]}"
            assert release["commit_note"].startswith("tip of branch"), version


def test_the_table_is_what_the_facts_script_reads_from_the_snapshots() -> None:
    """scripts/conda_forge_facts.py on the snapshots: exit 1 (and say so) where the table is stale."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "conda_forge_facts.py"), str(SNAPSHOTS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "matches the feedstock" in done.stdout


# ---- the feedstock's recipe and torchforge's, rendered by the real conda-build ----------------------------

def _jobs() -> list:
    from tests.feedstock_oracle import jobs

    return jobs()


@pytest.fixture(scope="module")
def conda_build_python() -> Path:
    """.venv-conda (the real conda-build 26.7.1 from ../shared/vendor), made on first use."""
    from tests import tool_venvs

    if not tool_venvs.vendored_conda_present():
        pytest.skip(f"no conda wheels in {tool_venvs.VENDOR}: the oracle renders with the real conda-build")
    return tool_venvs.ensure("conda") / "python"


@pytest.mark.slow
@pytest.mark.parametrize("job", _jobs(), ids=lambda job: job.id)
def test_torchforges_recipe_renders_as_the_feedstocks_own_for_the_same_job(job, conda_build_python, tmp_path) -> None:
    """Every output's requirements (selectors applied), run_exports, ignore_run_exports(_from), build strings and
    numbers, track_features, missing_dso_whitelist, detect_binary_files_with_prefix and test section: the same as
    the feedstock's, or a difference tests/data/feedstock_differences.toml lists with its reason."""
    from tests.feedstock_oracle import compare, load_differences, render_pair

    theirs, ours = render_pair(job, tmp_path)
    findings = compare(job, theirs, ours, load_differences())
    assert {f.output for f in findings} >= {"libtorch", "pytorch"}
    different = [f"{f.output} {f.field}: {f.detail}" for f in findings if f.status == "different"]
    assert not different, "\n".join(different)


@pytest.mark.slow
@pytest.mark.parametrize("job", [job for job in _jobs() if job.platform == "linux-64"], ids=lambda job: job.id)
def test_torchforges_recipe_yaml_renders_as_the_feedstocks_own_for_the_same_job(job, conda_build_python,
                                                                                tmp_path) -> None:
    """The same oracle for the embedded engine: torchforge's recipe.yaml as the real py-rattler-build renders it,
    in meta.yaml's field names (tests/feedstock_rattler_render.py), against the feedstock's conda-build render;
    differences listed for both formats or for recipe.yaml alone (`engine = "rattler-build"`), else it fails."""
    pytest.importorskip("rattler_build")
    from tests import feedstock_rattler_render as rattler
    from tests.feedstock_oracle import compare, load_differences, render_feedstock, write_torchforge_recipe
    from torchforge.templates import RecipeFormat

    theirs = rattler.normalised(render_feedstock(job))
    ours = rattler.normalised(rattler.render(write_torchforge_recipe(job, tmp_path, RecipeFormat.RATTLER_BUILD)))
    findings = compare(job, theirs, ours, load_differences("rattler-build"))
    assert {f.output for f in findings} >= {"libtorch", "pytorch"}
    different = [f"{f.output} {f.field}: {f.detail}" for f in findings if f.status == "different"]
    assert not different, "\n".join(different)


# ---- the compiler and linker flags build.sh hands to setup.py, against the feedstock's own build.sh ----------

# Flags of the shape conda-forge's GCC activation exports (the flags the feedstock edits are among them).
CONDA_FLAGS = {
    "CFLAGS": "-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 -pipe",
    "CXXFLAGS": "-fvisibility-inlines-hidden -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize "
                "-fPIC -fstack-protector-strong -fno-plt -O2 -std=c++17 -pipe",
    "LDFLAGS": "-Wl,-O2 -Wl,--sort-common -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags",
}
FLAG_NAMES = tuple(CONDA_FLAGS)


def feedstock_flags(version: str, platform: str) -> dict[str, list[str]]:
    """The flags after the feedstock's own build.sh edits them: its ADJUST COMPILER AND LINKER FLAGS block, run by
    bash with conda's flags and the job's variables (GCC, the subdir)."""
    script = (SNAPSHOTS / TABLE["releases"][version]["commit"] / "recipe" / "build.sh").read_text()
    block = script[script.index("ADJUST COMPILER AND LINKER FLAGS"):script.index("CONFIGURE CMAKE FOR CONDA")]
    block = block.split("\n", 1)[1].rsplit("\n", 1)[0]  # without the two banner lines
    env = {"PATH": "/usr/bin:/bin", "c_compiler": "gcc", "target_platform": platform, **CONDA_FLAGS}
    done = subprocess.run(["bash", "-c", block + "\n" + "".join(f'echo "${n}"\n' for n in FLAG_NAMES)], env=env,
                          capture_output=True, text=True, check=True)
    return dict(zip(FLAG_NAMES, (line.split() for line in done.stdout.splitlines())))


def setup_py_environment(version: str, platform: str, tmp_path: Path, *, feedstock_patches: bool = False,
                         conda_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment torchforge's build.sh hands to `setup.py build`: the script runs with conda's variables and
    a stand-in $PYTHON that records its environment and stops the build there. With `feedstock_patches` the
    script is the one that applies the feedstock's patches (here: as already applied)."""
    from torchforge.flavours import conda_forge
    from torchforge.sourcestate import Source

    script = conda_forge.recipe_files(conda_forge.plan(version, platform, "cpu"),
                                      Source("git", "https://github.com/pytorch/pytorch", f"v{version}"),
                                      feedstock_patches=feedstock_patches)["build.sh"]
    (tmp_path / "build.sh").write_text(script)
    if feedstock_patches:
        (tmp_path / conda_forge.PATCH_FOLDER).mkdir(exist_ok=True)
        (tmp_path / conda_forge.PATCH_FOLDER / ".applied").touch()
    recorder = tmp_path / "python"
    recorder.write_text(f'#!/bin/sh\nenv -0 > "{tmp_path}/seen.env"\nexit 3\n')
    recorder.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(recorder), "PKG_NAME": "libtorch", "PKG_VERSION": version,
           "PKG_BUILDNUM": "0", "CPU_COUNT": "2", "PREFIX": str(tmp_path / "p"), "BUILD_PREFIX": str(tmp_path / "b"),
           "RECIPE_DIR": str(tmp_path), "SRC_DIR": str(tmp_path), **CONDA_FLAGS, **(conda_env or {})}
    done = subprocess.run(["bash", "build.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr[-2000:]
    return dict(item.split("=", 1) for item in (tmp_path / "seen.env").read_text().split("\0") if "=" in item)


def torchforge_flags(version: str, platform: str, tmp_path: Path) -> dict[str, list[str]]:
    """The flags torchforge's build.sh hands to `setup.py build`."""
    seen = setup_py_environment(version, platform, tmp_path)
    return {name: seen[name].split() for name in FLAG_NAMES}


@pytest.mark.parametrize("version", list(TABLE["releases"]))
@pytest.mark.parametrize("platform", ["linux-64", "linux-aarch64"])
def test_the_compiler_and_linker_flags_reaching_setup_py_are_the_feedstocks(version: str, platform: str,
                                                                            tmp_path: Path) -> None:
    """CFLAGS, CXXFLAGS and LDFLAGS as the feedstock's build.sh leaves them (issue 31 items 3 and 4: no
    -fvisibility-inlines-hidden, no -std=c++NN, its warning flags, -Wl,-z,noexecstack, no --as-needed, -z lazy),
    each flag in the same order."""
    assert torchforge_flags(version, platform, tmp_path) == feedstock_flags(version, platform)


@pytest.mark.parametrize("version", list(TABLE["releases"]))
def test_the_files_the_feedstock_empties_are_empty_when_setup_py_runs(version: str, tmp_path: Path) -> None:
    """Issue 31 item 12: each release's build.sh empties NNPACK's DownloadSix.cmake (a download from the network
    while configuring); torchforge's build.sh does the same before `setup.py build` (the recording stand-in python
    stops it there), and a tree without the file stays without it."""
    feedstock = (SNAPSHOTS / TABLE["releases"][version]["commit"] / "recipe" / "build.sh").read_text()
    emptied = [line.split(">", 1)[1].strip() for line in feedstock.splitlines() if line.startswith("> ")]
    assert emptied == ["third_party/NNPACK/cmake/DownloadSix.cmake"]
    target = tmp_path / emptied[0]
    target.parent.mkdir(parents=True)
    target.write_text("file(DOWNLOAD https://pypi.org/six.tar.gz six.tar.gz)\n")
    torchforge_flags(version, "linux-64", tmp_path)
    assert target.read_text() == ""
    other = tmp_path / "without"
    other.mkdir()
    torchforge_flags(version, "linux-64", other)
    assert not (other / "third_party").exists()


@pytest.mark.parametrize("version", list(TABLE["releases"]))
def test_setup_py_is_edited_as_the_feedstocks_build_sh_edits_it(version: str, tmp_path: Path) -> None:
    """Issue 31 item 12: from 2.11.0 the feedstock's build.sh deletes setup.py's runtime pin setuptools<82. Its own
    `sed ... setup.py` lines of each release, run by bash on a setup.py, give what torchforge's build.sh leaves
    there when `setup.py build` would run."""
    setup = 'requires = [\n    "filelock",\n    "setuptools<82",\n    "sympy>=1.13.3",\n]\n'
    feedstock = (SNAPSHOTS / TABLE["releases"][version]["commit"] / "recipe" / "build.sh").read_text()
    edits = [line for line in feedstock.splitlines() if line.startswith("sed ") and line.endswith(" setup.py")]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "setup.py").write_text(setup)
    subprocess.run(["bash", "-c", "\n".join(edits) or "true"], cwd=theirs, check=True)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "setup.py").write_text(setup)
    torchforge_flags(version, "linux-64", ours)
    assert (ours / "setup.py").read_text() == (theirs / "setup.py").read_text()
    assert ("setuptools<82" in (ours / "setup.py").read_text()) == (version in ("2.6.0", "2.7.0", "2.7.1", "2.8.0",
                                                                                "2.9.0", "2.9.1", "2.10.0"))


# ---- conda's -DCMAKE_* arguments and the CMake variables build.sh hands to setup.py -------------------------------

def conda_cmake_args(prefix: str, build_prefix: str, *, cuda: bool) -> str:
    """CMAKE_ARGS of the shape conda-build and conda-forge's GCC activation export on linux-64 (install prefix,
    binutils, the sysroot's root path), and the second root path that the CUDA compiler's activation appends."""
    triplet = "x86_64-conda-linux-gnu"
    args = [f"-DCMAKE_AR={build_prefix}/bin/{triplet}-ar", f"-DCMAKE_RANLIB={build_prefix}/bin/{triplet}-ranlib",
            f"-DCMAKE_LINKER={build_prefix}/bin/{triplet}-ld", "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_INSTALL_PREFIX={prefix}", "-DCMAKE_INSTALL_LIBDIR=lib",
            f"-DCMAKE_PROGRAM_PATH={build_prefix}/bin;{prefix}/bin", "-DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER",
            "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY", "-DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY",
            f"-DCMAKE_FIND_ROOT_PATH={prefix};{build_prefix}/{triplet}/sysroot", "-DPython_FIND_STRATEGY=LOCATION"]
    if cuda:
        args.append(f"-DCMAKE_FIND_ROOT_PATH={prefix};{build_prefix}/{triplet}/sysroot;{prefix}/targets/x86_64-linux")
    return " ".join(args)


def cmake_view(environment: dict[str, str]) -> dict[str, object]:
    """What reaches PyTorch's CMake from the environment: CMAKE_ARGS word by word, every other CMAKE_* variable."""
    return {name: value.split() if name == "CMAKE_ARGS" else value
            for name, value in environment.items() if name.startswith("CMAKE_") and name != "CMAKE_CUDA_FLAGS"}


def feedstock_cmake(version: str, environment: dict[str, str]) -> dict[str, object]:
    """The CMake variables after the feedstock's own build.sh sets them: its CONFIGURE CMAKE FOR CONDA block, run by
    bash with conda's variables; what it exports is what setup.py sees."""
    script = (SNAPSHOTS / TABLE["releases"][version]["commit"] / "recipe" / "build.sh").read_text()
    block = script[script.index("CONFIGURE CMAKE FOR CONDA"):script.index("export PYTORCH_BUILD_VERSION")]
    block = block.split("\n", 1)[1]  # without the banner line
    done = subprocess.run(["bash", "-c", block + "\nenv -0"], env=environment, capture_output=True, text=True,
                          check=True)
    return cmake_view(dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item))


@pytest.mark.parametrize("version", list(TABLE["releases"]))
@pytest.mark.parametrize("cuda", [False, True], ids=["cpu-args", "cuda-args"])
def test_the_cmake_variables_reaching_setup_py_are_the_feedstocks(version: str, cuda: bool, tmp_path: Path) -> None:
    """Issue 31 item 5: conda's -DCMAKE_* arguments reach PyTorch's CMake as the feedstock's build.sh of each release
    hands them over (variables up to 2.11, CMAKE_ARGS itself with the source tree on every root path from 2.12,
    with its patch), and CMAKE_LIBRARY_PATH, CMAKE_PREFIX_PATH, CMAKE_GENERATOR, CMAKE_BUILD_TYPE are the same."""
    prefix, build_prefix = str(tmp_path / "p"), str(tmp_path / "b")
    conda = {"CMAKE_ARGS": conda_cmake_args(prefix, build_prefix, cuda=cuda)}
    ours = cmake_view(setup_py_environment(version, "linux-64", tmp_path, feedstock_patches=True, conda_env=conda))
    theirs = feedstock_cmake(version, {"PATH": "/usr/bin:/bin", "PREFIX": prefix, "BUILD_PREFIX": build_prefix,
                                       "SRC_DIR": str(tmp_path), **conda})
    assert ours == theirs
    assert any(arg.endswith(f";{tmp_path}") for arg in ours.get("CMAKE_ARGS", [])) or \
        str(ours.get("CMAKE_FIND_ROOT_PATH", "")).endswith(f";{tmp_path}")


@pytest.mark.parametrize("version", [v for v in TABLE["releases"]
                                     if Version(v) >= Version(TABLE["cmake"]["arguments_since"])])
def test_without_the_feedstocks_patch_the_cmake_arguments_reach_cmake_as_variables(version: str,
                                                                                  tmp_path: Path) -> None:
    """Without --feedstock-patches setup.py does not pass $CMAKE_ARGS to CMake (the feedstock's patch does), but
    still forwards CMAKE_* variables: each argument becomes one, as in the feedstock's releases before 2.12."""
    conda = {"CMAKE_ARGS": conda_cmake_args(str(tmp_path / "p"), str(tmp_path / "b"), cuda=True)}
    seen = setup_py_environment(version, "linux-64", tmp_path, conda_env=conda)
    assert seen["CMAKE_AR"] == f"{tmp_path}/b/bin/x86_64-conda-linux-gnu-ar"
    assert seen["CMAKE_FIND_ROOT_PATH"].endswith(f"/targets/x86_64-linux;{tmp_path}")
    assert "CMAKE_INSTALL_PREFIX" not in seen
