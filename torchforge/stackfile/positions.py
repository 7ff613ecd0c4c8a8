"""Where each key of a TOML file is written: a map from key path to line, read beside `tomllib`'s parse.

`tomllib` gives a line only for a syntax error; a schema error ("pytorch.from: not one of ...") must name the
line too. The file has already parsed, so its lines are valid TOML: a header `[a.b]` or `[[a]]` opens a table
(an array of tables counts its entries), and `key = value` or `a.b = value` sets a key in it. An inline table
(`env = { A = "1" }`) and a multi-line array give their keys the line of the key that holds them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

Path = tuple[str | int, ...]
_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})(?:\s*\.\s*(?:{_BARE}|{_QUOTED}))*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_KEY})\s*\]\]?\s*(#.*)?$")
_ASSIGN = re.compile(rf"^\s*({_KEY})\s*=")
_INLINE_KEY = re.compile(rf"[{{,]\s*({_KEY})\s*=")
_PART = re.compile(rf"{_BARE}|{_QUOTED}")


def _parts(key: str) -> tuple[str, ...]:
    return tuple(part[1:-1] if part[0] in "\"'" else part for part in _PART.findall(key))


def key_lines(text: str) -> dict[Path, int]:
    """Every key path the file sets (an array of tables' entries by index), with its 1-based line."""
    lines: dict[Path, int] = {}
    table: Path = ()
    counts: dict[Path, int] = {}
    in_string = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.count('"""') % 2 or line.count("'''") % 2:  # a multi-line string opens or closes here
            was, in_string = in_string, not in_string
            if was:
                continue
        elif in_string:
            continue
        header = _HEADER.match(line)
        if header:
            path = _parts(header.group(2))
            if header.group(1) == "[[":
                counts[path] = counts.get(path, -1) + 1
                table = (*path, counts[path])
                lines.setdefault(path, number)
            else:
                table = path
            lines.setdefault(table, number)
            continue
        assign = _ASSIGN.match(line)
        if assign:
            key = (*table, *_parts(assign.group(1)))
            lines.setdefault(key, number)
            rest = line[assign.end():]
            for inner in _INLINE_KEY.finditer(rest):
                lines.setdefault((*key, *_parts(inner.group(1))), number)
    return lines


def line_of(lines: Mapping[Path, int], path: Path) -> int | None:
    """The line of `path`, else of the nearest key above it that the file writes (a missing key's table)."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
