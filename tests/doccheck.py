"""The shell commands of README.md and docs/, extracted so the tests can check each one (tests/test_docs.py), and
`make example` (`python -m tests.doccheck quickstart`), which runs the README's quick start.

How a block is checked is said by an HTML comment on the line before its fence (docs/development.md,
"Commands in the documentation", is the rule book for authors):

    <!-- check: run -->             run for real, in order, in one bash shell (`set -e`), in a fresh folder
    <!-- check: dry-run -->         each torchforge command runs with --dry-run (added if absent) and exits 0
    <!-- check: parse -->           each command's arguments are parsed, nothing runs (the default)
    <!-- check: skip: REASON -->    not checked; the reason is required
    <!-- output: exact|sample -->   a ```console block of `$ command` lines and their output (tests/docgen.py)
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
MODES = ("run", "dry-run", "parse", "skip")
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- (check|output): ?(.*?) -->$")
OPERATORS = {"&&", "||", ";", "|", "&"}
# What a fresh folder of a `run` block holds: the repository's files a user's commands name.
RUN_LINKS = ("tests", "channels", ".venv")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    mode: str  # one of MODES, or "output"
    reason: str  # skip's reason, output's kind
    lines: tuple[str, ...]  # the shell commands (continuations joined, `$ ` prompts removed)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _commands(body: list[str], language: str) -> tuple[str, ...]:
    commands: list[str] = []
    pending = ""
    for raw in body:
        if language == "console":
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return tuple(commands)


def _mode(marker: str | None, language: str) -> tuple[str, str]:
    if marker is None:
        return "parse", ""
    found = MARKER.match(marker)
    assert found is not None
    kind, value = found.groups()
    if kind == "output":
        return "output", value
    mode, _, reason = value.partition(":")
    return mode.strip(), reason.strip()


def blocks(page: Path) -> list[Block]:
    """Every shell block of one page with how it is checked (unknown markers are kept, the tests reject them)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        end = next((i for i in range(number + 1, len(lines)) if lines[i].startswith("```")), len(lines))
        language = opening.group(1)
        previous = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        marker = previous if MARKER.match(previous) else None
        if language in SHELL_LANGUAGES:
            mode, reason = _mode(marker, language)
            found.append(Block(page, number + 1, language, mode, reason, _commands(lines[number + 1:end], language)))
        number = end + 1
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [block for page in pages(root) for block in blocks(page)]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line (split at && || ; | &), comments removed, leading VAR=value dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    result = []
    for words in commands:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def program(words: list[str]) -> str:
    return Path(words[0]).name


def makefile_targets(root: Path = ROOT) -> set[str]:
    text = (root / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def parse_torchforge(args: list[str]) -> str | None:
    """None when the real command line accepts `args` (nothing runs), else what it said. A path option whose
    file does not exist in this folder is accepted: the page names the user's file."""
    import typer
    from typer.core import TyperGroup

    from torchforge.cli import app
    from torchforge.errors import ForgeError

    # typer vendors its own click (typer._click): its errors are typer.TyperException, its Exit typer.Exit.
    group = typer.main.get_command(app)
    try:
        with group.make_context("torchforge", list(args), resilient_parsing=False) as ctx:
            # click keeps the sub-command's words apart (`_protected_args` since 8.2, `protected_args` before).
            protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
            name, command, rest = group.resolve_command(ctx, [*protected, *ctx.args])  # type: ignore[attr-defined]
            assert command is not None
            if isinstance(command, TyperGroup) and rest:
                sub, command, rest = command.resolve_command(ctx, rest)
                name = f"{name} {sub}"
            with command.make_context(str(name), list(rest), parent=ctx):
                pass
    except typer.Exit:  # --help, --version
        return None
    except typer.TyperException as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # A path option whose file is not in this folder: the page names the user's own file.
        return None if "does not exist" in message else message
    except ForgeError as exc:  # an option's own check (--extension SPEC): a path not in this folder is the user's
        return None if "no such file or folder" in exc.message else str(exc)
    return None


def parse_problem(words: list[str], root: Path = ROOT) -> str | None:
    """What is wrong with one documented simple command, checked without running it; None when nothing is."""
    name = program(words)
    if name == "torchforge":
        return parse_torchforge(words[1:])
    if name == "make":
        unknown = [w for w in words[1:] if not w.startswith("-") and "=" not in w and w not in makefile_targets(root)]
        return f"no Makefile target {', '.join(unknown)}" if unknown else None
    if name.startswith("python") and "-m" in words:
        module = words[words.index("-m") + 1]
        if module.split(".")[0] in ("tests", "bench", "torchforge"):
            if root not in map(Path, sys.path):
                sys.path.insert(0, str(root))
            return None if importlib.util.find_spec(module) else f"no module {module}"
    return None


def bash_script(lines: tuple[str, ...], *, echo: bool) -> str:
    """One bash script running `lines` in order, stopping at the first failure; with `echo`, each line is printed
    before it runs (`make example`)."""
    out = ["set -e"]
    for line in lines:
        if echo:
            out.append(f"printf '\\n+ %s\\n' {shlex.quote(line)}")
        out.append(line)
    return "\n".join(out) + "\n"


def quickstart(root: Path = ROOT) -> Block:
    """The README's quick start: its first `run` block."""
    return next(b for b in blocks(root / "README.md") if b.mode == "run")


def example(root: Path = ROOT) -> list[Block]:
    """What `make example` runs: the README's `run` blocks, in order (the quick start, its stack file, then the
    extension built for the repacked torch wheel)."""
    return [b for b in blocks(root / "README.md") if b.mode == "run"]


def run_block(block: Block, folder: Path, *, echo: bool = False, env: dict[str, str] | None = None,
              timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", bash_script(block.lines, echo=echo)], cwd=folder, env=env, text=True,
                          capture_output=not echo, timeout=timeout)


def main(argv: list[str]) -> int:
    if argv[:1] != ["quickstart"]:
        print("usage: python -m tests.doccheck quickstart", file=sys.stderr)
        return 2
    for block in example():
        print(f"the quick start of README.md ({block.where}), line by line, from {ROOT}")
        result = run_block(block, ROOT, echo=True)
        print("\nquick start: " + ("every step worked" if result.returncode == 0 else f"stopped (exit {result.returncode})"))
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
