"""A route from an isolated build to the compile cache's server, and to nothing else (issue 42).

An extension's pip runs in torchforge/isolation.py's network namespace, and ccache runs inside it as the
compiler's launcher: without a route no remote cache is reachable from an extension's build. Outside, `relay`
listens on a Unix socket in a private folder and joins each connection to the server's host and port (resolved
here, with this machine's resolver); the build gets `TORCHFORGE_CACHE_RELAY="HOST PORT SOCKET"`. Inside,
torchforge/isolation_child.py brings the loopback up, makes HOST name the loopback (a hosts file bound over
/etc/hosts, or an IPv4 literal added to the loopback) and forwards HOST:PORT to the socket. The URL ccache uses is
unchanged (credentials, TLS and its server name included); no other host or port is reachable.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from torchforge import fileops
from torchforge.isolation_child import join
from torchforge.remotecache import CONNECT_TIMEOUT_MS, RemoteCache

RELAY_VARIABLE = "TORCHFORGE_CACHE_RELAY"  # isolation_child.py reads it by this name
DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379}


def endpoint(remote: RemoteCache) -> tuple[str, int] | None:
    """The server's host and port, where a relay can carry its protocol (None: a redis+unix socket, which needs
    no network, or a host named by a variable)."""
    parts = urlsplit(remote.url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or "$" in parts.hostname:
        return None
    return parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme]


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    target: tuple[str, int]


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        try:
            upstream = socket.create_connection(self.server.target, timeout=CONNECT_TIMEOUT_MS / 1000)
        except OSError:
            return  # ccache sees the connection closed: it counts an error and compiles
        upstream.settimeout(None)
        with upstream:
            join(self.request, upstream)


@contextmanager
def relay(remote: RemoteCache | None) -> Iterator[dict[str, str]]:
    """The variable an isolated build needs to reach `remote`'s server, while the relay runs (empty where none
    is needed or possible: set all the same, as conda-build warns of a script_env variable that is not)."""
    target = endpoint(remote) if remote is not None else None
    if target is None:
        yield {RELAY_VARIABLE: ""}
        return
    with fileops.private_scratch("cache-relay") as folder:
        path = Path(folder) / "socket"  # short: a Unix socket's path has at most 107 bytes
        server = _Server(str(path), _Handler)
        server.target = target
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield {RELAY_VARIABLE: f"{target[0]} {target[1]} {path}"}
        finally:
            server.shutdown()
            server.server_close()
