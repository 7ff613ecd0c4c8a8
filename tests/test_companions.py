"""pytorch-mutex, cpuonly and pytorch-cuda: rendered from data/companions.toml, built with the embedded
rattler-build engine into a channel, and solved by py-rattler together with pytorch fixture packages that
depend on them the way the official packages do. `torchforge build` plans them when the channel lacks them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests.pkgfactory import make_package
from tests.rattler_in_child import solve
from torchforge import data as tables
from torchforge import localchannel
from torchforge.cli import main
from torchforge.flavours.official.companions import companions_for, pytorch_cuda
from torchforge.localchannel import index
from torchforge.postbuild import ensure_index_fields
from torchforge.proc import Runner
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.variant import Request, Selection


def _solve(channels: list[Path], specs: list[str], cache: Path) -> dict[str, str]:
    return {r.name: f"{r.version}-{r.build}" for r in solve([c.as_uri() for c in channels], specs, cache=cache)}


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The companions of a CUDA 12.4 and a cpu PyTorch 2.5.1, built by `torchforge build` with rattler-build."""
    out = tmp_path_factory.mktemp("companions") / "channel"
    tmpdir = tmp_path_factory.mktemp("tmpdir")
    # Only the companions are built: --magma-only would skip them, so the pytorch steps fail fast on the
    # missing source; the companions are built first and published regardless (--keep-going).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmpdir))
        # Python caches its temporary folder at first use: without this, whether torchforge's own scratch lands
        # in `tmpdir` would depend on whether an earlier test in the process asked for it (issue 25 item 13).
        patch.setattr(tempfile, "tempdir", None)
        main(["build", "--pytorch", "2.5.1", "--cuda", "12.4,cpu", "--py", "3.12", "--engine", "rattler-build",
              "--skip-preflight", "--keep-going", "--no-test", "--source", str(out.parent / "no-such-source"),
              "--out", str(out), "--env", "USE_MAGMA=0"])
    # Four engine runs left nothing in the temporary folder (py-rattler-build's own leftovers included); torchforge's
    # private folder (fileops.private_root, kept for the next run) may be there, empty.
    private = tmpdir / f"torchforge-{os.getuid()}"
    assert sorted(p.name for p in tmpdir.iterdir() if p != private) == []
    assert not private.exists() or list(private.iterdir()) == []
    return out


def test_companions_follow_each_era() -> None:
    names = lambda *requests: [c.id for c in companions_for(classify(r) for r in requests)]  # noqa: E731
    assert names(Request("2.5.1", "12.4", "3.12", "linux-64"), Request("2.5.1", "cpu", "3.12", "linux-64")) == [
        "pytorch-mutex-1.0-cuda-noarch", "pytorch-cuda-12.4-7-linux_64", "pytorch-mutex-1.0-cpu-noarch",
        "cpuonly-2.0-0-noarch"]
    assert names(Request("1.12.1", "11.3", "3.10", "linux-64")) == ["pytorch-mutex-1.0-cuda-noarch"]  # cudatoolkit era
    assert names(Request("1.7.1", "cpu", "3.8", "linux-64")) == ["cpuonly-1.0-0-noarch"]  # features era
    assert names(Request("2.2.2", "cpu", "3.10", "osx-64")) == []  # `# [not osx]`
    win = pytorch_cuda(tables.load(), "12.4", "win-64")
    assert "libcublas-dev >=12.4.5.8,<12.5.2.13" in win.run and win.official


def test_pytorch_cuda_for_a_cuda_upstream_never_published() -> None:
    companion = pytorch_cuda(tables.load(), "12.6", "linux-64")
    assert not companion.official and companion.run[0] == "cuda-version >=12.6,<12.7"
    assert "libcublas" in companion.run
    (cuda126,) = [c for c in plan(Selection("2.6.0", ("12.6",), ("3.12",), "linux-64")).companions
                  if c.name == "pytorch-cuda"]
    assert cuda126.version == "12.6"


def test_build_plans_the_companions_and_publishes_them(channel: Path) -> None:
    noarch = sorted(p.name for p in (channel / "noarch").glob("*.conda"))
    assert noarch == ["cpuonly-2.0-0.conda", "pytorch-mutex-1.0-cpu.conda", "pytorch-mutex-1.0-cuda.conda"]
    assert [p.name for p in (channel / "linux-64").glob("pytorch-cuda-*.conda")] == ["pytorch-cuda-12.4-7.conda"]


def test_rerun_reuses_the_companions(channel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["build", "--pytorch", "2.5.1", "--cuda", "12.4,cpu", "--py", "3.12", "--engine", "rattler-build",
          "--dry-run", "--out", str(channel), "--env", "USE_MAGMA=0"])
    err = capsys.readouterr().err
    assert "reuse pytorch-mutex-1.0-cuda: already in" in err and "reuse cpuonly-2.0-0: already in" in err


def test_py_rattler_solves_the_companions_with_pytorch_fixtures(channel: Path, tmp_path: Path) -> None:
    # pytorch fixtures with the official dependency shape of 2.5.1 (cuda: mutex cuda + pytorch-cuda, cpuonly <0;
    # cpu: mutex cpu); stand-ins for NVIDIA's CUDA libraries at the lower bound of each pin.
    extra = tmp_path / "extra"
    make_package(extra / "linux-64", "pytorch", "2.5.1", "py3.12_cuda12.4_cudnn9.1.0_0",
                 depends=["pytorch-mutex ==1.0 cuda", "pytorch-cuda >=12.4,<12.5"])
    make_package(extra / "linux-64", "pytorch", "2.5.1", "py3.12_cpu_0", depends=["pytorch-mutex ==1.0 cpu"])
    for spec in pytorch_cuda(tables.load(), "12.4", "linux-64").run:
        name, bounds = spec.split(" ", 1)
        make_package(extra / "linux-64", name, bounds.split(",")[0].lstrip(">="), "stub_0")
    index(extra)
    cache = tmp_path / "cache"
    cuda = _solve([channel, extra], ["pytorch", "pytorch-cuda 12.4.*"], cache)
    assert cuda["pytorch"] == "2.5.1-py3.12_cuda12.4_cudnn9.1.0_0"
    assert cuda["pytorch-mutex"] == "1.0-cuda" and cuda["pytorch-cuda"] == "12.4-7" and "libcublas" in cuda
    cpu = _solve([channel, extra], ["pytorch", "cpuonly"], cache)
    assert cpu["pytorch"] == "2.5.1-py3.12_cpu_0" and cpu["pytorch-mutex"] == "1.0-cpu" and cpu["cpuonly"] == "2.0-0"


def test_built_companions_carry_upstreams_track_features(channel: Path) -> None:
    # rattler-build names its own down-prioritising feature; the pipeline writes upstream's into index.json.
    assert localchannel.info_json(channel / "noarch" / "cpuonly-2.0-0.conda", "index.json")["track_features"] == "cpuonly"
    mutex_cpu = localchannel.info_json(channel / "noarch" / "pytorch-mutex-1.0-cpu.conda", "index.json")
    assert mutex_cpu["track_features"] == "pytorch-mutex" and mutex_cpu["build_number"] == 0
    mutex_cuda = localchannel.info_json(channel / "noarch" / "pytorch-mutex-1.0-cuda.conda", "index.json")
    assert not mutex_cuda.get("track_features") and mutex_cuda["build_number"] == 100


def test_features_era_cpu_package_gets_the_cpuonly_feature(tmp_path: Path) -> None:
    # A CPU pytorch of the features era (<= 1.9) built by an engine that cannot write `features`.
    package = make_package(tmp_path, "pytorch", "1.7.1", "py3.8_cpu_0")
    assert ensure_index_fields(package, (("features", "cpuonly"),), Runner()) == package
    written = localchannel.info_json(package, "index.json")
    assert written["features"] == "cpuonly"
    # the payload and the rest of the metadata are untouched
    assert written["build"] == "py3.8_cpu_0"


def test_companion_meta_yaml_carries_upstreams_definition(tmp_path: Path) -> None:
    from ruamel.yaml import YAML

    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4,cpu", "--py", "3.12", "--companions",
                 "--out", str(tmp_path / "r")]) == 0
    load = lambda folder: YAML(typ="safe").load((tmp_path / "r" / folder / "meta.yaml").read_text())  # noqa: E731
    cuda_mutex = load("pytorch-mutex-1.0-cuda-noarch")
    assert cuda_mutex["build"] == {"number": 100, "string": "cuda", "noarch": "generic",
                                   "run_exports": ["pytorch-mutex ==1.0 cuda"]}
    assert load("pytorch-mutex-1.0-cpu-noarch")["build"]["track_features"] == ["pytorch-mutex"]
    cpuonly = load("cpuonly-2.0-0-noarch")
    assert cpuonly["build"]["track_features"] == ["cpuonly"] and cpuonly["requirements"]["run"] == ["pytorch-mutex ==1.0 cpu"]
    pytorch_cuda_meta = load("pytorch-cuda-12.4-7-linux_64")
    assert pytorch_cuda_meta["package"] == {"name": "pytorch-cuda", "version": "12.4"}
    assert "libnvjitlink >=12.4.127,<12.5.40" in pytorch_cuda_meta["requirements"]["run"]
    assert not any(spec.endswith("-dev") or "-dev " in spec for spec in pytorch_cuda_meta["requirements"]["run"])


def test_this_file_passes_alone_in_a_fresh_process(tmp_path: Path) -> None:
    """Run first in its process, the `channel` fixture once failed (issue 25 item 13): what it checks must not
    depend on which tests ran before it."""
    here = Path(__file__)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                             f"--basetemp={tmp_path / 'inner'}", str(here),
                             "-k", "test_build_plans_the_companions_and_publishes_them"],
                            cwd=here.parent.parent, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
