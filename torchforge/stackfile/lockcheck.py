"""`verify --stack`: an installed prefix against the stack's lock. Each locked package must be installed from the
locked file (its conda-meta record: name, version, build and sha256), and nothing else may be: every missing,
extra or different package is named, with its file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torchforge.stackfile.lock import Environment


@dataclass(frozen=True)
class Difference:
    kind: str  # "missing", "extra" or "different"
    package: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.package}: {self.detail}"


def _installed(prefix: Path) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for record in sorted((prefix / "conda-meta").glob("*.json")):
        meta = json.loads(record.read_text("utf-8"))
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            found[meta["name"]] = meta
    return found


def differences(env: Environment, prefix: Path) -> list[Difference]:
    """What the prefix has that the lock does not say, package by package (sorted by name)."""
    installed = _installed(prefix)
    locked = {package.name: package for package in env.packages}
    found: list[Difference] = []
    for name in sorted(locked.keys() | installed.keys()):
        want, have = locked.get(name), installed.get(name)
        if have is None:
            assert want is not None
            found.append(Difference("missing", name, f"the lock names {want.file} from {want.channel}"))
        elif want is None:
            found.append(Difference("extra", name, f"{_file(have)} is installed; the lock has no {name}"))
        else:
            stem = f"{have.get('version')}-{have.get('build')}"
            if stem != f"{want.version}-{want.build}" or have.get("sha256") != want.sha256:
                found.append(Difference("different", name, f"{_file(have)} (sha256 {have.get('sha256')}) is "
                                        f"installed; the lock names {want.file} (sha256 {want.sha256})"))
    return found


def _file(meta: dict[str, object]) -> str:
    return str(meta.get("fn") or f"{meta.get('name')}-{meta.get('version')}-{meta.get('build')}")
