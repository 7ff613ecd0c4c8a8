"""The isolated build's one route (torchforge/cacherelay.py, torchforge/isolation_child.py): a command in the real
namespaces of torchforge/isolation.py reaches a real HTTP server outside through the relay, by the URL's own host
and port (this machine's host name, and an IPv4 literal that is not the loopback), and nothing else: without the
relay, or at another port, the connection fails."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_have_pytorch_stack import repacked  # noqa: F401 (the repacked torch 2.13.0 and its stand-ins)
from torchforge import isolation
from torchforge.cacherelay import RELAY_VARIABLE, endpoint, relay
from torchforge.proc import Command, Runner
from torchforge.remotecache import RemoteCache

pytestmark = pytest.mark.skipif(isolation._unavailable() is not None, reason="this machine cannot isolate")

FETCH = """\
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except OSError as exc:
    print(f"unreachable: {exc}")
"""


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        body = f"entry {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """A real HTTP server on every address of this machine (outside any namespace)."""
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _fetch_isolated(url: str, env: dict[str, str], tmp_path: Path) -> str:
    command = isolation.wrap(Command((sys.executable, "-c", FETCH, url), env=env), [tmp_path / "w"])
    return Runner().run(command).output.strip()


def _outside_address() -> str | None:
    """An IPv4 address of this machine that is not the loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a datagram socket's connect
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_isolated_command_reaches_the_server_by_its_host_name_and_nothing_else(server: int, tmp_path: Path) -> None:
    host = socket.gethostname()
    url = f"http://{host}:{server}/ccache/ab/cdef"
    assert _fetch_isolated(url, {}, tmp_path).startswith("unreachable"), "no relay: no network"
    with relay(RemoteCache(f"http://{host}:{server}/ccache")) as variables:
        assert variables[RELAY_VARIABLE].startswith(f"{host} {server} ")
        assert _fetch_isolated(url, variables, tmp_path) == "entry /ccache/ab/cdef"
        other = f"http://{host}:{server + 1 if server < 65535 else server - 1}/x"
        assert _fetch_isolated(other, variables, tmp_path).startswith("unreachable"), "only the server's port"


def test_an_ipv4_literal_that_is_not_the_loopback_is_relayed_too(server: int, tmp_path: Path) -> None:
    address = _outside_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but the loopback")
    with relay(RemoteCache(f"http://{address}:{server}/c")) as variables:
        assert _fetch_isolated(f"http://{address}:{server}/c/01/23", variables, tmp_path) == "entry /c/01/23"


def test_what_needs_no_relay_gets_none() -> None:
    assert endpoint(RemoteCache("redis+unix:/run/redis.sock")) is None
    assert endpoint(RemoteCache("redis://:${CACHE_TOKEN}@cache.example")) == ("cache.example", 6379)
    assert endpoint(RemoteCache("https://cache.example/ccache")) == ("cache.example", 443)
    with relay(None) as variables:
        assert variables == {RELAY_VARIABLE: ""}


KERNEL_SETUP = '''\
from setuptools import Extension, setup

setup(ext_modules=[Extension("relayed._units", [f"src/u{i}.c" for i in range(3)] + ["src/module.c"])],
      packages=["relayed"])
'''
KERNEL_MODULE = '''\
#include <Python.h>
static struct PyModuleDef units = {PyModuleDef_HEAD_INIT, "_units", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__units(void) { return PyModule_Create(&units); }
'''


def _small_c_sdist(tmp_path: Path) -> Path:
    """An sdist whose setup.py compiles four C files (through the compile cache's CC wrapper)."""
    import tarfile
    tree = tmp_path / "relayed-1.0"
    (tree / "src").mkdir(parents=True)
    (tree / "relayed").mkdir()
    (tree / "relayed" / "__init__.py").write_text("")
    for i in range(3):
        (tree / "src" / f"u{i}.c").write_text(f"int relayed_unit_{i}(int x) {{ return x * {i + 2}; }}\n")
    (tree / "src" / "module.c").write_text(KERNEL_MODULE)
    (tree / "setup.py").write_text(KERNEL_SETUP)
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools", "wheel"]\nbuild-backend = '
                                         '"setuptools.build_meta"\n\n[project]\nname = "relayed"\nversion = "1.0"\n')
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: relayed\nVersion: 1.0\n")
    sdist = tmp_path / "relayed-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(tree, arcname=tree.name)
    return sdist


@pytest.mark.slow
def test_a_second_runners_isolated_extension_build_takes_its_objects_from_the_server(
        repacked: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 42: two runners (clean output and cache folders) build the same sdist for the repacked torch with the
    real rattler-build, the sdist's pip isolated; the server is this machine's host name, as a team's would be. The
    second takes every object from the server (before the relay: "could not reach the server" for every call)."""
    from tests.test_remote_cache import serve
    from tests.test_upload_helpers import cli
    torch_channel, stubs = repacked
    sdist = _small_c_sdist(tmp_path)
    with serve() as (url, store):
        url = url.replace("127.0.0.1", socket.gethostname())
        said = []
        for runner in ("runner1", "runner2"):
            root = tmp_path / runner
            done = cli("build", "--for", "pytorch ==2.13.0 whl_*", "--channel", str(torch_channel), "--channel",
                       str(stubs), "--extension", str(sdist), "--engine", "rattler-build", "--skip-preflight",
                       "--out", str(root / "out"), "--cache", str(root / "cache"), "--cache-url", url,
                       env={"XDG_CACHE_HOME": str(root / "xdg")}, timeout=1200)
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            (log,) = (root / "out" / "logs").glob("relayed-1.0-*.log")
            said.append(" ".join(log.read_text().split()))
        assert store.puts, "the first runner wrote its objects to the server"
        assert "remote 0/4 hits" in said[0] and "could not reach" not in said[0], said[0][-2000:]
        assert "remote 4/4 hits (100 %)" in said[1], said[1][-2000:]
