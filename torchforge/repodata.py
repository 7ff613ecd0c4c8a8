"""A channel subdir's repodata.json written from what a build knows, without re-reading the channel.

py-rattler's index_fs (torchforge.localchannel.index) reads every archive of the channel again: for a repacked
CUDA stack that is gigabytes read and hashed once more after they were just written. A record here is what
index_fs writes for one archive: its info/index.json, its size, sha256 and md5, and the time of indexing; the
file it is merged into keeps index_fs's layout (sorted keys, compact separators, the same top-level keys), so a
channel indexed either way reads the same to conda, mamba, pixi and py-rattler (tests/test_repodata.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torchforge.fileops import writing

HASH_BLOCK = 4 << 20
Record = dict[str, object]


def archive_digests(archive: Path) -> tuple[str, str]:
    """(sha256, md5) of a file in one read; the two run side by side (hashlib releases the GIL)."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with archive.open("rb") as handle, ThreadPoolExecutor(max_workers=1) as beside:
        while block := handle.read(HASH_BLOCK):
            pending = beside.submit(sha.update, block)
            md5.update(block)
            pending.result()
    return sha.hexdigest(), md5.hexdigest()


# Fields index_fs writes even when empty; it leaves out every other field without a value.
ALWAYS_WRITTEN = frozenset({"depends"})


def record_of(archive: Path, index_json: Mapping[str, object]) -> Record:
    """The repodata record of a finished archive, given its info/index.json."""
    sha256, md5 = archive_digests(archive)
    kept = {k: v for k, v in index_json.items() if k in ALWAYS_WRITTEN or v not in (None, "", [], {})}
    return {**kept, "md5": md5, "sha256": sha256, "size": archive.stat().st_size}


def empty(subdir: str) -> dict[str, object]:
    """A subdir's repodata.json listing nothing, as index_fs writes it."""
    return {"info": {"subdir": subdir}, "packages": {}, "packages.conda": {}, "repodata_version": 1, "v3": {}}


def section(filename: str) -> str:
    return "packages.conda" if filename.endswith(".conda") else "packages"


def read(subdir: Path) -> dict[str, object] | None:
    """A subdir's repodata.json, or None when it is missing or not one index_fs wrote."""
    try:
        data = json.loads((subdir / "repodata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("packages", "packages.conda")):
        return None
    return data


def merged(current: dict[str, object], records: Mapping[str, Record]) -> dict[str, object]:
    """`current` with `records` (by file name) added or replacing theirs, stamped with the time of indexing."""
    stamp = int(time.time() * 1000)
    out = {**current, "packages": dict(current["packages"]),  # type: ignore[call-overload]
           "packages.conda": dict(current["packages.conda"])}  # type: ignore[call-overload]
    for filename, record in records.items():
        out[section(filename)][filename] = {**record, "indexed_timestamp": stamp}  # type: ignore[index]
    return out


def write(subdir: Path, data: Mapping[str, object]) -> None:
    """Replace subdir/repodata.json whole (a reader sees the old file or the new one, never a part)."""
    target = subdir / "repodata.json"
    partial = subdir / f".partial-repodata.json.{os.getpid()}"  # a killed writer's: `recover` removes it
    with writing(target):
        partial.write_text(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
                           encoding="utf-8")
        os.chmod(partial, 0o644)
        os.replace(partial, target)
