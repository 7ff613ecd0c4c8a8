"""A compile cache shared by runners that share no CI cache: ccache's remote storage (`--cache-url URL`) beside the
local cache folder.

- Servers: ccache's own backends, HTTP(S) (any server that answers GET and stores PUT, e.g. nginx with WebDAV or
  a plain HTTP server that accepts PUT; entries under URL/<group key>/) and Redis (`redis://HOST:PORT`).
- No wrong hit: an entry is found by ccache's own hash of the compiler's content (compiler_check = content), every
  argument (flags, -gencode arch list) and the preprocessed source (pytorch's headers included), the same key as
  the local cache's; the group key in an HTTP URL's path only keeps groups apart.
- Credentials: never on a command line. The URL names them by variable (`redis://:${CACHE_TOKEN}@host:6379`,
  `https://ci:${CACHE_TOKEN}@cache.example/ccache`), which torchforge reads from its environment (a CI secret
  variable) when it writes the build's ccache config; a password written into the URL itself is refused.
  Everything shown (plan, log, summary) keeps the reference, and the value is masked in the build's output.
- Read-only (`--cache-read-only`, and the emitted CI on untrusted pipelines): hits are used, nothing is written.
- The server down: ccache counts an error and compiles; the build goes on and its summary warns.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from torchforge.errors import UsageError

SCHEMES = ("http", "https", "redis", "redis+unix")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Timeouts (ms) short enough that an unreachable server costs a build little: ccache's defaults are 100 / 10000.
CONNECT_TIMEOUT_MS = 500
OPERATION_TIMEOUT_MS = 10000


@dataclass(frozen=True)
class RemoteCache:
    """The remote storage of a build: its URL as given (credentials only as ${VAR} references), read-only or not."""

    url: str
    read_only: bool = False

    @property
    def references(self) -> tuple[str, ...]:
        """The variables the URL names (its credentials): CI secrets, passed to the build by name."""
        return tuple(dict.fromkeys(_REFERENCE.findall(self.url)))

    @property
    def shown(self) -> str:
        return self.url + (" (read-only)" if self.read_only else "")

    def secrets(self, environ: os._Environ[str] | dict[str, str] | None = None) -> tuple[str, ...]:
        """The values of the variables the URL refers to: masked wherever the build's output is shown."""
        scope = os.environ if environ is None else environ
        return tuple(scope[name] for name in _REFERENCE.findall(self.url) if scope.get(name))

    def config_line(self, group_key: str, environ: dict[str, str] | None = None) -> str:
        """ccache's `remote_storage` value for one group: the URL with its references filled in (an HTTP URL gets
        the group's key as its last folder), the timeouts, read-only where asked."""
        scope = dict(os.environ) if environ is None else environ
        missing = [name for name in _REFERENCE.findall(self.url) if name not in scope]
        if missing:
            raise UsageError(f"--cache-url refers to ${{{missing[0]}}}, which is not set",
                             f"set {missing[0]} (a CI secret variable) in the build's environment, or drop the reference")
        url = _REFERENCE.sub(lambda m: scope[m.group(1)], self.url)
        if urlsplit(self.url).scheme in ("http", "https"):
            url = url.rstrip("/") + f"/{group_key}"
        attributes = [f"connect-timeout={CONNECT_TIMEOUT_MS}", f"operation-timeout={OPERATION_TIMEOUT_MS}"]
        if self.read_only:
            attributes.append("read-only=true")
        return "|".join([url, *attributes])


def remote_cache(url: str | None, *, read_only: bool = False) -> RemoteCache | None:
    """`--cache-url URL` checked before anything runs: a scheme ccache speaks, and no password in it."""
    if url is None:
        if read_only:
            raise UsageError("--cache-read-only needs --cache-url", "give the remote cache's URL, or leave both out")
        return None
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not (parts.netloc or parts.scheme == "redis+unix"):
        raise UsageError(f"--cache-url {url!r} is not a URL of a cache server ccache speaks",
                         "use http://HOST:PORT/PATH, https://..., redis://HOST:PORT or redis+unix:/PATH")
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    password = userinfo.partition(":")[2] if ":" in userinfo else userinfo if parts.scheme.startswith("redis") else ""
    if password and not _REFERENCE.fullmatch(password):
        raise UsageError("--cache-url holds a password: it would be printed in logs and kept in shell history",
                         "name it by a variable instead, e.g. redis://:${CACHE_TOKEN}@HOST:6379, and set CACHE_TOKEN "
                         "(a CI secret variable)")
    return RemoteCache(url, read_only)


@dataclass(frozen=True)
class RemoteStats:
    """What the remote storage gave one build's compiler calls (ccache's stats log)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0  # entries (result and manifest files) written to the server
    errors: int = 0  # calls that could not reach it (or timed out): compiled, and the build went on

    def summary(self) -> str:
        calls = self.hits + self.misses
        text = f"remote {self.hits}/{calls} hits" + (f" ({100 * self.hits / calls:.0f} %)" if calls else "")
        text += f", {self.writes} entries written"
        return text + (f"; {self.errors} calls could not reach the server (compiled here)" if self.errors else "")


REMOTE_COUNTERS = {"remote_storage_hit": "hits", "remote_storage_miss": "misses",
                   "remote_storage_write": "writes", "remote_storage_error": "errors",
                   "remote_storage_timeout": "errors"}
