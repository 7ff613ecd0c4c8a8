"""PyPI's answer to `torchforge repack --pytorch 2.10.0 --cuda 12.8 --py 3.12 --with torchvision,torchaudio`'s
resolve step, recorded once with its date (tests/fixtures/pip_resolve/), so the tests never ask the live index.

The test serves the record back to pip as a local simple index (PEP 503 pages with each wheel's core metadata,
PEP 658/714, and its sha256), so pip's real resolver runs, offline, on the same metadata; the wheels themselves
are never there (the resolve is metadata only). `make live-index-check` asks PyPI again and names every
difference from the record; `make live-index-check RECORD=1` writes today's answer in its place.

    python -m tests.recorded_index [--record]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import html
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from torchforge.binaries import fetch
from torchforge.proc import Runner

RECORD = Path(__file__).parent / "fixtures" / "pip_resolve" / "torch-2.10.0-cu128-cp312.json"
REQUEST = fetch.Request("2.10.0", "3.12", "12.8", ("torchvision", "torchaudio"), None)
# The core-metadata fields pip's resolver reads; the rest (descriptions, classifiers) is not recorded.
FIELDS = {"requires_dist": "Requires-Dist", "requires_python": "Requires-Python", "provides_extra": "Provides-Extra"}


def pip_config_set_aside(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without any PIP_* setting and with no pip configuration file: pip asks PyPI alone (or the index
    given on its command line), as on a machine with stock pip."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def recorded() -> dict[str, Any]:
    return json.loads(RECORD.read_text("utf-8"))  # type: ignore[no-any-return]


def from_report(report: Mapping[str, Any], date: str) -> dict[str, Any]:
    """The record of pip's `--report`: per wheel its name, version, file, URL, sha256 and resolver metadata."""
    install = []
    for item in report["install"]:
        meta, info = item["metadata"], item["download_info"]
        entry = {"name": meta["name"], "version": meta["version"], "url": info["url"],
                 "filename": info["url"].rsplit("/", 1)[-1].split("#")[0],
                 "sha256": info["archive_info"]["hashes"]["sha256"]}
        entry.update({key: meta[key] for key in FIELDS if key in meta})
        install.append(entry)
    return {"recorded": date, "pip": report["pip_version"], "index": "https://pypi.org/simple",
            "request": {"pytorch": REQUEST.pytorch, "python": REQUEST.python, "cuda": REQUEST.cuda,
                        "with": list(REQUEST.companions)},
            "install": sorted(install, key=lambda e: canonicalize_name(e["name"]))}


def _core_metadata(entry: Mapping[str, Any]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {entry['name']}", f"Version: {entry['version']}"]
    for key, header in FIELDS.items():
        values = entry.get(key, [])
        lines += [f"{header}: {v}" for v in ([values] if isinstance(values, str) else values)]
    return ("\n".join(lines) + "\n").encode()


def write_index(record: Mapping[str, Any], root: Path) -> str:
    """A PEP 503 simple index under `root` serving the record's wheels by name and sha256, each with its core
    metadata file; returns the index URL (file://)."""
    (root / "files").mkdir(parents=True)
    by_project: dict[str, list[Mapping[str, Any]]] = {}
    for entry in record["install"]:
        by_project.setdefault(canonicalize_name(entry["name"]), []).append(entry)
    for project, entries in by_project.items():
        anchors = []
        for entry in entries:
            metadata = _core_metadata(entry)
            (root / "files" / f"{entry['filename']}.metadata").write_bytes(metadata)
            digest = f"sha256={hashlib.sha256(metadata).hexdigest()}"
            anchors.append(f'<a href="../../files/{html.escape(entry["filename"])}#sha256={entry["sha256"]}" '
                           f'data-core-metadata="{digest}" data-dist-info-metadata="{digest}">'
                           f'{html.escape(entry["filename"])}</a><br>')
        (root / "simple" / project).mkdir(parents=True)
        (root / "simple" / project / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n", "utf-8")
    return (root / "simple").as_uri()


def resolve_report(work: Path, index_url: str | None) -> dict[str, Any]:
    """pip's `--report` for REQUEST, through torchforge's own resolve step (fetch.resolve), from `index_url`
    (None: PyPI). The caller sets pip's configuration aside (pip_config_set_aside)."""
    fetch.resolve(fetch.Request(REQUEST.pytorch, REQUEST.python, REQUEST.cuda, REQUEST.companions, index_url),
                  work, Runner())
    return json.loads((work / "report.json").read_text("utf-8"))  # type: ignore[no-any-return]


def differences(live: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    """What PyPI answers today that the record does not say (and the other way round), per wheel."""
    now = {canonicalize_name(e["name"]): e for e in live["install"]}
    then = {canonicalize_name(e["name"]): e for e in record["install"]}
    found = [f"{name}: new today ({now[name]['filename']})" for name in sorted(set(now) - set(then))]
    found += [f"{name}: no longer resolved (recorded {then[name]['filename']})" for name in sorted(set(then) - set(now))]
    for name in sorted(set(now) & set(then)):
        for key in ("filename", "sha256", *FIELDS):
            if now[name].get(key) != then[name].get(key):
                found.append(f"{name}: {key} {then[name].get(key)!r} recorded, {now[name].get(key)!r} today")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="write today's answer as the record")
    args = parser.parse_args(argv)
    env = pip_config_set_aside(os.environ)
    os.environ.clear()
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        live = from_report(resolve_report(Path(tmp), None), datetime.date.today().isoformat())
    if args.record:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(live, indent=1) + "\n", "utf-8")
        print(f"recorded PyPI's answer of {live['recorded']} in {RECORD}")
        return 0
    record = recorded()
    found = differences(live, record)
    for line in found:
        print(line)
    print(f"PyPI today and the record of {record['recorded']} ({RECORD.name}): "
          + (f"{len(found)} difference(s); review, then `make live-index-check RECORD=1`" if found else "the same"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
