"""`rpath fix --layout conda` and `rpath audit` on a C++-only conda package shaped like libtorch (lib/*.so,
bin/*, no site-packages): the entries come from each file's own depth below the prefix, and an entry that
resolves outside the prefix is flagged (issue 34 item 8). Real ELF files built with gcc
(tests/fixtures/elf), in a real .conda made by conda-package-handling."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conda_package_handling import api as cph

from torchforge.cli import main
from torchforge.elf import read_elf
from torchforge.errors import ExitCode
from torchforge.proc import Runner
from torchforge.rpath import Kind, Layout, audit
from torchforge.rpath.fix import find_patchelf

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "elf"))
import elf_fixtures as fx  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the ELF fixtures")
STEM = "libtorch-2.13.0-cpu_generic_h0000000_0"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> fx.Built:
    return fx.compile_all(tmp_path_factory.mktemp("elf-built"))


def libtorch_conda(built: fx.Built, where: Path, lib_rpath: str | None = None) -> Path:
    """A libtorch-shaped .conda: lib/libfoo.so, lib/libbar.so (needs libfoo.so), bin/tool (needs ../lib), linked
    with DT_RUNPATH as built; `lib_rpath` sets libbar.so's DT_RPATH to that list first."""
    stage = where / "stage"
    for folder in ("lib", "bin", "info"):
        (stage / folder).mkdir(parents=True)
    for source, rel in ((built.foo, "lib/libfoo.so"), (built.bar, "lib/libbar.so"), (built.tool, "bin/tool")):
        shutil.copy2(source, stage / rel)
    if lib_rpath is not None:
        subprocess.run([find_patchelf(Runner()), "--set-rpath", lib_rpath, "--force-rpath",
                        str(stage / "lib" / "libbar.so")], check=True)
    files = ["lib/libfoo.so", "lib/libbar.so", "bin/tool"]
    paths = [{"_path": rel, "path_type": "hardlink", "size_in_bytes": (stage / rel).stat().st_size,
              "sha256": hashlib.sha256((stage / rel).read_bytes()).hexdigest()} for rel in files]
    index = {"name": "libtorch", "version": "2.13.0", "build": STEM.rsplit("-", 1)[1], "build_number": 0,
             "depends": [], "subdir": "linux-64", "platform": "linux", "arch": "x86_64"}
    (stage / "info" / "index.json").write_text(json.dumps(index))
    (stage / "info" / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
    (stage / "info" / "files").write_text("\n".join(files) + "\n")
    members = [*files, "info/index.json", "info/paths.json", "info/files"]
    out = where / "linux-64"
    out.mkdir()
    cph.create(str(stage), members, f"{STEM}.conda", out_folder=str(out))
    return out / f"{STEM}.conda"


def test_fix_writes_entries_from_each_files_depth_inside_the_prefix(built: fx.Built, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    package = libtorch_conda(built, tmp_path)
    unpacked = tmp_path / "unpacked"
    cph.extract(str(package), dest_dir=str(unpacked))
    assert main(["rpath", "fix", str(unpacked), "--layout", "conda"]) == 0, capsys.readouterr().err
    found = {rel: read_elf(unpacked / rel) for rel in ("lib/libfoo.so", "lib/libbar.so", "bin/tool")}
    rpaths = {rel: (info.rpath, info.runpath) for rel, info in found.items() if info}
    assert rpaths == {"lib/libfoo.so": (("$ORIGIN",), ()), "lib/libbar.so": (("$ORIGIN",), ()),
                      "bin/tool": (("$ORIGIN", "$ORIGIN/../lib"), ())}
    assert audit(unpacked).ok
    # the loader really finds libfoo.so beside libbar.so, and bin/tool finds it in ../lib
    assert fx.call(unpacked / "lib" / "libbar.so", "bar") == 43
    assert subprocess.run([str(unpacked / "bin" / "tool")], env={}).returncode == 0


@pytest.mark.parametrize("entry", ["$ORIGIN/../../..", "$ORIGIN/../..", "${ORIGIN}/../../lib"])
def test_audit_flags_an_entry_that_resolves_outside_the_prefix(entry: str, built: fx.Built, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    package = libtorch_conda(built, tmp_path, lib_rpath=f"$ORIGIN:{entry}")
    report = audit(package)
    assert report.layout is Layout.CONDA
    leaving = [f for f in report.findings if f.kind is Kind.LEAVES]
    assert [(f.file, f.detail.split(" -> ")[0]) for f in leaving] == [("lib/libbar.so", entry)], report.findings
    capsys.readouterr()
    assert main(["rpath", "audit", str(package)]) == ExitCode.AUDIT_FAILED
    assert entry in capsys.readouterr().out


def test_an_entry_inside_the_prefix_stays_clean(built: fx.Built, tmp_path: Path) -> None:
    package = libtorch_conda(built, tmp_path, lib_rpath="$ORIGIN:$ORIGIN/../lib")
    assert [f for f in audit(package).findings if f.file == "lib/libbar.so"] == []
