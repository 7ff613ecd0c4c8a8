"""A compile cache shared across runners (torchforge/remotecache.py): ccache's HTTP remote storage against a real
server on the loopback, which speaks what ccache's http backend expects (GET, HEAD and PUT of URL/<2 hex>/<rest
of the key>), and Redis where Debian's redis-server is installed (the suite needs no apt: without it, that check
runs against the HTTP store)."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_build import needs_nvcc
from tests.test_compile_cache import TORCH_LIKE, offline, stubs  # noqa: F401 (stubs: the stand-in channel fixture)
from torchforge.compilecache import COMPILERS_VARIABLE, CacheStats, CompileCache, find_ccache, read_stats
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.errors import UsageError
from torchforge.pipeline import Pipeline, StepResult
from torchforge.proc import Runner
from torchforge.remotecache import RemoteCache, remote_cache
from torchforge.flavours.official.render import plan
from torchforge.sequence import official_steps
from torchforge.flavours.official.variant import Options, Selection

UNITS = 10  # small C files: the second runner's share of hits is measured over these


class Store(http.server.BaseHTTPRequestHandler):
    """A cache server as a team runs one (`python -m http.server` cannot store): GET and HEAD answer what PUT stored."""

    entries: dict[str, bytes]
    puts: list[str]

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        found = self.entries.get(self.path)
        self._reply(200, found) if found is not None else self._reply(404)

    do_HEAD = do_GET

    def do_PUT(self) -> None:  # noqa: N802
        self.entries[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.puts.append(self.path)
        self._reply(201)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve() -> Iterator[tuple[str, type[Store]]]:
    """A fresh store on a free loopback port, for the time of the block (the bench's shared-cache row uses it too)."""
    handler = type("Handler", (Store,), {"entries": {}, "puts": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/ccache", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture()
def server() -> Iterator[tuple[str, type[Store]]]:
    with serve() as running:
        yield running


def _runner(root: Path, remote: RemoteCache | None, *, flags: tuple[str, ...] = ("-O2",), units: int = UNITS,
            first: int = 0) -> CacheStats:
    """One CI runner: its own clean local cache and build folder, the same sources, compiled through the CC
    wrapper the compile cache gives setuptools builds."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(root / "cache", "demo-1.0-cpu-linux_64-0123456789abcdef", ccache, remote)
    cache.prepare()
    work = root / "staging" / "work"
    work.mkdir(parents=True)
    stats_log = root / "staging" / "ccache-stats.log"
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "CXX")},
           **cache.build_env(root / "staging", stats_log), "PYTHON": "python3"}
    cc = subprocess.run(["bash", "-euc", f'. "{env[COMPILERS_VARIABLE]}/route.sh"; printf "%s" "$CC"'], env=env,
                        capture_output=True, text=True, check=True).stdout.split()[0]
    for number in range(first, first + units):
        (work / f"unit{number}.c").write_text(f"int unit{number}(int x) {{ return x * {number} + 1; }}\n")
        subprocess.run([cc, *flags, "-c", f"unit{number}.c", "-o", f"unit{number}.o"], cwd=work, env=env, check=True)
    return read_stats(stats_log, remote=remote is not None)


def test_a_second_runner_gets_its_objects_from_the_server_and_a_changed_flag_never_hits(
        server: tuple[str, type[Store]], tmp_path: Path) -> None:
    url, store = server
    remote = remote_cache(url)
    first = _runner(tmp_path / "runner1", remote)
    assert first.remote is not None and (first.remote.hits, first.remote.misses) == (0, UNITS)
    assert first.remote.writes >= UNITS and all(path.startswith("/ccache/demo-1.0-cpu-linux_64-") for path in store.puts)
    second = _runner(tmp_path / "runner2", remote)
    assert second.remote is not None and second.remote.hits >= 0.9 * UNITS and second.hits == UNITS
    assert second.summary().endswith(f"remote {second.remote.hits}/{UNITS} hits (100 %), 0 entries written")
    other = _runner(tmp_path / "runner3", remote, flags=("-O1",))
    assert other.remote is not None and other.remote.hits == 0 and other.hits == 0


def test_a_read_only_runner_uses_hits_and_adds_nothing(server: tuple[str, type[Store]], tmp_path: Path) -> None:
    url, store = server
    _runner(tmp_path / "trusted", remote_cache(url), units=2)
    stored = dict(store.entries)
    untrusted = _runner(tmp_path / "fork", remote_cache(url, read_only=True), units=4)  # 2 known, 2 new units
    assert untrusted.remote is not None and (untrusted.remote.hits, untrusted.remote.writes) == (2, 0)
    assert store.entries == stored


@needs_nvcc
def test_another_arch_list_never_hits(server: tuple[str, type[Store]], tmp_path: Path) -> None:
    url, _ = server
    ccache = find_ccache()
    assert ccache is not None

    def compile_for(root: Path, arch: str) -> CacheStats:
        cache = CompileCache(root / "cache", "k-cu130", ccache, remote_cache(url))
        cache.prepare()
        work = root / "work"
        work.mkdir(parents=True)
        (work / "k.cu").write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n")
        stats_log = root / "stats.log"
        env = {**os.environ, **cache.build_env(root, stats_log)}
        subprocess.run([env["CUDA_NVCC_EXECUTABLE"], "-c", "k.cu", "-o", "k.o", "-gencode",
                        f"arch=compute_{arch},code=sm_{arch}"], cwd=work, env=env, check=True)
        return read_stats(stats_log, remote=True)

    compile_for(tmp_path / "a", "90")
    assert compile_for(tmp_path / "b", "80").remote.hits == 0  # type: ignore[union-attr]
    assert compile_for(tmp_path / "c", "90").remote.hits == 1  # type: ignore[union-attr]


def test_the_server_down_costs_a_warning_not_the_build(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stats = _runner(tmp_path / "runner", remote_cache(f"http://127.0.0.1:{port}/ccache"), units=2)
    assert stats.misses == 2 and stats.remote is not None and stats.remote.errors == 2
    assert "2 calls could not reach the server (compiled here)" in stats.summary()


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[str, None]]:
    """Debian's redis-server on a free loopback port, nothing saved, for the time of the block."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            threading.Event().wait(0.05)
        yield f"redis://127.0.0.1:{port}", None
    finally:
        redis.terminate()
        redis.wait()


def test_a_second_runner_gets_its_objects_from_redis_where_it_is_installed(tmp_path: Path) -> None:
    """ccache's redis backend against Debian's redis-server; a machine without it (the suite needs no apt) runs
    the same check against the HTTP store instead of skipping."""
    with (redis_server() if shutil.which("redis-server") else serve()) as (url, _):
        _runner(tmp_path / "runner1", remote_cache(url))
        second = _runner(tmp_path / "runner2", remote_cache(url))
    assert second.remote is not None and second.remote.hits >= 0.9 * UNITS


def test_a_password_in_the_url_is_refused_and_a_referenced_one_never_shown() -> None:
    for url in ("redis://:hunter2@cache:6379", "https://ci:hunter2@cache.example/ccache", "redis://hunter2@cache"):
        with pytest.raises(UsageError, match="holds a password"):
            remote_cache(url)
    for url in ("ftp://cache/x", "cache.example:8080", "http:///nohost"):
        with pytest.raises(UsageError, match="is not a URL of a cache server"):
            remote_cache(url)
    remote = remote_cache("https://ci:${CACHE_TOKEN}@cache.example/ccache")
    assert remote is not None and remote.secrets({"CACHE_TOKEN": "s3cr3t"}) == ("s3cr3t",)
    assert remote.config_line("g", {"CACHE_TOKEN": "s3cr3t"}).startswith("https://ci:s3cr3t@cache.example/ccache/g|")
    with pytest.raises(UsageError, match=r"refers to \$\{CACHE_TOKEN\}, which is not set"):
        remote.config_line("g", {})
    with pytest.raises(UsageError, match="--cache-read-only needs --cache-url"):
        remote_cache(None, read_only=True)


def _torch_like(out: Path, channel: Path, remote: RemoteCache) -> StepResult:
    sel = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(source=str(TORCH_LIKE)))
    engine = RattlerBuildEngine()
    settings = offline(out, channel, force=True, remote_cache=remote)
    (result,) = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(sel), engine, settings))
                 if r.step.kind == "pytorch"]
    assert result.ok and result.log is not None, result.error
    return result


@pytest.mark.slow
def test_two_clean_output_folders_share_the_servers_objects_and_the_log_never_holds_the_token(
        server: tuple[str, type[Store]], stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url, _ = server
    monkeypatch.setenv("CACHE_TOKEN", "t0ken-of-the-ci")
    remote = remote_cache(url.replace("http://", "http://ci:${CACHE_TOKEN}@"))
    assert remote is not None
    _torch_like(tmp_path / "runner1", stubs, remote)
    second = _torch_like(tmp_path / "runner2", stubs, remote)  # another runner: nothing of the first's folder
    assert second.cache is not None and second.cache.remote is not None
    assert second.cache.remote.hits == second.cache.host.total == 2
    log = second.log.read_text()  # type: ignore[union-attr]
    assert "remote 2/2 hits (100 %)" in log and "${CACHE_TOKEN}" in log and "t0ken-of-the-ci" not in log
