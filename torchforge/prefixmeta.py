"""What an environment prefix's conda-meta records say: which installed package owns each file, and which
packages each one declares, followed through their own run requirements. The prefix audit uses it to flag a
library that resolves only because some package the user of the library never asked for happens to bring it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Installed:
    owners: dict[str, str]  # file path relative to the prefix (POSIX) -> name of the package that installed it
    depends: dict[str, frozenset[str]]  # package name -> the names its run requirements give

    def declared_by(self, package: str) -> frozenset[str]:
        """`package` and every installed package its requirements reach, directly or through others."""
        seen = {package}
        todo = [package]
        while todo:
            for name in self.depends.get(todo.pop(), frozenset()):
                if name not in seen:
                    seen.add(name)
                    todo.append(name)
        return frozenset(seen)


def read(prefix: Path) -> Installed:
    """The conda-meta records of `prefix` (none: an empty Installed, where no file has an owner)."""
    owners: dict[str, str] = {}
    depends: dict[str, frozenset[str]] = {}
    for record_file in sorted((prefix / "conda-meta").glob("*.json")):
        record = json.loads(record_file.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            continue  # `history` and other files that are not package records
        name = record["name"]
        depends[name] = frozenset(str(spec).split()[0] for spec in record.get("depends", []) if str(spec).strip())
        for path in record.get("files", []):
            owners[str(path)] = name
    return Installed(owners, depends)
