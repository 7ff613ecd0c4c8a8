"""The prefix audit (`torchforge rpath audit PREFIX`, and tests/stack_env.py's) flags a library that resolves only
because a package the linking package does not declare happens to bring it (issue 34 item 24: cuDNN's libz.so.1,
there only because python brought zlib). A real ELF file built with gcc links the host's libz; the packages are
installed by py-rattler (in its child process) from a channel of stand-ins made here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stack_env import zlib_stand_in
from tests.standin_stack import PINS, PY, Lib, build_lib
from tests.stubchannel import Stub, write_stub
from tests.test_upload_helpers import cli
from torchforge.localchannel import index
from torchforge.rattlerchild import call
from torchforge.rpath import Kind, audit

CUDNN = "nvidia-cudnn-cu12"
GRAPH = "lib/libcudnn_graph.so.9"
VIRTUAL = {"__glibc": "2.28", "__unix": "0", "__linux": "6.0"}
# Who declares libzlib: nobody but an unrelated package (the bug), python (cuDNN reaches it through its own
# requirement), or cuDNN itself.
SHAPES = {
    "brought-by-another": {CUDNN: ("python",), "python": (), "bystander": ("libzlib",)},
    "through-python": {CUDNN: ("python",), "python": ("libzlib",), "bystander": ()},
    "direct": {CUDNN: ("python", "libzlib"), "python": (), "bystander": ()},
}


@pytest.fixture(scope="module")
def graph_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """libcudnn_graph.so.9 as a repacked package holds it for this purpose: an ELF shared library whose DT_NEEDED
    names libz.so.1, with DT_RPATH $ORIGIN (libz is found beside it, in the prefix's lib/)."""
    work = tmp_path_factory.mktemp("graph")
    (work / "search").mkdir()
    return build_lib(Lib("libcudnn_graph.so.9", ("libz.so.1",), "$ORIGIN"), work, work / "search")


def installed_prefix(shape: str, graph: bytes, root: Path) -> Path:
    channel = root / "channel"
    depends = SHAPES[shape]
    write_stub(Stub(CUDNN, PINS[CUDNN], files={GRAPH: graph}, depends=depends[CUDNN]), channel / "linux-64")
    write_stub(Stub("python", PY, depends=depends["python"]), channel / "linux-64")
    write_stub(Stub("bystander", "1.0", depends=depends["bystander"]), channel / "linux-64")
    write_stub(zlib_stand_in(), channel / "linux-64")
    index(channel)
    prefix = root / "env"
    names = call("tests.stack_env:solve_and_install", [channel], [CUDNN, "bystander"], VIRTUAL, prefix)
    assert "libzlib" in names, names  # in every shape the library is there: only who declares it differs
    return prefix


def test_a_library_brought_by_an_undeclared_package_fails_the_prefix_audit(graph_library: bytes,
                                                                           tmp_path: Path) -> None:
    prefix = installed_prefix("brought-by-another", graph_library, tmp_path)
    report = audit(prefix)
    assert [(f.file, f.kind) for f in report.findings] == [(GRAPH, Kind.UNDECLARED)], report.findings
    assert report.findings[0].detail == (f"libz.so.1 comes from libzlib, which {CUDNN} does not declare "
                                         "(neither directly nor through its requirements)")
    # The loader itself would find it (in the environment's lib/): what fails is only the declaration.
    graph = next(f for f in report.files if f.file == GRAPH)
    assert [(r.needed, r.where) for r in graph.resolutions if r.needed == "libz.so.1"] == [("libz.so.1", "env")]
    result = cli("rpath", "audit", str(prefix))
    assert result.returncode == 8, result.stdout + result.stderr
    assert "libz.so.1 comes from libzlib" in " ".join((result.stdout + result.stderr).split())


@pytest.mark.parametrize("shape", ["through-python", "direct"])
def test_a_library_from_a_declared_package_passes(shape: str, graph_library: bytes, tmp_path: Path) -> None:
    report = audit(installed_prefix(shape, graph_library, tmp_path))
    assert report.ok, report.findings
