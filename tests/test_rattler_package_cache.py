"""The embedded engine tests the package it just built, never a same-named one from rattler's package cache."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from torchforge.engines import BuildJob
from torchforge.engines.package_cache import cache_dir, evict
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.localchannel import index
from torchforge.proc import Runner

BUILD = "cpu_0"
OUTPUTS = (f"libprobe-1.0-{BUILD}", f"probe-1.0-{BUILD}")


def _recipe(folder: Path, mark: str) -> Path:
    """libprobe carries MARK and tests for it; probe copies libprobe's file at build time (host) and tests it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(f"""\
recipe:
  name: probe-split
  version: "1.0"
outputs:
  - package:
      name: libprobe
    build:
      string: {BUILD}
      script:
        - mkdir -p $PREFIX/share
        - echo {mark} > $PREFIX/share/libprobe.txt
    tests:
      - script:
          - grep -x {mark} $PREFIX/share/libprobe.txt
  - package:
      name: probe
    build:
      string: {BUILD}
      script:
        - mkdir -p $PREFIX/share
        - cp $PREFIX/share/libprobe.txt $PREFIX/share/probe.txt
    requirements:
      host:
        - libprobe ==1.0 {BUILD}
      run:
        - libprobe ==1.0 {BUILD}
    tests:
      - script:
          - grep -x {mark} $PREFIX/share/probe.txt
          - grep -x {mark} $PREFIX/share/libprobe.txt
""")
    return folder


def test_a_rebuild_with_the_same_build_string_is_tested_as_built(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the two outputs, change what they hold and what their tests check, build again into the same
    staging folder: the second build's tests must see the second contents. rattler-build took libprobe (its
    files and test commands) from the package cache the first build filled, and failed on the old test."""
    monkeypatch.setenv("RATTLER_CACHE_DIR", str(tmp_path / "rattler-cache"))
    deps = tmp_path / "deps"  # the recipe needs nothing else: an empty local channel keeps the build offline
    deps.mkdir()
    index(deps)
    runner = Runner()
    for mark in ("first", "second"):
        staging = tmp_path / "staging"
        job = BuildJob(_recipe(tmp_path / "recipe", mark), staging, (deps.as_uri(),), None, {}, outputs=OUTPUTS)
        result = runner.run(RattlerBuildEngine().command(job), check=False, log_file=tmp_path / f"{mark}.log")
        assert result.returncode == 0, result.output[-4000:]
        assert f"grep -x {mark} " in result.output  # the test commands of this build ran
        assert sorted(p.name for p in (staging / "linux-64").glob("*.conda")) == sorted(f"{s}.conda" for s in OUTPUTS)
        cached = tmp_path / "rattler-cache" / "pkgs" / OUTPUTS[0] / "share" / "libprobe.txt"
        assert cached.read_text() == f"{mark}\n"
        shutil.rmtree(staging)  # as the pipeline does: the next build of the step writes the same folder


def test_eviction_removes_only_the_named_entries(tmp_path: Path) -> None:
    environ = {"RATTLER_CACHE_DIR": str(tmp_path / "cache")}
    packages = cache_dir(environ) / "pkgs"
    for stem in ("libtorch-2.13.0-cpu_mkl_h33dfd99_102", "mkl-2024.2.2-ha957f24_16"):
        (packages / stem / "info").mkdir(parents=True)
        (packages / f"{stem}.lock").write_bytes(b"\0" * 8)
    assert evict(["libtorch-2.13.0-cpu_mkl_h33dfd99_102", "pytorch-2.13.0-cpu_py311_0"], environ) \
        == [packages / "libtorch-2.13.0-cpu_mkl_h33dfd99_102"]
    assert sorted(p.name for p in packages.iterdir()) == ["mkl-2024.2.2-ha957f24_16", "mkl-2024.2.2-ha957f24_16.lock"]
    with pytest.raises(ValueError, match="not a package file stem"):
        evict(["../mkl-2024.2.2-ha957f24_16"], environ)
    assert (packages / "mkl-2024.2.2-ha957f24_16").is_dir()


def test_the_cache_folder_is_rattlers(tmp_path: Path) -> None:
    """RATTLER_CACHE_DIR first, else XDG_CACHE_HOME (absolute) or ~/.cache on Linux, + rattler/cache."""
    assert cache_dir({"RATTLER_CACHE_DIR": "/srv/rc", "HOME": "/home/u"}) == Path("/srv/rc")
    assert cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/rattler/cache")
    assert cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "/var/cache/u"}) == Path("/var/cache/u/rattler/cache")
    assert cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "relative"}) == Path("/home/u/.cache/rattler/cache")


def test_build_names_every_planned_output_to_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`torchforge build` hands the engine every package of the recipe step (the dry run shows the command)."""
    from torchforge.cli import main

    source = Path(__file__).parent / "fixtures" / "torch_split"
    code = main(["build", "--dry-run", "--engine", "rattler-build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py",
                 "3.11", "--source", str(source), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 0, err
    worker = [shlex.split(line) for line in err.splitlines() if "torchforge.engines.rattler_worker" in line]
    assert len(worker) == 1
    fresh = [worker[0][i + 1] for i, word in enumerate(worker[0]) if word == "--fresh"]
    assert [re.sub(r"_h[0-9a-f]{7}_", "_HASH_", stem) for stem in fresh] == [
        "libtorch-2.13.0-cpu_mkl_torchforge_HASH_102", "pytorch-2.13.0-cpu_mkl_torchforge_py311_HASH_102",
        "pytorch-cpu-2.13.0-cpu_mkl_torchforge_HASH_102"]
    assert all(err.count(stem) >= 2 for stem in fresh)  # the plan table names the same packages
