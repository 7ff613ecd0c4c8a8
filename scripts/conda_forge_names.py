"""Rebuild torchforge/data/conda_forge_names.toml from feedstock snapshots, and say what changed.

    python scripts/conda_forge_names.py [--write]     # `make conda-forge-names`

Each feedstock of the record's [meta] feedstocks is read from its snapshot (the `fetch` tool's git mirror,
/work/.mirror/conda-forge+NAME-feedstock/repo, or $TORCHFORGE_MIRRORS): the package names its recipe
(recipe/meta.yaml or recipe/recipe.yaml at the snapshot's HEAD) makes, `{{ name }}` / `${{ name }}` filled in from
its `{% set name %}` or `context:`, each cited REPO@COMMIT:FILE:LINE. Without --write it prints the names added,
removed and re-cited, and exits 1 where the record is not current.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "torchforge" / "data" / "conda_forge_names.toml"
MIRRORS = Path(os.environ.get("TORCHFORGE_MIRRORS", "/work/.mirror"))
RECIPES = ("recipe/recipe.yaml", "recipe/meta.yaml")
_SET = re.compile(r"""\{%\s*set\s+(\w+)\s*=\s*["']([^"']+)["']\s*%\}""")
_CONTEXT = re.compile(r"""^  (\w+):\s*["']?([^"'\s#]+)["']?""")
_NAME = re.compile(r"^(\s*)(?:-\s+)?name:\s*(.+?)\s*$")
_REFERENCE = re.compile(r"\$?\{\{\s*(\w+)(\|lower)?\s*\}\}")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _variables(text: str) -> dict[str, str]:
    found = dict(_SET.findall(text))
    in_context = False
    for line in text.splitlines():
        if line.startswith("context:"):
            in_context = True
            continue
        if in_context and line and not line.startswith(" "):
            in_context = False
        if in_context and (m := _CONTEXT.match(line)):
            found[m.group(1)] = m.group(2)
    return found


def _filled(value: str, variables: dict[str, str]) -> str | None:
    def one(match: re.Match[str]) -> str:
        word = variables.get(match.group(1), match.group(0))
        return word.lower() if match.group(2) else word

    name = _REFERENCE.sub(one, value.strip("\"'"))
    return name if re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) else None


def package_names(text: str) -> list[tuple[str, int]]:
    """(name, line) of every package a recipe makes: `name:` outside its context:, recipe: and about: blocks."""
    variables, names, block = _variables(text), [], ""
    for number, line in enumerate(text.splitlines(), 1):
        if line and not line.startswith((" ", "-", "#", "{")):
            block = line.split(":")[0]
        found = _NAME.match(line)
        if not found or block in ("context", "recipe", "about", "extra", "source") or "- name:" in line and \
                block == "requirements":
            continue
        name = _filled(found.group(2), variables)
        if name is not None:
            names.append((name, number))
    return names


def rebuild(feedstocks: list[str]) -> dict[str, str]:
    """{package name: citation} of every feedstock's snapshot."""
    names: dict[str, str] = {}
    for feedstock in feedstocks:
        repo = MIRRORS / f"conda-forge+{feedstock}" / "repo"
        commit = _git(repo, "rev-parse", "HEAD").strip()
        listed = _git(repo, "ls-tree", "-r", "--name-only", commit, "recipe/").split()
        recipe = next((r for r in RECIPES if r in listed), None)
        if recipe is None:
            raise SystemExit(f"{feedstock}@{commit[:12]}: no {' or '.join(RECIPES)}")
        for name, line in package_names(_git(repo, "show", f"{commit}:{recipe}")):
            names.setdefault(name, f"conda-forge/{feedstock}@{commit}:{recipe}:{line}")
    return dict(sorted(names.items()))


def render(feedstocks: list[str], names: dict[str, str]) -> str:
    listed = ", ".join(f'"{f}"' for f in feedstocks)
    lines = ["# The package names conda-forge provides, as far as torchforge's record knows: each is made by a feedstock's",
             "# recipe at a snapshot's commit (the `fetch` tool), cited REPO@COMMIT:FILE:LINE of the line that names it.",
             "# A name found in no feedstock here is \"not on conda-forge as far as the record knows\" (no machine here",
             "# reaches conda-forge; with network, the channel's own repodata decides). Rebuilt by",
             "# `make conda-forge-names` (scripts/conda_forge_names.py), which says what changed.",
             "schema = 1", "", "[meta]", f"feedstocks = [{listed}]", "", "[names]"]
    lines += [f'{name} = "{source}"' for name, source in names.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    current = tomllib.loads(RECORD.read_text())
    feedstocks = list(current["meta"]["feedstocks"])
    names = rebuild(feedstocks)
    old: dict[str, str] = current.get("names", {})
    for name in sorted(set(names) - set(old)):
        print(f"added {name}: {names[name]}")
    for name in sorted(set(old) - set(names)):
        print(f"removed {name} (was {old[name]})")
    for name in sorted(n for n in set(names) & set(old) if names[n] != old[n]):
        print(f"re-cited {name}: {old[name]} -> {names[name]}")
    if "--write" in argv:
        RECORD.write_text(render(feedstocks, names))
        print(f"wrote {RECORD.relative_to(ROOT)}: {len(names)} names from {len(feedstocks)} feedstocks")
        return 0
    return 0 if names == old else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
