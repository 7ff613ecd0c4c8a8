"""Failure diagnosis: known failure signatures (torchforge/data/failures.toml) matched against a build or run log.

`explain_log(path_or_text)` returns one `Diagnosis` per signature found, in the order of the line where each was
first seen, with that line's number and text. The build calls it on a failed variant's log; `torchforge explain
LOGFILE` calls it on demand.

The signatures are data: each has its message patterns, an explanation, a fix and the source the message text was
copied from. They are validated and their regexes compiled once per process; a malformed entry is a DataError that
names its key, so a typo never turns into a diagnosis that silently matches nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import field_validator
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import DataError, UsageError

DATA_FILE = "torchforge/data/failures.toml"
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# gcc and ninja colour their diagnostics when asked (-fdiagnostics-color=always is in PyTorch's CXX_FLAGS, seed
# 000); the escape codes would split a message ("\x1b[01;31mKilled signal...") and defeat the patterns.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Compile commands in PyTorch logs run to thousands of characters; show a window around the match instead.
_SHOW_CHARS = 300
# A str argument this long, or with a newline, is log text, never a file name.
_MAX_PATH_CHARS = 4096


class Signature(FrozenModel):
    title: str
    patterns: tuple[str, ...] = ()
    literals: tuple[str, ...] = ()
    ignore_case: bool = False
    explanation: str
    fix: str
    source: str

    @field_validator("title", "explanation", "fix", "source")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return " ".join(value.split()) if "\n" in value.strip() else value.strip()

    @field_validator("patterns", "literals")
    @classmethod
    def _no_empty_pattern(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # An empty pattern matches every line: always a data bug.
        if any(not p for p in value):
            raise ValueError("contains an empty pattern")
        return value


class FailuresTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    signatures: dict[str, Signature]


@dataclass(frozen=True)
class CompiledSignature:
    id: str
    signature: Signature
    regexes: tuple[re.Pattern[str], ...]

    def search(self, line: str) -> re.Match[str] | None:
        for regex in self.regexes:
            found = regex.search(line)
            if found is not None:
                return found
        return None


@dataclass(frozen=True)
class Catalog:
    """The validated signatures in file order, plus a cheap per-line filter.

    A build log is mostly compile commands that match nothing. Running ~40 regexes (or one alternation of them) on
    every line of a 70 MB log takes ~25 s; instead each pattern contributes one literal it cannot match without
    (`keywords`, found by parsing the regex), a line is only searched with the regexes when it contains one of
    them, and the few patterns without such a literal (`unfiltered`) are always searched.
    """

    signatures: tuple[CompiledSignature, ...]
    combined: re.Pattern[str]
    keywords: tuple[str, ...] = ()
    keywords_folded: tuple[str, ...] = ()  # from ignore_case patterns, lowercase, tested against line.lower()
    unfiltered: re.Pattern[str] | None = None

    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.signatures)

    def _candidate(self, line: str) -> bool:
        if any(keyword in line for keyword in self.keywords):
            return True
        if self.keywords_folded:
            folded = line.lower()
            if any(keyword in folded for keyword in self.keywords_folded):
                return True
        return self.unfiltered is not None and self.unfiltered.search(line) is not None

    def match(self, line: str) -> tuple[CompiledSignature, re.Match[str]] | None:
        """The first signature in file order that matches `line` (file order = most specific first)."""
        if not self._candidate(line):
            return None
        for compiled in self.signatures:
            found = compiled.search(line)
            if found is not None:
                return compiled, found
        return None


def required_literal(pattern: str, flags: int = 0) -> str | None:
    """The longest run of plain characters that every match of `pattern` contains, or None.

    Only the top-level sequence is read: a run of LITERAL items there is mandatory (a repeat, class or group
    between them just ends the run). A top-level alternation has no single mandatory literal. Uses the stdlib's
    regex parser (re._parser, sre_parse before 3.11); if its format ever changes we return None, which only costs
    speed, never a missed match.
    """
    try:
        parser = getattr(re, "_parser", None)
        if parser is None:  # Python 3.10
            import sre_parse as parser  # type: ignore[no-redef]
        parsed = parser.parse(pattern, flags)
        literal_op = parser.LITERAL  # type: ignore[attr-defined]
        best, run = "", []
        for op, arg in list(parsed):
            if op is literal_op:
                run.append(chr(arg))
                continue
            best = max(best, "".join(run), key=len)
            run = []
        best = max(best, "".join(run), key=len)
    except Exception:  # noqa: BLE001 - any surprise in a private API means "no filter", not a failure
        return None
    # Very short literals ("a") would let nearly every line through; treat them as no filter.
    return best if len(best) >= 4 else None


def _pattern_source(signature: Signature) -> list[str]:
    return [*signature.patterns, *(re.escape(literal) for literal in signature.literals)]


def parse_catalog(text: str, where: str = DATA_FILE) -> Catalog:
    """Validate failures.toml text and compile every pattern; DataError names the offending key."""
    table = parse_table_as(FailuresTable, text, where,
                           "each [signatures.ID] needs title, patterns or literals, explanation, fix, source")
    if not table.signatures:
        raise DataError(f"{where} has no [signatures.*] tables", "add at least one signature")
    compiled: list[CompiledSignature] = []
    alternatives: list[str] = []
    keywords: list[str] = []
    keywords_folded: list[str] = []
    unfiltered: list[str] = []
    for sig_id, signature in table.signatures.items():
        key = f"{where} signatures.{sig_id}"
        if not _ID.match(sig_id):
            raise DataError(f"{key}: the id must be lowercase words joined by '-'", "rename the table, e.g. [signatures.compiler-killed]")
        if not signature.patterns and not signature.literals:
            raise DataError(f"{key} has neither patterns nor literals", "add the exact message text as a literal")
        flags = re.IGNORECASE if signature.ignore_case else 0
        regexes: list[re.Pattern[str]] = []
        for index, pattern in enumerate(signature.patterns):
            try:
                regexes.append(re.compile(pattern, flags))
            except re.error as exc:
                raise DataError(f"{key}.patterns[{index}] is not a valid regex ({exc}): {pattern!r}",
                                "escape regex metacharacters, or move the text to `literals`") from exc
        regexes.extend(re.compile(re.escape(literal), flags) for literal in signature.literals)
        compiled.append(CompiledSignature(sig_id, signature, tuple(regexes)))
        for regex in regexes:
            keyword = required_literal(regex.pattern, flags)
            if keyword is None:
                unfiltered.append(f"(?i:{regex.pattern})" if signature.ignore_case else f"(?:{regex.pattern})")
            elif signature.ignore_case:
                keywords_folded.append(keyword.lower())
            else:
                keywords.append(keyword)
        body = "|".join(f"(?:{p})" for p in _pattern_source(signature))
        alternatives.append(f"(?i:{body})" if signature.ignore_case else f"(?:{body})")
    try:
        combined = re.compile("|".join(alternatives))
    except re.error as exc:  # e.g. the same named group in two signatures
        raise DataError(f"{where}: the signatures cannot be combined into one regex ({exc})",
                        "use non-capturing groups (?:...) instead of named groups") from exc
    return Catalog(
        tuple(compiled), combined, tuple(dict.fromkeys(keywords)), tuple(dict.fromkeys(keywords_folded)),
        re.compile("|".join(unfiltered)) if unfiltered else None,
    )


@cache
def catalog() -> Catalog:
    """The packaged signatures, read and compiled once per process."""
    text = data_text("failures")
    return parse_catalog(text)


@dataclass(frozen=True)
class Diagnosis:
    id: str
    title: str
    explanation: str
    fix: str
    source: str
    line: int  # 1-based number of the first line that matched
    text: str  # that line (ANSI codes removed, long lines cut around the match)
    count: int  # how many lines this signature claimed in the whole log

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id, "title": self.title, "line": self.line, "text": self.text, "count": self.count,
            "explanation": self.explanation, "fix": self.fix, "source": self.source,
        }


def _shown(line: str, found: re.Match[str]) -> str:
    line = line.strip()
    if len(line) <= _SHOW_CHARS:
        return line
    start = max(0, line.find(found.group(0)) - _SHOW_CHARS // 3)
    end = start + _SHOW_CHARS
    return ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")


def explain_lines(lines: Iterable[str], *, signatures: Catalog | None = None) -> list[Diagnosis]:
    """Diagnoses for a stream of log lines (numbered from 1), ordered by the line each was first found on."""
    table = signatures or catalog()
    first: dict[str, Diagnosis] = {}
    counts: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = _ANSI.sub("", raw.rstrip("\r\n")) if "\x1b" in raw else raw.rstrip("\r\n")
        hit = table.match(line)
        if hit is None:
            continue
        compiled, found = hit
        counts[compiled.id] = counts.get(compiled.id, 0) + 1
        if compiled.id not in first:
            sig = compiled.signature
            first[compiled.id] = Diagnosis(compiled.id, sig.title, sig.explanation, sig.fix, sig.source, number,
                                           _shown(line, found), 0)
    # dicts keep insertion order, which is first-match order
    return [Diagnosis(**{**d.__dict__, "count": counts[d.id]}) for d in first.values()]


def _file_lines(path: Path) -> Iterator[str]:
    # errors="replace": build logs mix encodings (MSVC writes the ANSI code page, seed 002's 导出规范无效).
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        yield from handle


def explain_log(path_or_text: str | os.PathLike[str], *, signatures: Catalog | None = None) -> list[Diagnosis]:
    """Diagnose a log given as a path (Path, or a str naming an existing file) or as the log text itself."""
    if isinstance(path_or_text, os.PathLike):
        path = Path(path_or_text)
        if not path.is_file():
            raise UsageError(f"log file {path} does not exist or is not a file", "pass the build log, e.g. forge-channel/logs/<variant>.log")
        return explain_lines(_file_lines(path), signatures=signatures)
    text = path_or_text
    if "\n" not in text and len(text) < _MAX_PATH_CHARS and text and Path(text).is_file():
        return explain_lines(_file_lines(Path(text)), signatures=signatures)
    return explain_lines(text.splitlines(), signatures=signatures)


def render(diagnoses: Iterable[Diagnosis]) -> RenderableType:
    """A rich renderable: one panel per diagnosis (the caller prints it; library modules never print)."""
    panels: list[RenderableType] = []
    for d in diagnoses:
        body = Text()
        body.append(f"line {d.line}", style="bold")
        body.append(f" (+{d.count - 1} more)" if d.count > 1 else "")
        body.append(": ")
        body.append(d.text, style="red")
        body.append("\n\nwhy: ", style="bold")
        body.append(d.explanation)
        body.append("\n\nwhat would work: ", style="bold green")
        body.append(d.fix)
        body.append("\n\nsource: ", style="dim")
        body.append(d.source, style="dim")
        panels.append(Panel(body, title=f"[bold]{d.title}[/bold]  [dim]({d.id})[/dim]", title_align="left"))
    return Group(*panels)
