"""The compile cache: one plan of three Pythons, the 2nd and 3rd as a fraction of the 1st, per engine; and a
warm rebuild against its cold build for each way CMake compiles CUDA (its CUDA language, and FindCUDA).

The torch_heavy fixture (tests/fixtures/torch_heavy: PyTorch's layout and weight, not PyTorch) is built
through the real pytorch recipe for Python 3.10, 3.11 and 3.12 in one `torchforge build` plan, against a
stand-in channel that offers this machine's only interpreter (CPython 3.11) under all three versions (see
the fixture's README); its binding module is compiled again for each of them. 120 generated C++ units and
8 CUDA units (this machine's nvcc, sm_80) make the first build take minutes.

Figures, all from one run per engine:
- 2nd and 3rd Python wall time / 1st Python wall time (goal: below 0.15 each);
- warm rebuild / cold build: one more build of the 1st Python into a fresh channel with the same, now complete,
  cache (nothing left to compile: environment creation, CMake configure, link, packaging, checks);
- FindCUDA: the magma_findcuda fixture (tests/fixtures/magma_findcuda: MAGMA 2.6.1's find_package(CUDA) and
  cuda_add_library, 48 generated CUDA files, sm_80) built cold, again, and once with --no-cache through the magma
  recipe (rattler-build): warm / cold and warm / no-cache, with what ccache reused by kind and how many of FindCUDA's
  `nvcc -M` dependency scans the nvcc wrapper answered, each with the load average it was measured under (the
  machine is shared). Goal for both warm/cold ratios: below 0.15.

`--quick` (CI): 3 C++ and 1 CUDA unit, two Pythons, 2 FindCUDA kernels: it shows the benchmark runs, not figures.

Engines: the embedded rattler-build, and conda-build (the machine's, or the vendored one in `.venv-conda`,
through tests/condabuild.py). `python -m bench compile_cache` runs
only this one; TORCH_HEAVY_TUS overrides the number of C++ units.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bench import Row

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "torch_heavy"
FINDCUDA_FIXTURE = ROOT / "tests" / "fixtures" / "magma_findcuda"
PYTHONS = "3.10,3.11,3.12"
NATIVE = "torch_heavy (CMake CUDA language)"
FINDCUDA = "magma_findcuda (FindCUDA: cuda_add_library)"


def _env(quick: bool) -> tuple[tuple[str, str], ...]:
    tus = "3" if quick else os.environ.get("TORCH_HEAVY_TUS", "120")
    return (("TORCH_HEAVY_TUS", tus), ("TORCH_HEAVY_CUDA_ARCHS", "80"), ("TORCH_HEAVY_CUDA_TUS", "1" if quick else "8"))


def _pythons(quick: bool) -> str:
    return ",".join(PYTHONS.split(",")[:2]) if quick else PYTHONS


def _engine_rows(engine_name: str, stubs: Path, tmp: Path, quick: bool) -> list[Row]:
    from torchforge.channels import SiteChannels
    from torchforge.engines.choice import select_engine
    from torchforge.pipeline import BuildSettings, Pipeline
    from torchforge.sequence import official_steps
    from torchforge.proc import Runner
    from torchforge.flavours.official.render import plan
    from torchforge.flavours.official.variant import Options, Selection

    engine, _ = select_engine(engine_name)
    out = tmp / engine_name / "channel"
    cache = tmp / engine_name / "cache"
    selection = Selection.from_flags("2.9.0", "cpu", _pythons(quick), None,
                                     Options(source=str(FIXTURE), extra_env=_env(quick)))
    site = SiteChannels(replace=(f"file://{stubs}",))  # the stand-in channel instead of every data channel
    settings = BuildSettings(out=out, site_channels=site, cache_root=cache, extra_env={"MAX_JOBS": "2"})
    results = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(selection), engine, settings))
               if r.step.kind == "pytorch"]  # companion metapackages, if planned, are not compiled
    failed = [r for r in results if not r.ok]
    if failed:
        return [Row("compile cache", f"{engine_name}: build failed", "-", failed[0].error.splitlines()[0][:120], ok=False)]
    first, *later = results
    # The fixed overhead: the first Python once more, into a fresh channel, with the cache now complete.
    again = Selection.from_flags("2.9.0", "cpu", PYTHONS.split(",")[0], None,
                                 Options(source=str(FIXTURE), extra_env=_env(quick)))
    settings_again = BuildSettings(out=tmp / engine_name / "again", site_channels=site, cache_root=cache,
                                   extra_env={"MAX_JOBS": "2"})
    (overhead,) = [r for r in Pipeline(engine, Runner(), settings_again).run(official_steps(plan(again), engine, settings_again))
                   if r.step.kind == "pytorch"]
    rows = [Row("compile cache", f"{engine_name}, {NATIVE}: 1st Python (py{first.step.python}, cold cache)",
                f"{first.seconds:.0f} s", first.cache.summary() if first.cache else "no cache")]
    for result in later:
        rows.append(Row("compile cache", f"{engine_name}, {NATIVE}: py{result.step.python} / py{first.step.python}",
                        f"{result.seconds / first.seconds:.3f}",
                        f"{result.seconds:.0f} s; {result.cache.summary() if result.cache else 'no cache'}"))
    rows.append(Row("compile cache", f"{engine_name}, {NATIVE}: warm rebuild (nothing to compile) / cold build",
                    f"{overhead.seconds / first.seconds:.3f}" if overhead.ok else "-",
                    f"{overhead.seconds:.0f} s; {overhead.cache.summary() if overhead.cache else overhead.error[:80]}",
                    ok=overhead.ok))
    return rows


def _findcuda_rows(tmp: Path, quick: bool) -> list[Row]:
    """The FindCUDA fixture through the magma recipe: cold and then warm into the same channel and cache, and the
    same build with --no-cache."""
    from tests.cuda_standin import make_stand_in_toolkit
    from tests.test_build import NVCC_RELEASE, nvcc_release
    from tests.test_compile_cache import findcuda_tree
    from torchforge.engines.rattler_build import RattlerBuildEngine
    from torchforge.flavours.official.magmasource import inspect
    from torchforge.pipeline import BuildSettings, Pipeline, StepResult
    from torchforge.sequence import official_steps
    from torchforge.proc import Runner
    from torchforge.flavours.official.render import plan
    from torchforge.flavours.official.variant import Options, Selection

    if nvcc_release() != NVCC_RELEASE:
        return [Row("compile cache", f"{FINDCUDA}: warm rebuild / cold build", "-", f"needs nvcc {NVCC_RELEASE} on PATH")]
    kernels = 2 if quick else int((FINDCUDA_FIXTURE / "magmablas" / "kernels.txt").read_text())
    tree = findcuda_tree(tmp / "findcuda", kernels)
    engine = RattlerBuildEngine()
    selection = Selection("2.9.0", (NVCC_RELEASE,), ("3.12",), "linux-64",
                          Options(arch_list="8.0", magma_source=inspect(str(tree))))
    def build(use_cache: bool) -> tuple[StepResult, str]:
        settings = BuildSettings(out=tmp / "findcuda" / "channel", magma_only=True, force=True, use_cache=use_cache,
                                 extra_env={"MAX_JOBS": "2"})
        (result,) = Pipeline(engine, Runner(), settings).run(official_steps(plan(selection), engine, settings))
        return result, _load()

    saved = os.environ.get("CUDA_HOME")
    os.environ["CUDA_HOME"] = str(make_stand_in_toolkit(tmp / "findcuda" / "cuda"))  # FindCUDA wants cuBLAS
    try:
        # Cold (filling the cache), warm (from it), and the plain alternative: the same build with --no-cache.
        (cold, cold_load), (warm, warm_load), (plain, plain_load) = build(True), build(True), build(False)
    finally:
        if saved is None:
            del os.environ["CUDA_HOME"]
        else:
            os.environ["CUDA_HOME"] = saved
    failed = [r for r in (cold, warm, plain) if not r.ok]
    if failed:
        return [Row("compile cache", f"{FINDCUDA}: build failed", "-", failed[0].error.splitlines()[0][:120], ok=False)]
    label = f"rattler-build, {FINDCUDA}, {kernels} CUDA files"
    def summary(result: StepResult) -> str:
        return result.cache.summary() if result.cache else "no cache"
    return [Row("compile cache", f"{label}: cold build", f"{cold.seconds:.0f} s", f"{summary(cold)}; {cold_load}"),
            Row("compile cache", f"{label}: build with --no-cache", f"{plain.seconds:.0f} s", plain_load),
            Row("compile cache", f"{label}: warm rebuild / cold build", f"{warm.seconds / cold.seconds:.3f}",
                f"{warm.seconds:.0f} s; {summary(warm)}; {warm_load}"),
            Row("compile cache", f"{label}: warm rebuild / build with --no-cache", f"{warm.seconds / plain.seconds:.3f}",
                f"{plain.seconds:.0f} s without the cache")]


def _load() -> str:
    """The machine is shared: each figure comes with the load it was measured under."""
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(ROOT))  # tests/stubchannel.py lives in the test package
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from tests.stubchannel import make_stub_channel, recipe_requirements
    from torchforge.flavours.official.recipe import pytorch_context
    from torchforge.flavours.official.render import plan, render_files
    from torchforge.templates import RecipeFormat
    from torchforge.flavours.official.variant import Options, Selection

    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp_name:
        tmp = Path(tmp_name)
        selection = Selection.from_flags("2.9.0", "cpu", _pythons(quick), None,
                                         Options(source=str(FIXTURE), extra_env=_env(quick)))
        specs = [spec for variant in plan(selection).variants
                 for spec in recipe_requirements(render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"])]
        stubs = tmp / "stubs"
        make_stub_channel(stubs, [*specs, "pip"], python_alias=True)
        rows = _engine_rows("rattler-build", stubs, tmp, quick) + _findcuda_rows(tmp, quick)
        tool = find_conda_tool()
        if tool is None:
            return rows + [Row("compile cache", "conda-build", "-", HOW_TO_GET_ONE)]
        saved = dict(os.environ)
        os.environ.update(tool.env(tmp / "conda"))
        try:
            return rows + _engine_rows("conda-build", stubs, tmp, quick)
        finally:
            os.environ.clear()
            os.environ.update(saved)
