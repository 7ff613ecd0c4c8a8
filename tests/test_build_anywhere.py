"""Builds into a folder whose path has a blank and a non-ASCII letter, in both flavours, with and without the
compile cache: the real `torchforge build` of the fixtures against stand-in channels (the README's quick start
and docs/building.md's official try-out), through the embedded rattler-build engine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.flavours import conda_forge

FIXTURES = Path(__file__).parent / "fixtures"
PY = "3.11"
# flavour -> (the selection, the fixture it builds)
REQUESTS = {
    "conda-forge": (["--pytorch", "2.13.0", "--cuda", "cpu", "--py", PY], "torch_split"),
    "official": (["--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", PY], "torch_like"),
}
AWKWARD = "my chan é"  # a blank and a letter outside ASCII


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The site config of each flavour's stand-in channel (`torchforge standin-channel`, as a user makes it)."""
    configs = {}
    for flavour, (selection, _) in REQUESTS.items():
        channel = tmp_path_factory.mktemp(f"standin-{flavour}") / "standin"
        assert main(["standin-channel", *selection, "--out", str(channel)]) == 0
        configs[flavour] = channel / "torchforge.toml"
    return configs


@pytest.mark.slow
@pytest.mark.parametrize("flavour", REQUESTS)
def test_a_build_into_a_path_with_a_blank_and_non_ascii_succeeds_with_and_without_the_cache(
        flavour: str, standins: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A package cache of its own: the engine's test step takes a package of the same file name from the shared
    # one (~/.cache/rattler), which an earlier build of other recipe text may have left there.
    monkeypatch.setenv("RATTLER_CACHE_DIR", str(tmp_path / "rattler-cache"))
    selection, fixture = REQUESTS[flavour]
    base = ["build", *selection, "--source", str(FIXTURES / fixture), "--config", str(standins[flavour]),
            "--skip-preflight"]
    cached, uncached = tmp_path / AWKWARD / "cached", tmp_path / AWKWARD / "no cache"
    for out, extra in ((cached, []), (uncached, ["--no-cache"])):
        code = main([*base, "--out", str(out), *extra])
        logs = "\n".join(log.read_text(errors="replace")[-3000:] for log in (out / "logs").glob("*.log"))
        assert code == 0, capsys.readouterr().err[-3000:] + logs
        packages = sorted(p.name for p in (out / "linux-64").glob("*.conda"))
        assert packages and not list(out.glob(".torchforge-tmp-*"))
    # the cached build's compiles went through ccache (setuptools' through route.sh's wrappers), the other's not
    cached_log = "\n".join(log.read_text(errors="replace") for log in (cached / "logs").glob("*.log"))
    found = re.search(r"torchforge: compile cache .*: host (\d+)/(\d+) reused", cached_log)
    assert found and int(found[2]) > 0, cached_log[-3000:]
    assert "torchforge: compile cache" not in "".join(p.read_text() for p in (uncached / "logs").glob("*.log"))
    assert sorted(p.name for p in (uncached / "linux-64").glob("*.conda")) == packages


def test_the_libtorch_test_commands_hold_a_prefix_with_a_blank(tmp_path: Path) -> None:
    """The commands of the conda-forge flavour's libtorch test, run by bash as an engine runs them, in a prefix
    whose path has a blank and a non-ASCII letter (conda-build tests in a prefix under its output folder)."""
    recipe = conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,))
    prefix = tmp_path / AWKWARD / "test env"
    (prefix / "lib").mkdir(parents=True)
    for name in ("c10", "shm", "torch", "torch_cpu", "torch_global_deps"):
        (prefix / "lib" / f"lib{name}.so").write_bytes(b"")
    (prefix / "share" / "cmake" / "Torch").mkdir(parents=True)
    (prefix / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text("")
    checks = conda_forge.libtorch_checks(recipe)
    assert checks
    for check in checks:
        done = subprocess.run(["bash", "-euc", check], env={"PREFIX": str(prefix), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{check}: {done.stderr}"
    (prefix / "lib" / "libtorch_python.so").write_bytes(b"")  # what the test must catch, it still catches
    assert subprocess.run(["bash", "-euc", checks[-1]], env={"PREFIX": str(prefix)}).returncode != 0
