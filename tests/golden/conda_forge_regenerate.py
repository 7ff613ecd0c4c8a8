"""Render the conda-forge flavour's golden cases into tests/golden/conda-forge/ (`make goldens`)."""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

from torchforge import data as tables
from torchforge.flavours import conda_forge
from torchforge.sourcestate import Source
from torchforge.templates import RecipeFormat

HERE = Path(__file__).parent
GOLDEN = HERE / "conda-forge"


def cases() -> dict[str, dict[str, str]]:
    return tomllib.loads((HERE / "conda_forge_cases.toml").read_text())["cases"]


def render_case(case: dict[str, str]) -> dict[str, dict[str, str]]:
    recipes = conda_forge.plan_selection(case["pytorch"], case["cuda"], case.get("python"), case.get("platform"),
                                         case.get("arch_list"), 0)
    upstream = tables.load().pytorch.defaults.source_url  # what `torchforge render` names without --source
    recipe_format = RecipeFormat(case.get("format", RecipeFormat.CONDA_BUILD.value))
    return {r.id: conda_forge.recipe_files(r, Source("git", upstream, f"v{r.version}"), recipe_format=recipe_format)
            for r in recipes}


def main() -> int:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for name, case in cases().items():
        for folder, files in render_case(case).items():
            target = GOLDEN / name / folder
            target.mkdir(parents=True, exist_ok=True)
            for filename, content in files.items():
                (target / filename).parent.mkdir(parents=True, exist_ok=True)
                (target / filename).write_text(content)
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
