"""`make docs`: the documentation's data tables and output examples, regenerated from torchforge's own data and
from real runs (never typed by hand). `python -m tests.docgen` rewrites; `--check` lists what is stale.

Two kinds of generated text, both marked in the Markdown (docs/development.md, "Commands in the documentation"):
- `<!-- generated: NAME -->` ... `<!-- end generated -->`: TABLES[NAME], from torchforge/data (and errors.py);
  the pages under docs/reference/ are generated whole.
- `<!-- output: exact|sample -->` before a ```console block: every `$ command` line is run from the repository
  root and the lines after it are its output. `exact` output depends on the data only and is compared by the
  tests; `sample` output depends on the machine (doctor): it is run on the documentation machine
  (tests/docmachine.py: the same checkout path, disk, memory, CPUs, tools and no network wherever it runs), so
  that it too comes out byte for byte the same on any machine, and is only regenerated.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests import docmachine
from torchforge import channels, containers, data, diagnose
from torchforge.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
WIDTH = "110"  # rich's width for output examples (a terminal of 110 columns)

GENERATED = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)
OUTPUT = re.compile(r"(<!-- output: (exact|sample) -->\n```console\n)(.*?)(```)", re.S)


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    return "\n".join([_row(*header), _row(*("---" for _ in header)), *(_row(*r) for r in rows)]) + "\n"


def releases_table() -> str:
    """One row per release: what upstream published (official: torchforge reproduces it) and what it built as
    wheels only (buildable: torchforge builds it in the same shape); anything else is refused by `matrix`."""
    facts = data.load()
    table = facts.pytorch
    rows = []
    for series, release in table.releases.items():
        platforms = [name for name, platform in facts.platforms.platforms.items()
                     if release.conda_official and platform.conda_official(series)]
        conda = [c + (f" ({', '.join(b.conda_platforms)})" if b.conda_platforms else "")
                 for c, b in release.cuda.items() if b.conda]
        wheel = [c for c, b in release.cuda.items() if b.wheel and not b.conda]
        python = f"{release.python[0]}–{release.python[1]}"
        if release.python_experimental:
            python += f" (+{', '.join(release.python_experimental)} experimental)"
        patches = ", ".join(table.patch_releases.get(series, ())) or "-"
        rows.append((series, patches, python, ", ".join(platforms) or "none", ", ".join(conda) or "-",
                     ", ".join(wheel) or "-", release.magma or "-", release.era))
    return _table(("release", "patch releases", "Python", "official conda packages on",
                   "CUDA with official conda packages", "CUDA upstream built as wheels only (buildable)", "MAGMA the official builds linked",
                   "recipe era"), rows)


def cuda_table() -> str:
    cuda = data.load().cuda
    rows = []
    for version, kit in cuda.toolkits.items():
        arches = cuda.arch_sets.get(kit.arch_set, ()) if kit.arch_set else ()
        window = f"{arches[0]} – {arches[-1]}" if arches else "-"
        rows.append((version, kit.full_version, window, kit.max_gcc or "-", kit.driver_linux or "-",
                     kit.runtime_upper))
    return _table(("CUDA", "toolkit", "arch window (nvcc)", "newest GCC", "Linux driver ≥", "runtime below"), rows)


def images_table() -> str:
    rows = [(accel, image.image or f"{image.base} (derived)", image.cuda_home or "-", image.cudnn or "not known",
             image.glibc or "not known", image.provides) for accel, image in containers.load_table().images.items()]
    return _table(("CUDA", "image", "CUDA_HOME", "cuDNN", "glibc", "carries"), rows)


def channels_table() -> str:
    table = channels.load_table()
    rows = []
    for rule in table.rules:
        when = ", ".join(f"{key} {value}" for key in ("pytorch", "python", "cuda", "accel", "platforms")
                         if (value := getattr(rule, key)) is not None) or "always"
        urls = ", ".join(table.channels[name].url for name in rule.channels) or "none"
        rows.append((rule.package, when, urls, rule.source))
    return _table(("package", "when", "channels (in this order, after --out and --channel)", "source"), rows)


def failures_table() -> str:
    rows = [(f"`{c.id}`", c.signature.title, c.signature.source) for c in diagnose.catalog().signatures]
    return _table(("signature", "what it recognises", "source of the message text"), rows)


def exit_codes_table() -> str:
    meaning = {
        ExitCode.OK: "success", ExitCode.USAGE: "bad input: an unknown option, a malformed value, a missing file",
        ExitCode.DATA: "torchforge's data tables are inconsistent (a bug in the data)",
        ExitCode.REFUSED: "a variant was refused (the message says why and what would work); nothing written",
        ExitCode.TOOL_MISSING: "a tool the command needs is missing (conda-build, docker, anaconda-client ...)",
        ExitCode.BUILD_FAILED: "a build failed (its log and `torchforge explain`'s diagnosis are printed)",
        ExitCode.UPLOAD_FAILED: "an upload or its verification failed",
        ExitCode.AUDIT_FAILED: "the RPATH audit flagged a package",
        ExitCode.PREFLIGHT_FAILED: "a preflight / `doctor` check failed",
        ExitCode.FILESYSTEM: "a file where a folder is needed, read-only, full disk",
        ExitCode.INTERNAL: "a bug in torchforge: one line; `TORCHFORGE_DEBUG=1` shows the traceback",
        ExitCode.INTERRUPTED: "interrupted (Ctrl-C); the rerun converges",
    }
    return _table(("exit code", "name", "meaning"), [(int(code), code.name, meaning[code]) for code in ExitCode])


def stack_file_table() -> str:
    """The stack file's keys, from its schema (torchforge/stackfile/schema.py): where, type, default, meaning."""
    from torchforge.stackfile.schema import json_schema

    schema = json_schema()
    definitions = schema.get("$defs", {})
    sections = [("", schema), *((f"[{key}]" if key != "extensions" else "[[extensions]]",
                                 definitions[ref.rsplit("/", 1)[-1]]) for key, ref in (
        ("pytorch", "#/$defs/PytorchSection"), ("extensions", "#/$defs/Extension"),
        ("channels", "#/$defs/ChannelsSection")))]
    rows = []
    for section, model in sections:
        required = set(model.get("required", []))
        for key, field in model["properties"].items():
            if "$ref" in field or field.get("items", {}).get("$ref"):
                continue  # a table: its own rows follow
            default = "required" if key in required else json.dumps(field.get("default")) if "default" in field else ""
            rows.append((f"{section} `{key}`".strip(), _type(field), default, field.get("description", "")))
    return _table(("key", "type", "default", "what it says"), rows)


def _type(field: dict[str, object]) -> str:
    if "enum" in field:
        return " | ".join(json.dumps(v) for v in field["enum"])  # type: ignore[union-attr]
    if "anyOf" in field:
        return " or ".join(_type(part) for part in field["anyOf"])  # type: ignore[union-attr]
    if field.get("type") == "array":
        return f"array of {_type(field.get('items', {}))}"  # type: ignore[arg-type]
    if field.get("type") == "object":
        values = field.get("additionalProperties", {})
        keys = field.get("propertyNames", {})
        return f"table {_type(keys) if keys else 'string'} = {_type(values)}"  # type: ignore[arg-type]
    return str(field.get("type", "any"))


TABLES: dict[str, Callable[[], str]] = {
    "releases": releases_table, "cuda": cuda_table, "images": images_table, "channels": channels_table,
    "failures": failures_table, "exit-codes": exit_codes_table, "stack-file": stack_file_table,
}

REFERENCE_PAGES: dict[str, tuple[str, str, str]] = {
    "releases.md": ("PyTorch releases", "torchforge/data/pytorch.toml", "releases"),
    "cuda.md": ("CUDA toolkits and their arch windows", "torchforge/data/cuda.toml", "cuda"),
    "images.md": ("Build images", "torchforge/data/images.toml", "images"),
    "channels.md": ("Channels per recipe era", "torchforge/data/channels.toml", "channels"),
    "failures.md": ("Failure signatures of `torchforge explain`", "torchforge/data/failures.toml", "failures"),
}


def reference_page(title: str, source: str, table: str) -> str:
    return (f"# {title}\n\nGenerated by `make docs` from `{source}` (each value's source is in that file); "
            f"do not edit: a test fails when this page is stale.\n\n<!-- generated: {table} -->\n"
            f"<!-- end generated -->\n")


def run_sample(command: str) -> str:
    """The output of one machine-dependent documented command, run on the documentation machine."""
    text = docmachine.shown(docmachine.run(command, WIDTH))
    lines = [line.rstrip() for line in text.splitlines()]
    return "\n".join(lines) + "\n" if lines else ""


def run_example(command: str) -> str:
    """The output of one documented command, run from the repository root as a user would (stdout and stderr)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "COLUMNS": WIDTH, "NO_COLOR": "1", "TERM": "dumb", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    # One pipe for both streams, so notes (stderr) and results (stdout) come in the order a terminal shows them.
    result = subprocess.run(shlex.split(command, comments=True), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = [shown_path(line).rstrip() for line in result.stdout.splitlines()]
    return "\n".join(lines) + "\n" if lines else ""


def shown_path(text: str) -> str:
    """The checkout's folder as a reader's clone (`~/torchforge`), the home folder as `~`: an example never shows
    the folders of the machine that ran it. Rich pads table cells, so the padding follows the shorter text."""
    for real, shown in ((str(ROOT), "~/torchforge"), (str(Path.home()), "~")):
        text = re.sub(re.escape(real) + r"(?![\w.-])(\S*)( *)",
                      lambda m, r=real, s=shown: s + m[1] + _padded(m[2], len(r) - len(s)), text)
    return text


def _padded(spaces: str, change: int) -> str:
    """A cell's trailing spaces after its text grew shorter by `change` (longer where negative; a path shorter
    than its shown form takes the spaces it lacks from the padding, as far as there is padding)."""
    return spaces + " " * change if change >= 0 else spaces[:max(0, len(spaces) + change)]


def fill_output(block: str, kind: str = "exact") -> str:
    run = run_sample if kind == "sample" else run_example
    out: list[str] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out += [line, *run(line[2:]).splitlines()]
    return "\n".join(out) + "\n"


def regenerate(text: str, *, outputs: bool = True, kinds: tuple[str, ...] = ("exact", "sample")) -> str:
    text = GENERATED.sub(lambda m: m.group(1) + TABLES[m.group(2)]() + m.group(4), text)
    if outputs:
        text = OUTPUT.sub(lambda m: m.group(1) + (fill_output(m.group(3), m.group(2)) if m.group(2) in kinds
                                                  else m.group(3)) + m.group(4), text)
    return text


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    REFERENCE.mkdir(parents=True, exist_ok=True)
    stale: list[str] = []
    expected_reference = {REFERENCE / name: reference_page(*facts) for name, facts in REFERENCE_PAGES.items()}
    try:  # made once before anything is written: where it cannot be made, no page is half regenerated
        docmachine.probe() if not check else None
    except docmachine.ShownMachineError as exc:
        print(f"the sample examples run on the documentation machine, which cannot be made here ({exc}); "
              "run `make docs` where `unshare -Urmn` works", file=sys.stderr)
        return 1
    for path in sorted({*pages(), *expected_reference}):
        current = path.read_text() if path.exists() else expected_reference.get(path, "")
        # --check compares tables and exact outputs; sample outputs take the documentation machine.
        new = regenerate(current, kinds=("exact",) if check else ("exact", "sample"))
        if new != (path.read_text() if path.exists() else None):
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(new)
    print(("stale: " if check else "regenerated: ") + (", ".join(sorted(stale)) or "nothing"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
