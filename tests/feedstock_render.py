"""Run by .venv-conda's Python (the real conda-build 26.7.1), not by torchforge's: render one recipe folder for
one job and print every output's compared fields as JSON.

    python tests/feedstock_render.py RECIPE_DIR ARCH PYTHON [VARIANT_FILE]

ARCH: the machine the job is rendered as native on (64 or aarch64: torchforge builds on the machine itself, so the
feedstock's aarch64 job, which conda-forge cross-compiles, is rendered natively too). PYTHON (3.12): the one
Python the job is rendered for; VARIANT_FILE (a .ci_support job) is cut to that Python's row of its zip_keys
(without one, the folder's own variant file must name only that Python).
The recipe folder's own conda_build_config.yaml is read as conda-build always does. Nothing is downloaded or
solved (finalize=False, bypass_env_check): the fields are the recipe's own, with selectors and Jinja applied.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml
from conda_build import api
from conda_build.config import Config

BUILD_KEYS = ("number", "string", "run_exports", "ignore_run_exports", "ignore_run_exports_from", "track_features",
              "missing_dso_whitelist", "detect_binary_files_with_prefix", "noarch")
REQUIREMENT_KEYS = ("build", "host", "run", "run_constrained")
OWN_PACKAGES = ("libtorch", "pytorch", "pytorch-cpu", "pytorch-gpu")
TEST_KEYS = ("requires", "imports", "commands", "source_files", "files")


def one_python(variant_file: Path, python: str, folder: Path) -> Path:
    """The job's variant file with only `python`'s row of the keys zipped with python."""
    variants = yaml.safe_load(variant_file.read_text())
    row = next(i for i, value in enumerate(variants["python"]) if str(value).split(".*")[0] == python)
    zipped = next((group for group in variants.get("zip_keys", []) if "python" in group), ["python"])
    for key in zipped:
        if key in variants:
            variants[key] = [variants[key][row]]
    # The global pins of the recipe's own packages (libtorch 2.12 ...): unfinalized, pin_subpackage leaves a bare
    # name that conda-build would pin to them, which a finalized render never does.
    for own in OWN_PACKAGES:
        variants.pop(own, None)
    out = folder / "job.yaml"
    out.write_text(yaml.safe_dump(variants))
    return out


def fields(meta: dict) -> dict[str, object]:
    build = meta.get("build") or {}
    requirements = meta.get("requirements") or {}
    test = meta.get("test") or {}
    found: dict[str, object] = {f"build.{k}": build[k] for k in BUILD_KEYS if build.get(k) not in (None, [], {})}
    found.update({f"requirements.{k}": requirements[k] for k in REQUIREMENT_KEYS if requirements.get(k)})
    found.update({f"test.{k}": test[k] for k in TEST_KEYS if test.get(k)})
    return found


def main(argv: list[str]) -> int:
    recipe, arch, python = Path(argv[0]), argv[1], argv[2]
    with tempfile.TemporaryDirectory() as scratch:
        variant_files = [str(one_python(Path(argv[3]), python, Path(scratch)))] if len(argv) > 3 else []
        config = Config(platform="linux", arch=arch, variant_config_files=variant_files, croot=str(Path(scratch) / "bld"),
                        no_download_source=True, verbose=False, quiet=True)
        # without a job file the folder's own conda_build_config.yaml is the job (torchforge's, planned for PYTHON)
        rendered = api.render(str(recipe), config=config, finalize=False, bypass_env_check=True)
        outputs = {}
        for metadata, _, _ in rendered:
            name = metadata.name()
            py = metadata.config.variant.get("python", "")
            if name in outputs and outputs[name]["python"] != py:
                raise SystemExit(f"{name}: rendered for several Pythons ({outputs[name]['python']}, {py})")
            outputs[name] = {"python": py, "fields": fields(metadata.meta)}
    json.dump(outputs, sys.stdout, indent=1, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
