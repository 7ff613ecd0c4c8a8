"""Wheel repair: manylinux tag from GLIBC versions, local version, RECORD, pip install + import in a fresh venv."""

from __future__ import annotations

import base64
import csv
import hashlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from torchforge.elf import read_elf
from torchforge.proc import Runner
from torchforge.rpath import Layout
from torchforge.wheel import WheelName, manylinux_tag, repair, required_glibc

HERE = Path(__file__).parent / "fixtures" / "elf"
PYTAG = f"cp{sys.version_info.major}{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the extension fixture")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_hello_wheel(out: Path, name: str = "hello") -> Path:
    """NAME-1.0-cpXY-cpXY-linux_x86_64.whl: a package with a C extension needing libm (RUNPATH $ORIGIN).
    `name="torch"` makes the smallest wheel `repack` accepts."""
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    so = out / f"_hello{ext_suffix}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{sysconfig.get_paths()['include']}", str(HERE / "hello.c"),
                    "-o", str(so), "-lm", "-Wl,--enable-new-dtags,-rpath,$ORIGIN"], check=True, capture_output=True)
    dist = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"from {name}._hello import answer\n".encode(),
        f"{name}/_hello{ext_suffix}": so.read_bytes(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {PYTAG}-{PYTAG}-linux_x86_64\n".encode(),
    }
    if name == "torch":  # repack reads the build (+cpu) from version.py, as official wheels carry it
        files[f"{name}/version.py"] = b"__version__ = '1.0+cpu'\n"
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items()) + f"{dist}/RECORD,,\n"
    wheel = out / f"{name}-1.0-{PYTAG}-{PYTAG}-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            zf.writestr(info, data)
        zf.writestr(f"{dist}/RECORD", record)
    return wheel


def test_repair_tags_versions_records_and_installs(tmp_path: Path) -> None:
    wheel = build_hello_wheel(tmp_path)
    repaired = repair(wheel, tmp_path / "out", Runner(), local="cpu", layout=Layout.WHEEL_BUNDLED)
    name = WheelName.parse(repaired.name)
    assert name.version == "1.0+cpu" and name.python == PYTAG and name.platform.startswith("manylinux_2_")
    assert not any(p.name.startswith(".torchforge-tmp-") for p in repaired.parent.iterdir())
    with zipfile.ZipFile(repaired) as zf:
        names = zf.namelist()
        assert "hello-1.0+cpu.dist-info/RECORD" in names and not any(n.startswith("hello-1.0.dist-info") for n in names)
        assert f"Tag: {PYTAG}-{PYTAG}-{name.platform}" in zf.read("hello-1.0+cpu.dist-info/WHEEL").decode()
        assert "Version: 1.0+cpu" in zf.read("hello-1.0+cpu.dist-info/METADATA").decode()
        rows = list(csv.reader(zf.read("hello-1.0+cpu.dist-info/RECORD").decode().splitlines()))
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = zf.read(path)
            assert digest == _record_hash(data) and int(size) == len(data), path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip from this interpreter installs into the fresh venv (--python); nothing else is in that venv.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-index", "--no-deps", str(repaired)], check=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import hello; print(hello.answer())"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"


def test_manylinux_tag_follows_the_highest_glibc_symbol(tmp_path: Path) -> None:
    wheel = build_hello_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "tree")
    so = next((tmp_path / "tree" / "hello").glob("_hello*.so"))
    info = read_elf(so, glibc=True)
    assert info is not None and info.glibc is not None and info.glibc >= (2, 26)  # reallocarray
    expected = max(info.glibc, (2, 17))
    assert manylinux_tag(tmp_path / "tree") == f"manylinux_{expected[0]}_{expected[1]}_x86_64"


def test_torch_wheel_needs_glibc_2_28(torch_wheel: Path, tmp_path: Path) -> None:
    # The official torch 2.13 CPU wheel is tagged manylinux_2_28: the computed tag must agree.
    assert "manylinux_2_28_x86_64" in torch_wheel.name
    with zipfile.ZipFile(torch_wheel) as zf:
        for member in zf.infolist():
            if member.filename.startswith("torch/lib/") and member.filename.endswith(".so"):
                zf.extract(member, tmp_path)
    assert required_glibc(tmp_path) == (2, 28)
