"""Time to classify and render every official variant in the data, in-process (target: under one second)."""

from __future__ import annotations

import time

from bench import Row
from torchforge import data as tables
from torchforge import platforms
from torchforge.flavours.official.render import plan, recipe_folders
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.variant import Options, Selection
from torchforge.versions import parse


def official_selections() -> list[Selection]:
    """Every official release's CUDA builds and Pythons, on Linux and Windows (each platform's own Python range:
    PyTorch 1.4-1.5 had Python 3.5 on Linux only)."""
    selections = []
    for key, release in tables.load().pytorch.releases.items():
        if not release.conda_official:
            continue
        cudas = [c for c, b in release.cuda.items() if b.conda] + ["cpu"]
        for platform in ("linux-64", "win-64"):
            low, high = (parse(v) for v in platforms.get(platform).python_range(release, f"{key}.0"))
            pythons = [f"3.{m}" for m in range(low.minor, high.minor + 1)]
            selections.append(Selection.from_flags(f"{key}.0", ",".join(cudas), ",".join(pythons), platform, Options()))
    return selections


def run(quick: bool = False) -> list[Row]:  # already small: quick changes nothing
    tables.load()  # data loading is measured separately below
    start = time.perf_counter()
    tables.load.cache_clear()
    tables.load()
    load_s = time.perf_counter() - start

    selections = official_selections()
    start = time.perf_counter()
    plans = [plan(s) for s in selections]
    classify_s = time.perf_counter() - start
    variants = sum(len(p.variants) for p in plans)
    rows = [
        Row("render", "load + validate data tables", f"{load_s * 1000:.1f} ms"),
        Row("render", f"classify {variants} official variants", f"{classify_s * 1000:.1f} ms"),
    ]
    for fmt in RecipeFormat:
        start = time.perf_counter()
        folders = sum(len(recipe_folders(p, fmt)) for p in plans)
        render_s = time.perf_counter() - start
        total = classify_s + render_s
        rows.append(Row(
            "render", f"classify + render all ({fmt.value}, {folders} folders incl. magma)", f"{total:.3f} s",
            f"target < 1 s; {total / folders * 1000:.2f} ms per folder; rendering is {render_s / classify_s:.1f}x classification",
        ))
    return rows
