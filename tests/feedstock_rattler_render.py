"""torchforge's recipe.yaml (the embedded engine's format) rendered by the real py-rattler-build for one job of the
feedstock oracle (tests/feedstock_oracle.py), given in the oracle's meta.yaml field names so that it compares with
the feedstock's conda-build render field by field. Only the format's spelling is translated here, each with why;
real differences stay and are listed (or fixed) like the meta.yaml oracle's.

    python -m tests.feedstock_rattler_render [VERSION ...]   # the figures of the linux-64 jobs, every difference
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path


# rattler-build's key -> meta.yaml's (same meaning, other name)
REQUIREMENT_KEYS = {"build": "build", "host": "host", "run": "run", "run_constraints": "run_constrained"}
IGNORE_KEYS = {"by_name": "build.ignore_run_exports", "from_package": "build.ignore_run_exports_from"}


def render(folder: Path) -> dict:
    """{output: {"python": ..., "fields": {...}}} of a recipe.yaml folder, as tests/feedstock_render.py gives for
    a meta.yaml."""
    from rattler_build import Stage0Recipe, VariantConfig

    outputs: dict[str, dict] = {}
    for variant in Stage0Recipe.from_file(folder / "recipe.yaml").render(
            VariantConfig.from_file(folder / "variants.yaml")):
        rendered = variant.recipe.to_dict()
        # A staging output's build/host are what the output that inherits it is built with; meta.yaml's
        # top-level requirements are the same thing for libtorch.
        staged = [cache.requirements.to_dict() for cache in variant.recipe.staging_caches]
        name = rendered["package"]["name"]
        script = (rendered.get("build") or {}).get("script")
        outputs[name] = {"python": variant.variant.get("python", ""),
                         "fields": fields(rendered, staged, variant.variant),
                         # the variables the build script is given (the companion oracle runs build.sh with them)
                         "script_env": dict(script.get("env") or {}) if isinstance(script, dict) else {}}
    return outputs


def fields(rendered: dict, staged: list[dict], variant: dict) -> dict[str, object]:
    build = rendered.get("build") or {}
    requirements = rendered.get("requirements") or {}
    found: dict[str, object] = {"build.number": str(build["number"]), "build.string": build["string"]}
    if build.get("noarch"):
        found["build.noarch"] = build["noarch"]
    allow = (build.get("dynamic_linking") or {}).get("missing_dso_allowlist")
    if allow:  # rattler-build's name for missing_dso_whitelist
        found["build.missing_dso_whitelist"] = allow
    if (build.get("prefix_detection") or {}).get("ignore_binary_files"):
        # ignore_binary_files: true is meta.yaml's detect_binary_files_with_prefix: false
        found["build.detect_binary_files_with_prefix"] = False
    levels = int((build.get("variant") or {}).get("down_prioritize_variant") or 0)
    if levels:
        # rattler-build's down_prioritize_variant N is the package's track_features `{name}-p-0` ... `-p-{N-1}`
        # (what its packaging writes into index.json)
        found["build.track_features"] = [f"{rendered['package']['name']}-p-{i}" for i in range(levels)]
    exports = requirements.get("run_exports") or {}
    if exports:
        # meta.yaml's plain list is rattler-build's `weak` list
        found["build.run_exports"] = [_spec(s) for s in exports.get("weak", [])] if set(exports) == {"weak"} \
            else {k: [_spec(s) for s in v] for k, v in exports.items()}
    for key, field in IGNORE_KEYS.items():
        names = (requirements.get("ignore_run_exports") or {}).get(key)
        if names:
            found[field] = names
    for key, meta_key in REQUIREMENT_KEYS.items():
        specs = requirements.get(key) or next((s.get(key) for s in staged if s.get(key)), None) \
            if key in ("build", "host") else requirements.get(key)
        if specs:
            found[f"requirements.{meta_key}"] = [_requirement(s, key, variant) for s in specs]
    found.update(_tests(rendered.get("tests") or []))
    return found


def _requirement(spec: object, key: str, variant: dict) -> str:
    if isinstance(spec, dict):
        return _spec(spec)
    if key in ("build", "host"):
        return _pinned(spec, variant)
    fields = spec.split()
    if len(fields) == 3 and fields[1].startswith("=="):
        # rattler-build's exact `==V BUILD` is meta.yaml's `V BUILD` (conda reads a version next to a build string
        # as exact)
        fields[1] = fields[1][2:]
    return " ".join(fields)


def _spec(spec: object) -> str:
    """pin_subpackage as conda-build's unfinalized render leaves it: the bare name."""
    if isinstance(spec, dict):
        return next(iter(spec.values()))["name"]
    return str(spec)


def normalised(outputs: dict) -> dict:
    """What only the two formats spell differently, spelt one way on both sides (feedstock and torchforge):
    ignore_run_exports(_from) as package names (meta.yaml's `python *` and recipe.yaml's `python` ignore the same
    package: both tools match these entries by name); a version `V.*` alone as `V` (conda's fuzzy `V` is the glob
    `V.*`, which recipe.yaml must spell out); build.number as text (conda-build's render gives the top-level
    output's as text, the others' as a number)."""
    for output in outputs.values():
        found = output["fields"]
        if "build.number" in found:
            found["build.number"] = str(found["build.number"])
        for field in IGNORE_KEYS.values():
            if field in found:
                found[field] = [str(item).split()[0] for item in found[field]]
        for field in [f for f in found if f.startswith("requirements.") or f == "test.requires"]:
            found[field] = [_fuzzy(str(spec)) for spec in found[field]]
    return outputs


def _fuzzy(spec: str) -> str:
    fields = spec.split()
    if len(fields) == 2 and re.fullmatch(r"[0-9][0-9.]*\.\*", fields[1]):
        fields[1] = fields[1][:-2]
    return " ".join(fields)


def _pinned(spec: str, variant: dict) -> str:
    """A bare name in build/host pinned by the variant, as conda-build writes it into its render (rattler-build
    applies the same pin when it resolves, but its render keeps the bare name)."""
    key = spec.replace("-", "_")
    if " " in spec or key not in variant:
        return spec
    value = str(variant[key])
    return f"{spec} {value}" if (" " in value or "*" in value) else f"{spec} {value}.*"


def _tests(tests: list[dict]) -> dict[str, object]:
    """rattler-build's list of tests as meta.yaml's one test section: scripts in order, then the rest merged."""
    merged: dict[str, list] = {}
    for test in tests:
        merged.setdefault("test.commands", []).extend(test.get("script") or [])
        merged.setdefault("test.imports", []).extend((test.get("python") or {}).get("imports") or [])
        merged.setdefault("test.requires", []).extend(_spec(s) for s in (test.get("requirements") or {}).get("run", []))
        merged.setdefault("test.files", []).extend((test.get("files") or {}).get("recipe") or [])
        merged.setdefault("test.source_files", []).extend((test.get("files") or {}).get("source") or [])
    return {field: items for field, items in merged.items() if items}


def main(argv: list[str]) -> int:
    from tests.feedstock_oracle import compare, jobs, load_differences, print_figures, render_feedstock, \
        write_torchforge_recipe
    from torchforge.templates import RecipeFormat

    findings = []
    with tempfile.TemporaryDirectory() as scratch:
        for job in [job for job in jobs(argv or None) if job.platform == "linux-64"]:
            ours = render(write_torchforge_recipe(job, Path(scratch), RecipeFormat.RATTLER_BUILD))
            findings += compare(job, normalised(render_feedstock(job)), normalised(ours),
                                load_differences("rattler-build"))
    print_figures(findings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
