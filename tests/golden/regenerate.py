"""Render every golden case into tests/golden/expected/ (`make goldens`). Review the diff before committing."""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

from torchforge.flavours.official.render import RenderPlan, plan, recipe_folders

from torchforge.templates import RecipeFormat
from torchforge.flavours.official.variant import Options, Selection

HERE = Path(__file__).parent
EXPECTED = HERE / "expected"


def cases() -> dict[str, dict[str, str]]:
    return tomllib.loads((HERE / "cases.toml").read_text())["cases"]


def case_plan(case: dict[str, str]) -> RenderPlan:
    options = Options(jetson=case.get("jetson"), arch_list=case.get("arch_list"))
    return plan(Selection.from_flags(case["pytorch"], case["cuda"], case["python"], case.get("platform"), options))


def render_case(case: dict[str, str], fmt: RecipeFormat) -> dict[str, dict[str, str | bytes]]:
    return recipe_folders(case_plan(case), fmt)


def main() -> int:
    shutil.rmtree(EXPECTED, ignore_errors=True)
    for name, case in cases().items():
        for fmt in RecipeFormat:
            for folder, files in render_case(case, fmt).items():
                target = EXPECTED / name / fmt.value / folder
                target.mkdir(parents=True, exist_ok=True)
                for filename, content in files.items():
                    (target / filename).write_text(content if isinstance(content, str) else content.decode())
    print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
