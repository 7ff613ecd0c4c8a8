"""`torchforge repack` of a whole CUDA stack and `torchforge verify`, on stand-in wheels shaped like the
official ones (tests/standin_stack.py): both --cuda-libs modes, the consistency refusals, the solver's choice
between CUDA and CPU builds (py-rattler, with and without __cuda), and an installed prefix whose libraries
really load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standin_stack import PY, PYTAG, TORCH, Factory
from tests.rattler_in_child import solve, solve_and_install
from tests.stack_env import zlib_stand_in
from tests.stubchannel import make_stub_channel, write_stub
from tests.test_adversarial import run_main
from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import repack_stack
from torchforge.elf import read_elf
from torchforge.errors import ExitCode
from torchforge.localchannel import index
from torchforge.proc import Runner
from torchforge.rpath import audit

CF_BUILD = f"whl_cf_py{PY}_cuda12.8_cudnn9.10.2_200"
NV_BUILD = f"whl_nv_py{PY}_cuda12.8_cudnn9.10.2_200"
CPU_BUILD = f"whl_py{PY}_cpu_0"
# What a channel of pure-Python packages and python itself would give (the stand-in channel serves them).
PURE = [f"python {PY}", "filelock 3.0", "typing_extensions 4.12", "sympy 1.13.3", "numpy 2.0", "pillow 11.0"]


@pytest.fixture(scope="module")
def cuda_wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return Factory(tmp_path_factory.mktemp("cu128")).stack("cu128")


@pytest.fixture(scope="module")
def cpu_wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return Factory(tmp_path_factory.mktemp("cpu")).stack("cpu")


def _records(channel: Path) -> dict[str, dict[str, object]]:
    data = json.loads((channel / "linux-64" / "repodata.json").read_text())
    return {r["name"]: r for r in data["packages.conda"].values()}


@pytest.fixture(scope="module")
def channels(cuda_wheels: list[Path], cpu_wheels: list[Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("channels")
    for mode in CudaLibs:
        repack_stack(cuda_wheels, root / mode.value, Runner(), mode=mode)
        repack_stack(cpu_wheels, root / mode.value, Runner(), mode=mode)  # one channel: CPU and CUDA builds
    stubs = root / "stubs"
    make_stub_channel(stubs, PURE, runnable=False)
    write_stub(zlib_stand_in(), stubs / "linux-64")  # conda-forge's libzlib: lib/libz.so.1, which cuDNN links
    index(stubs)
    return {"conda-forge": root / "conda-forge", "wheels": root / "wheels", "stubs": stubs}


def test_conda_forge_mode_depends_on_conda_forge_cuda_packages_pinned_from_the_wheel(channels: dict[str, Path]) -> None:
    chan = channels["conda-forge"]
    names = sorted(p.name for p in (chan / "linux-64").glob("*.conda"))
    assert f"pytorch-{TORCH}-{CF_BUILD}.conda" in names and f"pytorch-{TORCH}-{CPU_BUILD}.conda" in names
    assert not [n for n in names if n.startswith("nvidia-")]  # the component wheels are not packaged
    data = json.loads((chan / "linux-64" / "repodata.json").read_text())["packages.conda"]
    torch = data[f"pytorch-{TORCH}-{CF_BUILD}.conda"]
    assert torch["build_number"] == 200 and torch["constrains"] == ["cpuonly <0"]
    # torch 2.10.0's own pins, as conda-forge specs; __cuda keeps it off machines without a driver.
    for spec in ("__cuda >=12", "cuda-version >=12.8,<13.0a0", "libcublas 12.8.4.1.*", "cuda-cudart 12.8.90.*",
                 "libcudnn 9.10.2.21.*", "triton ==3.6.0", "typing_extensions >=4.10.0", f"python >={PY},<3.{sys.version_info.minor + 1}.0a0"):
        assert spec in torch["depends"], (spec, torch["depends"])
    assert not any(d.startswith(("setuptools", "optree", "nvidia-")) for d in torch["depends"])
    vision = data[f"torchvision-0.25.0-whl_cf_py{PY}_cuda12.8_200.conda"]
    assert f"pytorch =={TORCH} {CF_BUILD}" in vision["depends"]  # exactly the pytorch build of the stack
    assert "cuda-cudart 12.8.90.*" in vision["depends"]  # its _C.so links libcudart.so.12
    assert not any(d.startswith("torch ") for d in vision["depends"])
    cpu = data[f"pytorch-{TORCH}-{CPU_BUILD}.conda"]
    assert cpu["build_number"] == 0 and cpu["constrains"] == ["cpuonly"]
    assert not any(d.startswith(("__cuda", "cuda-", "lib", "triton")) for d in cpu["depends"])


def test_every_package_audits_clean_and_torch_finds_cuda_in_the_environment(channels: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    from conda_package_handling import api as cph

    for archive in sorted(channels["conda-forge"].glob("linux-64/*.conda")):
        report = audit(archive)
        assert report.ok, (archive.name, report.findings)
    archive = channels["conda-forge"] / "linux-64" / f"pytorch-{TORCH}-{CF_BUILD}.conda"
    cph.extract(str(archive), dest_dir=str(tmp_path))
    lib = read_elf(tmp_path / f"lib/python{PY}/site-packages/torch/lib/libtorch_cuda.so")
    assert lib is not None and lib.rpath == ("$ORIGIN", "$ORIGIN/../../../..") and not lib.runpath
    licence = json.loads((tmp_path / "info" / "about.json").read_text())["license_file"]
    assert licence == ["LICENSE"] and (tmp_path / "info" / "licenses" / "LICENSE").is_file()


def test_wheels_mode_packages_the_components_and_keeps_their_layout(channels: dict[str, Path], tmp_path: Path) -> None:
    from conda_package_handling import api as cph

    chan = channels["wheels"]
    records = _records(chan)
    assert {"nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12", "triton"} <= set(records)
    data = json.loads((chan / "linux-64" / "repodata.json").read_text())["packages.conda"]
    torch = data[f"pytorch-{TORCH}-{NV_BUILD}.conda"]
    assert {"nvidia-cublas-cu12 ==12.8.4.1", "nvidia-cudnn-cu12 ==9.10.2.21", "__cuda >=12"} <= set(torch["depends"])
    assert not any(d.startswith(("cuda-version", "libcublas")) for d in torch["depends"])
    # cuDNN's libcudnn_graph.so.9 links libz.so.1: the package declares conda-forge's libzlib (sonames.toml);
    # the packages whose libraries link no zlib do not.
    assert "libzlib <2.0a0" in records["nvidia-cudnn-cu12"]["depends"], records["nvidia-cudnn-cu12"]["depends"]
    assert not any(d.startswith("libzlib") for n in ("nvidia-cublas-cu12", "pytorch") for d in records[n]["depends"])
    for archive in sorted(chan.glob("linux-64/*.conda")):
        report = audit(archive)
        assert report.ok, (archive.name, report.findings)
    cph.extract(str(chan / "linux-64" / f"pytorch-{TORCH}-{NV_BUILD}.conda"), dest_dir=str(tmp_path / "torch"))
    lib = read_elf(tmp_path / f"torch/lib/python{PY}/site-packages/torch/lib/libtorch_cuda.so")
    assert lib is not None and lib.rpath[:3] == ("$ORIGIN/../../nvidia/cudnn/lib", "$ORIGIN/../../nvidia/cublas/lib",
                                                 "$ORIGIN/../../nvidia/cuda_runtime/lib")
    # nvidia/__init__.py is in every component wheel; one package owns it.
    owners = []
    for name in ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12"):
        rec = records[name]
        dest = tmp_path / name
        cph.extract(str(chan / "linux-64" / f"{name}-{rec['version']}-{rec['build']}.conda"), dest_dir=str(dest))
        files = (dest / "info" / "files").read_text().split()
        owners += [name for f in files if f.endswith("site-packages/nvidia/__init__.py")]
        assert (dest / "info" / "licenses" / "LICENSE").is_file()
    assert owners == ["nvidia-cublas-cu12"]


def _solve(channels: list[Path], specs: list[str], virtual: list[str]) -> dict[str, str]:
    records = solve(channels, specs, virtual=dict(item.split("=") for item in virtual))
    return {r.name: r.build for r in records}


@pytest.mark.parametrize("mode", ["conda-forge", "wheels"])
def test_the_solver_prefers_cuda_where_a_driver_is_and_never_picks_it_without(mode: str, channels: dict[str, Path]) -> None:
    sources = [channels[mode], channels["stubs"]]
    if mode == "conda-forge":  # conda-forge's CUDA packages, as stand-ins
        extra = channels["stubs"].parent / "cf-stubs"
        if not extra.exists():
            make_stub_channel(extra, ["cuda-version 12.8", "libcublas 12.8.4.1", "cuda-cudart 12.8.90",
                                      "libcudnn 9.10.2.21"], runnable=False)
        sources.append(extra)
    with_driver = _solve(sources, ["pytorch", "torchvision", "torchaudio"], ["__cuda=12.8", "__glibc=2.28", "__unix=0"])
    flavour = "whl_cf" if mode == "conda-forge" else "whl_nv"
    assert with_driver["pytorch"] == f"{flavour}_py{PY}_cuda12.8_cudnn9.10.2_200"
    assert with_driver["torchvision"] == with_driver["torchaudio"] == f"{flavour}_py{PY}_cuda12.8_200"
    without = _solve(sources, ["pytorch", "torchvision", "torchaudio"], ["__glibc=2.28", "__unix=0"])
    assert without["pytorch"] == CPU_BUILD and without["torchvision"] == CPU_BUILD
    assert not any("cuda" in b for b in without.values()) and "triton" not in without
    old_driver = _solve(sources, ["pytorch"], ["__cuda=11.8", "__glibc=2.28", "__unix=0"])
    assert old_driver["pytorch"] == CPU_BUILD  # a CUDA 12 build is never installed on a CUDA 11 driver


@pytest.fixture(scope="module")
def wheels_prefix(channels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pytorch torchvision torchaudio` from the wheels channel, solved with __cuda and installed by py-rattler."""
    root = tmp_path_factory.mktemp("prefix")
    solve_and_install([channels["wheels"], channels["stubs"]], ["pytorch", "torchvision", "torchaudio"], root / "env",
                      virtual={"__cuda": "12.8", "__glibc": "2.28"}, cache=root)
    return root / "env"


def test_every_library_in_the_installed_prefix_resolves_inside_it_and_loads(wheels_prefix: Path) -> None:
    report = audit(wheels_prefix)
    assert report.ok, report.findings
    site = wheels_prefix / "lib" / f"python{PY}" / "site-packages"
    assert (site / "nvidia" / "cublas" / "lib" / "libcublas.so.12").is_file()
    # The loader itself, with no LD_LIBRARY_PATH: every DT_NEEDED found through the RPATHs, in the prefix.
    code = ("import ctypes, sys; ctypes.CDLL(sys.argv[1]); ctypes.CDLL(sys.argv[2]);"
            "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))")
    done = subprocess.run([sys.executable, "-c", code, str(site / "torch" / "lib" / "libtorch_python.so"),
                           str(site / "torchvision" / "_C.so")], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    loaded = {Path(p).name: p for p in done.stdout.split()}
    for name in ("libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libcudnn.so.9", "libc10.so"):
        assert loaded[name].startswith(str(wheels_prefix)), (name, loaded.get(name))


def test_verify_checks_the_prefix_from_the_inside(wheels_prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_main(["verify", str(wheels_prefix), "--python", sys.executable, "--want", "cuda"], capsys)
    # No GPU here: the CUDA build is there and loads its CUDA libraries from the prefix only.
    assert code == 0, text
    for line in ("torch loads from the prefix │ ok", "a CUDA build is installed │ ok │ CUDA 12.8",
                 "torch, torchvision, torchaudio agree on the build │ ok │ torch cu128, torchaudio cu128, torchvision cu128",
                 "every CUDA library loaded comes from the prefix │ ok │ 4 loaded, all inside"):
        assert line in text, text


def test_verify_fails_when_a_cuda_library_comes_from_outside_the_prefix(
        wheels_prefix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # As a system CUDA on LD_LIBRARY_PATH would, or a pip nvidia-* wheel elsewhere: preloaded from outside.
    site = wheels_prefix / "lib" / f"python{PY}" / "site-packages"
    outside = tmp_path / "libcudart.so.12"
    outside.write_bytes((site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12").read_bytes())
    monkeypatch.setenv("LD_PRELOAD", str(outside))
    code, text = run_main(["verify", str(wheels_prefix), "--python", sys.executable, "--want", "cuda"], capsys)
    assert code == ExitCode.AUDIT_FAILED, text
    assert f"every CUDA library loaded comes from the prefix │ FAILED │ {outside}" in text


def test_verify_fails_on_a_cpu_build_where_cuda_is_wanted(channels: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    solve_and_install([channels["wheels"], channels["stubs"]], ["pytorch"], tmp_path / "env", cache=tmp_path)
    code, text = run_main(["verify", str(tmp_path / "env"), "--python", sys.executable, "--want", "cuda"], capsys)
    assert code == ExitCode.AUDIT_FAILED, text
    assert "torch is a CPU build where CUDA was wanted" in text


# --------------------------------------------------------------------------------------------- refusals


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], chan: Path) -> str:
    code, text = run_main([*argv, "--out", str(chan)], capsys)
    assert code == ExitCode.USAGE, text
    assert not chan.exists(), "a refused repack wrote to the channel"
    return text


def test_a_torchaudio_for_another_cuda_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = Factory(tmp_path / "w")
    wheels = factory.stack("cu128")
    other = Factory(tmp_path / "other", factory.libs).torchaudio("cu130")
    text = _refused(["repack", *[str(w) for w in wheels if "torchaudio" not in w.name], str(other)], capsys,
                    tmp_path / "chan")
    assert f"{other.name} is a cu130 build, torch-{TORCH}-3-{PYTAG}-{PYTAG}-manylinux_2_28_x86_64.whl a cu128 build" in text


def test_a_cpu_torchvision_next_to_a_cuda_torch_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = Factory(tmp_path / "w")
    wheels = factory.stack("cu128")
    cpu_vision = Factory(tmp_path / "cpu", factory.libs).torchvision("cpu")
    text = _refused(["repack", *[str(w) for w in wheels if "torchvision" not in w.name], str(cpu_vision)], capsys,
                    tmp_path / "chan")
    assert "is a cpu build" in text


def test_wheels_for_another_python_or_torch_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = Factory(tmp_path / "w")
    wheels = factory.stack("cu128")
    vision = Factory(tmp_path / "v", factory.libs).torchvision("cu128", torch_pin="2.9.1")
    text = _refused(["repack", *[str(w) for w in wheels if "torchvision" not in w.name], str(vision)], capsys,
                    tmp_path / "chan")
    assert "requires torch==2.9.1" in text
    torch312 = Factory(tmp_path / "py", factory.libs).torch("cu128", python_tag="cp312")
    text = _refused(["repack", str(torch312), *[str(w) for w in wheels if not w.name.startswith("torch-")]], capsys,
                    tmp_path / "chan")
    assert "is for Python 3.12" in text or f"is for Python {PY}" in text


def test_wheels_mode_refuses_a_missing_component_wheel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheels = Factory(tmp_path / "w").stack("cu128")
    text = _refused(["repack", *[str(w) for w in wheels if "cudnn" not in w.name], "--cuda-libs", "wheels"], capsys,
                    tmp_path / "chan")
    assert "--cuda-libs wheels needs the nvidia-cudnn-cu12==9.10.2.21 wheel" in text


def test_two_torch_wheels_or_none_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = Factory(tmp_path / "w")
    wheels = factory.stack("cu128")
    cpu = Factory(tmp_path / "cpu", factory.libs).torch("cpu")
    assert "2 wheels of torch" in _refused(["repack", *map(str, wheels), str(cpu)], capsys, tmp_path / "chan")
    assert "no torch wheel" in _refused(["repack", *[str(w) for w in wheels if not w.name.startswith("torch-")]],
                                        capsys, tmp_path / "chan")


def test_a_rerun_reuses_what_was_repacked_from_the_same_wheels(cpu_wheels: list[Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["repack", *map(str, cpu_wheels), "--out", str(tmp_path / "chan")]
    code, text = run_main(argv, capsys)
    assert code == 0, text
    code, text = run_main(argv, capsys)
    assert code == 0 and text.count("reused: already repacked from this wheel") == 3, text
    code, text = run_main([*argv, "--cuda-libs", "bogus"], capsys)
    assert code == ExitCode.USAGE and "--cuda-libs bogus is not a source of CUDA libraries" in text


# ------------------------------------------------------------------------------------------------ fetching


def test_fetch_options_are_checked_before_pip_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chan = tmp_path / "chan"
    cases = [
        (["--pytorch", "2.10.0"], "--pytorch needs --py X.Y"),
        (["--pytorch", "2.10", "--py", "3.12"], "--pytorch 2.10 is not a release version"),
        (["--pytorch", "2.10.0", "--py", "3.12", "--with", "torchvision,numpy"], "numpy is not part of a PyTorch stack"),
        (["--cuda", "12.8"], "go with --pytorch"),
        ([], "no wheels given"),
    ]
    for argv, words in cases:
        text = _refused(["repack", *argv, "--wheel-dir", str(tmp_path / "w")], capsys, chan)
        assert words in text, (argv, text)
    assert not (tmp_path / "w").exists()


def test_the_served_cuda_build_must_be_the_one_asked_for() -> None:
    from torchforge.commands.binaries import _check_cuda
    from torchforge.errors import UsageError

    _check_cuda("12.8", "12.8", "https://files.pythonhosted.org")
    _check_cuda("cpu", None, "https://download.pytorch.org")
    with pytest.raises(UsageError) as refused:
        _check_cuda("12.6", "12.8", "https://files.pythonhosted.org")
    assert refused.value.message == "https://files.pythonhosted.org served CUDA 12.8 of torch, not 12.6"
    assert refused.value.hint is not None and "https://download.pytorch.org/whl/cu126" in refused.value.hint


# What the stack's resolve leaves to the user's channels (pure Python, or Pillow and NumPy, which conda channels have).
FROM_USERS_CHANNELS = {"cuda-pathfinder", "filelock", "fsspec", "jinja2", "markupsafe", "mpmath", "networkx", "numpy",
                       "pillow", "sympy", "typing-extensions"}


def test_pip_resolves_the_recorded_stack_with_its_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolve step (pip's metadata-only `install --dry-run --report`) on PyPI's answer for torch 2.10.0 +
    CUDA 12.8 + torchvision + torchaudio for Python 3.12, as recorded (tests/recorded_index.py; `make
    live-index-check` compares the record with PyPI today), served to pip as a local index: every wheel repack
    needs, none it does not, each with the index's sha256."""
    from packaging.utils import canonicalize_name

    from tests import recorded_index
    from torchforge.binaries import fetch

    record = recorded_index.recorded()
    index_url = recorded_index.write_index(record, tmp_path / "index")
    aside = recorded_index.pip_config_set_aside(os.environ)
    for name in set(os.environ) - set(aside):
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", aside["PIP_CONFIG_FILE"])
    request = recorded_index.REQUEST
    (tmp_path / "work").mkdir()
    planned = fetch.resolve(fetch.Request(request.pytorch, request.python, request.cuda, request.companions, index_url),
                            tmp_path / "work", Runner())
    answer = {canonicalize_name(e["name"]): e for e in record["install"]}
    assert FROM_USERS_CHANNELS < set(answer)  # pip resolved them too; repack leaves them out
    assert {p.project for p in planned} == set(answer) - FROM_USERS_CHANNELS
    for item in planned:
        assert (item.filename, item.sha256) == (answer[item.project]["filename"], answer[item.project]["sha256"])
        assert item.url.startswith(index_url.removesuffix("simple")), item.url  # from the recorded index, not PyPI
    names = {p.project: p.filename for p in planned}
    assert names["torch"].startswith("torch-2.10.0-") and names["torch"].endswith("-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert names["torchvision"].startswith("torchvision-0.25.0-cp312") and names["triton"].startswith("triton-3.6.0-cp312")
    assert names["nvidia-cublas-cu12"].startswith("nvidia_cublas_cu12-12.8.4.1-")


def test_the_recorded_index_names_what_changed_on_pypi() -> None:
    """`make live-index-check`'s comparison: a rebuilt wheel (a new build tag, another sha256), a new dependency
    and one gone are each named."""
    from tests import recorded_index

    record = recorded_index.recorded()
    assert recorded_index.differences(record, record) == []
    changed = json.loads(json.dumps(record))
    torch = next(e for e in changed["install"] if e["name"] == "torch")
    torch["filename"] = "torch-2.10.0-99-cp312-cp312-manylinux_2_28_x86_64.whl"
    torch["sha256"] = "0" * 64
    changed["install"] = [e for e in changed["install"] if e["name"] != "mpmath"]
    changed["install"].append({"name": "new-dep", "version": "1.0", "filename": "new_dep-1.0-py3-none-any.whl"})
    found = recorded_index.differences(changed, record)
    assert "new-dep: new today (new_dep-1.0-py3-none-any.whl)" in found
    assert any(line.startswith("mpmath: no longer resolved") for line in found)
    assert any(line.startswith("torch: filename ") and "2.10.0-99-" in line for line in found)
    assert any(line.startswith("torch: sha256 ") for line in found) and len(found) == 4


# ------------------------------------------------------------------------------------------------- CUDA 13

# cuda-toolkit 13.0.2's METADATA lines for the extras the stand-in torch asks for (PyPI).
TOOLKIT_13 = [f"{name}=={version}.*; (sys_platform == 'linux' or sys_platform == 'win32') and extra == '{extra}'"
              for name, version, extra in (("nvidia-cublas", "13.1.0.3", "cublas"), ("nvidia-cuda-runtime", "13.0.96", "cudart"),
                                           ("nvidia-cusolver", "12.0.4.66", "cusolver"))]


@pytest.fixture(scope="module")
def cuda13_wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """torch 2.11-shaped: CUDA 13 components without -cu13 suffix sharing nvidia/cu13/lib, pinned through
    cuda-toolkit[...] extras; torchvision's bundled libcudart copy keeps SONAME libcudart.so.13."""
    from tests.standin_stack import Lib, write_wheel

    out = tmp_path_factory.mktemp("cu130")
    f = Factory(out)
    common = {"nvidia/__init__.py": b"", "nvidia/cu13/__init__.py": b""}
    tag = "py3-none-manylinux2014_x86_64"
    wheels = [
        write_wheel(out, "nvidia_cuda_runtime", "13.0.96", tag, {**common, "nvidia/cu13/lib/libcudart.so.13": f.lib(Lib("libcudart.so.13"))}, []),
        write_wheel(out, "nvidia_cublas", "13.1.0.3", tag, {**common, "nvidia/cu13/lib/libcublas.so.13": f.lib(Lib("libcublas.so.13", rpath="$ORIGIN", runpath=True))}, []),
        # cusolver links cuBLAS, in the folder it shares with it, and declares no requirement on it
        write_wheel(out, "nvidia_cusolver", "12.0.4.66", tag, {**common, "nvidia/cu13/lib/libcusolver.so.12": f.lib(Lib("libcusolver.so.12", ("libcublas.so.13",), "$ORIGIN", True))}, []),
        write_wheel(out, "cuda_toolkit", "13.0.2", "py2.py3-none-any", {}, TOOLKIT_13),
    ]
    torch_files = {"torch/version.py": b"__version__ = '2.11.0+cu130'\ncuda = '13.0'\n",
                   "torch/lib/libc10.so": f.lib(Lib("libc10.so", rpath="$ORIGIN")),
                   "torch/lib/libtorch_cuda.so": f.lib(Lib("libtorch_cuda.so", ("libc10.so", "libcudart.so.13", "libcusolver.so.12"),
                                                          "$ORIGIN/../../nvidia/cu13/lib:$ORIGIN"))}
    wheels.append(write_wheel(out, "torch", "2.11.0", f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", torch_files,
                              ['cuda-toolkit[cublas,cudart,cusolver]==13.0.2; platform_system == "Linux"']))
    vision = {"torchvision/version.py": b"__version__ = '0.26.0+cu130'\n",
              "torchvision.libs/libcudart.faf08d9a.so.13": f.lib(Lib("libcudart.faf08d9a.so.13", soname="libcudart.so.13")),
              "torchvision/_C.so": f.lib(Lib("_C.so", ("libc10.so", "libcudart.so.13")))}
    wheels.append(write_wheel(out, "torchvision", "0.26.0", f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", vision, ["torch (==2.11.0)"]))
    return wheels


def test_a_cuda13_stack_pins_through_the_toolkit_extras_and_audits_clean(cuda13_wheels: list[Path], tmp_path: Path) -> None:
    for mode in CudaLibs:
        result = repack_stack(cuda13_wheels, tmp_path / mode.value, Runner(), mode=mode)
        for package in result.packages:
            report = audit(package.archive)
            assert report.ok, (package.archive.name, report.findings)
    cf = _records(tmp_path / "conda-forge")
    assert {"libcublas 13.1.0.3.*", "cuda-cudart 13.0.96.*", "libcusolver 12.0.4.66.*", "__cuda >=13",
            "cuda-version >=13.0,<14.0a0"} <= set(cf["pytorch"]["depends"])
    assert cf["pytorch"]["build"] == f"whl_cf_py{PY}_cuda13.0_200"
    nv = _records(tmp_path / "wheels")
    assert {"nvidia-cublas ==13.1.0.3", "nvidia-cusolver ==12.0.4.66"} <= set(nv["pytorch"]["depends"])
    # cusolver's own link to cuBLAS becomes a run requirement; torchvision's _C.so needs the real libcudart.so.13
    assert "nvidia-cublas ==13.1.0.3" in nv["nvidia-cusolver"]["depends"]
    assert "nvidia-cuda-runtime ==13.0.96" in nv["torchvision"]["depends"]
    assert "cuda-toolkit" not in nv  # metadata only: its pins are used, it is not packaged
