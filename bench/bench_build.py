"""`torchforge build`: the planning cost for the full default matrix, and what a resumed build saves.

- plan: classify + render + the official flavour's steps (every recipe rendered for the engine) for
  `Selection.from_flags(None, None, None, None, Options())`, in-process, no build;
- resume: the torch_like fixture (PyTorch's layout, not PyTorch) built twice with the same request, as a
  conda package (embedded rattler-build engine, stand-in channel from tests/stubchannel.py) and as a wheel;
  the second run finds everything in --out and skips it. Both runs are `torchforge` processes, timed here.
  The conda build reads a site config whose `[channels] replace` puts the stand-in channel in place of every
  data channel (conda-forge, pytorch: unreachable here, as on any offline site).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import Row, timed
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.pipeline import BuildSettings
from torchforge.sequence import official_steps
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.variant import Options, Selection

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "torch_like"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def _plan_default_matrix(out: Path) -> int:
    render_plan = plan(Selection.from_flags(None, None, None, None, Options()))
    return len(official_steps(render_plan, RattlerBuildEngine(), BuildSettings(out=out)))


def _torchforge(args: list[str]) -> float:
    command = [str(Path(sys.executable).parent / "torchforge"), "build", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _resume_rows(tmp: Path) -> list[Row]:
    sys.path.insert(0, str(ROOT))  # tests/stubchannel.py lives in the test package
    from tests.stubchannel import make_stub_channel, recipe_requirements
    from torchforge.flavours.official.recipe import pytorch_context
    from torchforge.flavours.official.render import render_files
    from torchforge.templates import RecipeFormat

    request = ["--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", PY, "--source", str(FIXTURE)]
    (variant,) = plan(Selection.from_flags("2.9.0", "cpu", PY, None, Options(source=str(FIXTURE)))).variants
    recipe = render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"]
    stubs = tmp / "stubs"
    make_stub_channel(stubs, [*recipe_requirements(recipe), "pip"])
    site = tmp / "torchforge.toml"
    site.write_text(f'[channels]\nreplace = ["file://{stubs}"]\n')
    conda = [*request, "--out", str(tmp / "channel"), "--config", str(site), "--skip-preflight"]
    wheel = [*request, "--format", "wheel", "--out", str(tmp / "wheel-out"), "--skip-preflight"]  # as the conda row
    rows = []
    for label, args in (("conda package (rattler-build)", conda), ("wheel (pip wheel + repair)", wheel)):
        first = _torchforge(args)
        second = _torchforge(args)
        rows.append(Row("build", f"torch_like {label}: second identical build / first",
                        f"{second / first:.3f}", f"first {first:.2f} s, second (all skipped) {second:.2f} s"))
    return rows


def run(quick: bool = False) -> list[Row]:
    repeat = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp_name:
        tmp = Path(tmp_name)
        steps = _plan_default_matrix(tmp / "plan-out")  # warm: data tables and templates loaded once
        seconds = timed(lambda: _plan_default_matrix(tmp / "plan-out"), repeat=repeat)
        rows = [Row("build", f"plan the full default matrix ({steps} steps: classify + render + steps)",
                    f"{seconds * 1000:.1f} ms", f"best of {repeat}, in-process, rattler-build recipes")]
        return rows + _resume_rows(tmp)
