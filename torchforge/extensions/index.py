"""An sdist `NAME==VERSION` from the package indexes pip's own configuration names, downloaded without running it.

`pip download` would do it, but pip prepares a downloaded sdist's metadata, which runs its setup.py (with the
network: a setup.py that fetches something would reach it). Here the indexes are read as pip reads them:
`pip config list` (its files and PIP_* variables) gives `index-url` (PyPI's https://pypi.org/simple where none is
set), `extra-index-url` and `find-links`; each project page is a PEP 503 simple page (a local folder index
included, whose pages are `index.html` files), a find-links entry a folder or such a page. The first sdist whose
file name (PEP 625, or the older `name-version.tar.gz` forms) says that name and version is downloaded, and
checked against the page's `#sha256=` where it gives one.
"""

from __future__ import annotations

import hashlib
import shlex
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from torchforge.errors import ToolFailedError, UsageError
from torchforge.proc import Command, Runner

PYPI = "https://pypi.org/simple"
SECTIONS = (":env:", "download", "global")  # pip's precedence, highest first
TIMEOUT_S = 60


@dataclass(frozen=True)
class Indexes:
    urls: tuple[str, ...]  # index-url then extra-index-url
    find_links: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join((*self.urls, *self.find_links))


def configured(python: str, runner: Runner) -> Indexes:
    """pip's configured indexes (`python -m pip config list`)."""
    listed = runner.run(Command((python, "-m", "pip", "config", "list"))).output
    values: dict[tuple[str, str], str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        section, _, option = key.rpartition(".")
        if sep and section in SECTIONS:
            values[(section, option)] = value.strip().strip("'\"")

    def option(name: str) -> list[str]:
        found = next((values[(s, name)] for s in SECTIONS if (s, name) in values), "")
        return shlex.split(found)

    return Indexes(tuple((*(option("index-url")[:1] or [PYPI]), *option("extra-index-url"))),
                   tuple(option("find-links")))


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _read(url: str) -> tuple[str, str] | None:
    """(text, the URL it came from) of a page or a local folder's index.html; None where there is none."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(urllib.request.url2pathname(parsed.path))
        if path.is_dir():
            listing = path / "index.html"
            if listing.is_file():
                return listing.read_text(errors="replace"), listing.as_uri()
            names = sorted(p.name for p in path.iterdir())  # a find-links folder
            return "".join(f'<a href="{n}">{n}</a>' for n in names), path.as_uri() + "/"
        return None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/html"}),
                                    timeout=TIMEOUT_S) as response:
            return response.read().decode(errors="replace"), response.geturl()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ToolFailedError(f"{url}: the index answered HTTP {exc.code}", "check the index in pip's configuration")
    except (urllib.error.URLError, OSError) as exc:
        raise ToolFailedError(f"{url}: the index cannot be reached ({getattr(exc, 'reason', exc)})",
                              "check the network, or name a reachable index in pip's configuration "
                              "(`pip config set global.index-url URL`)") from exc


def _is_the_sdist(filename: str, name: str, version: Version) -> bool:
    try:
        found, found_version = parse_sdist_filename(filename)
    except (InvalidSdistFilename, InvalidVersion):
        return False
    return found == canonicalize_name(name) and found_version == version


def find_sdist(name: str, version: str, indexes: Indexes) -> str | None:
    """The URL (with its `#sha256=` where the page gives one) of the sdist, or None."""
    wanted = Version(version)
    pages = [f"{u.rstrip('/')}/{canonicalize_name(name)}/" for u in indexes.urls]
    pages += [link if "://" in link else Path(link).resolve().as_uri() for link in indexes.find_links]
    for page in pages:
        found = _read(page)
        if found is None:
            continue
        anchors = _Anchors()
        anchors.feed(found[0])
        for href in anchors.hrefs:
            url = urllib.parse.urljoin(found[1], href)
            filename = urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
            if _is_the_sdist(filename, name, wanted):
                return url
    return None


def download(pinned: str, dest: Path, python: str, runner: Runner) -> Path:
    """`NAME==VERSION`'s sdist in `dest` (written whole or not at all)."""
    name, _, version = pinned.partition("==")
    indexes = configured(python, runner)
    url = find_sdist(name, version, indexes)
    if url is None:
        raise UsageError(f"--extension {pinned}: no sdist of {name} {version} on {indexes.describe()}",
                         "check the name and version on the package index, or give a local sdist")
    address, _, fragment = url.partition("#")
    expected = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
    target = dest / urllib.parse.unquote(urllib.parse.urlparse(address).path.rsplit("/", 1)[-1])
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_S) as response, part.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        part.unlink(missing_ok=True)
        raise ToolFailedError(f"--extension {pinned}: {address} cannot be downloaded ({getattr(exc, 'reason', exc)})",
                              "check the network and the index") from exc
    if expected and digest.hexdigest() != expected:
        part.unlink()
        raise ToolFailedError(f"--extension {pinned}: {address} has sha256 {digest.hexdigest()}, the index says "
                              f"{expected}", "download it again, or check the index")
    part.replace(target)
    return target
