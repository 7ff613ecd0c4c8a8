"""Which of a failed solve's specs no package of its channels can satisfy, for rattler-build's "Failed to resolve
dependencies" (py-rattler-build's error names neither the spec nor the channels; its log lists both).

Read from the log's `Channels:` and `Specs:` lists; each spec is matched, alone, against the records of its name
in the local (file://) channels' linux-64 / noarch repodata. A remote channel is not read (the message says so): a
spec can then only be named as missing from the local ones.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

SUBDIRS = ("linux-64", "noarch")


def listed(log: Iterable[str], heading: str) -> list[str]:
    """The `- item` lines under `heading` (e.g. "Channels:") in rattler-build's log."""
    found, inside = [], False
    for line in log:
        text = line.strip()
        if text == heading:
            inside, found = True, []
        elif inside and text.startswith("- "):
            found.append(text[2:].strip())
        elif inside:
            inside = False
    return found


def _local(channel: str) -> Path | None:
    parsed = urllib.parse.urlparse(channel)
    return Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else None


def unsatisfied(specs: list[str], channels: list[str]) -> list[str]:
    """The specs that no record of the local channels matches (all of them where no channel is local)."""
    from rattler import Channel, MatchSpec, PackageName, SparseRepoData

    sources = []
    for channel in channels:
        folder = _local(channel)
        for subdir in SUBDIRS if folder else ():
            index = folder / subdir / "repodata.json"  # type: ignore[operator]
            if index.is_file():
                sources.append(SparseRepoData(Channel(channel), subdir, index))
    missing = []
    for text in specs:
        spec = MatchSpec(text)
        name = spec.name.normalized if hasattr(spec.name, "normalized") else str(text.split()[0])
        records = [r for source in sources for r in source.load_records(PackageName(name))]
        if not any(spec.matches(r) for r in records):
            missing.append(text)
    return missing


def explain(log: list[str]) -> str:
    """The sentence to add to "Failed to resolve dependencies" (empty where the log lists no specs)."""
    specs, channels = listed(log, "Specs:"), listed(log, "Channels:")
    if not specs:
        return ""
    remote = [c for c in channels if _local(c) is None]
    missing = unsatisfied(specs, channels)
    where = ", ".join(channels) or "no channel"
    if not missing:
        return (f"every spec alone has a package in the local channels ({where}), so they conflict: "
                f"{', '.join(specs)}")
    note = f" (remote channels not read: {', '.join(remote)})" if remote else ""
    return f"no package in {where} matches {', '.join(missing)}{note}"
