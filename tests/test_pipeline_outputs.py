"""The pipeline's step of several outputs (the conda-forge flavour's shape: a library, a Python package per Python,
a metapackage, all from one engine run), with the real conda-build (tests/condabuild.py) on a small recipe of the
same shape (tests/fixtures/split_outputs): every planned package is built, checked, audited and published together;
it is reused only when every output exists with the same recorded settings, else all are rebuilt; a package that
is not what was planned fails the step and nothing is published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.condabuild import HOW_TO_GET_ONE, CondaTool, find_conda_tool
from torchforge import localchannel
from torchforge.engines.conda_build import CondaBuildEngine
from torchforge.flavours import Plan
from torchforge.pipeline import Action, BuildSettings, Pipeline, PlannedRecipe, plan_steps
from torchforge.proc import Runner

FIXTURE = Path(__file__).parent / "fixtures" / "split_outputs"
SETTINGS = json.dumps({"flavour": "test", "arch_list": "", "build_number": 0}, sort_keys=True)
DIGEST = "1a2b3c4"
STEMS = (f"libsplit-1.0-cpu_torchforge_h{DIGEST}_0", f"pysplit-1.0-cpu_torchforge_py311_h{DIGEST}_0",
         f"split-cpu-1.0-cpu_torchforge_h{DIGEST}_0")


def recipe(stems: tuple[str, ...] = STEMS, digest: str = DIGEST, settings: str = SETTINGS,
           channel: str = "") -> PlannedRecipe:
    files = {p.name: p.read_text().replace("DIGEST", digest).replace("SETTINGS", settings)
             for p in FIXTURE.iterdir()}
    return PlannedRecipe("split-demo-1.0-cpu", "linux-64", stems, settings, files, (channel,) if channel else ())


def settings(out: Path, **changes: object) -> BuildSettings:
    return BuildSettings(out=out, test=False, use_cache=False, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def conda_tool() -> CondaTool:
    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    return tool


@pytest.fixture(scope="module")
def built(conda_tool: CondaTool, tmp_path_factory: pytest.TempPathFactory):
    """One real conda-build run of the recipe through the pipeline, against a stand-in channel."""
    from tests.stubchannel import make_stub_channel

    root = tmp_path_factory.mktemp("split")
    stubs = root / "stubs"
    make_stub_channel(stubs, ["python 3.11", "pip", "patchelf"])
    monkeypatch = pytest.MonkeyPatch()
    for name, value in conda_tool.env(root / "conda").items():
        monkeypatch.setenv(name, value)
    events: list[str] = []
    steps = plan_steps(Plan("test", (recipe(channel=f"file://{stubs}"),)), settings(root / "out"))
    results = Pipeline(CondaBuildEngine(), Runner(), settings(root / "out"), on_event=events.append).run(steps)
    yield root, stubs, steps, results, events
    monkeypatch.undo()


def test_one_build_publishes_every_planned_output_together(built) -> None:
    root, _, steps, results, events = built
    assert [s.action for s in steps] == [Action.BUILD] and steps[0].stems == STEMS and steps[0].reason == ""
    [result] = results
    assert result.ok, result.error
    assert [a.name for a in result.artifacts] == [f"{stem}.conda" for stem in STEMS]
    assert all(a.parent == root / "out" / "linux-64" for a in result.artifacts)
    repodata = json.loads((root / "out" / "linux-64" / "repodata.json").read_text())
    listed = {f"{r['name']}-{r['version']}-{r['build']}" for r in repodata["packages.conda"].values()}
    assert listed == set(STEMS)
    # each carries the recipe's recorded settings (the reuse check reads them) and the planned identity
    for artifact in result.artifacts:
        assert localchannel.about_extra(artifact)["torchforge_settings"] == SETTINGS
    index = localchannel.info_json(result.artifacts[1], "index.json")
    assert f"libsplit 1.0 cpu_torchforge_h{DIGEST}_0" in index["depends"]
    assert any(e.startswith(f"build {', '.join(STEMS)} (conda-build)") for e in events)


def test_a_rerun_reuses_all_outputs_and_says_what_was_compared(built, capsys: pytest.CaptureFixture[str]) -> None:
    root, stubs, _, _, _ = built
    [step] = plan_steps(Plan("test", (recipe(channel=f"file://{stubs}"),)), settings(root / "out"))
    assert step.action is Action.REUSE
    assert step.reason.startswith(f"all 3 outputs: already in {root / 'out'}, built with the same settings (")
    assert step.reason.endswith("built with the same settings (build number 0, flavour test)")  # empty arch list: unsaid
    from torchforge.commands.build import print_results

    events: list[str] = []
    results = Pipeline(CondaBuildEngine(), Runner(), settings(root / "out"), on_event=events.append).run([step])
    assert events == [f"reuse {', '.join(STEMS)}: {step.reason}"]
    capsys.readouterr()
    print_results(results)
    rows = [[c.strip() for c in line.split("│")] for line in capsys.readouterr().out.splitlines() if "│" in line]
    rows = [r for r in rows if r[1]]
    assert [r[1] for r in rows] == list(STEMS) and rows[0][6].startswith("all 3 outputs: already in")
    assert rows[1][6] == rows[2][6] == "(same build)"


def test_other_settings_or_one_missing_output_rebuild_all(built, tmp_path: Path) -> None:
    root, stubs, _, _, _ = built
    other = json.dumps({"flavour": "test", "arch_list": "8.0", "build_number": 0}, sort_keys=True)
    [step] = plan_steps(Plan("test", (recipe(settings=other),)), settings(root / "out"))
    assert step.action is Action.BUILD
    assert "was built with other settings" in step.reason and "planned: arch list 8.0" in step.reason
    assert step.reason.endswith("one build makes all 3 outputs, so all are rebuilt")
    # a channel holding two of the three outputs (as a --channel): the third is named, all are rebuilt
    partial = tmp_path / "partial"
    for stem in STEMS[:2]:
        localchannel.publish(root / "out" / "linux-64" / f"{stem}.conda", partial, "linux-64")
    [step] = plan_steps(Plan("test", (recipe(),)), settings(tmp_path / "new-out", channels=(f"file://{partial}",)))
    assert step.action is Action.BUILD
    assert step.reason == f"{STEMS[2]} is in no channel; one build makes all 3 outputs, so all are rebuilt"
    [step] = plan_steps(Plan("test", (recipe(),)), settings(root / "out", force=True))
    assert step.action is Action.BUILD


def test_a_package_other_than_planned_fails_the_step_and_nothing_is_published(
        built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe makes build 0 of each output; a plan that names another build string of one output is not met:
    the step fails naming it, and not even the outputs that match are published."""
    _, stubs, _, _, _ = built
    wrong = (*STEMS[:2], STEMS[2].replace("_0", "_7"))
    out = tmp_path / "out"
    steps = plan_steps(Plan("test", (recipe(wrong, channel=f"file://{stubs}"),)), settings(out))
    [result] = Pipeline(CondaBuildEngine(), Runner(), settings(out)).run(steps)
    assert not result.ok and result.artifacts == ()
    assert f"no {wrong[2]}.conda/.tar.bz2 was produced" in result.error
    assert f"{STEMS[2]}.conda" in result.error  # what was built instead
    assert not list(out.glob("linux-64/*.conda"))
    from torchforge.commands.build import print_results

    capsys.readouterr()
    print_results([result])
    cells = [[c.strip() for c in line.split("│")] for line in capsys.readouterr().out.splitlines() if "│" in line]
    rows = [r for r in cells if r[1]]  # a long error wraps onto lines of its own
    assert [(r[1], r[2]) for r in rows] == [(stem, "failed") for stem in wrong]
    assert rows[0][6].startswith(f"split-demo-1.0-cpu: no {wrong[2]}") and rows[1][6] == rows[2][6] == "(same build)"


def test_dry_run_prints_the_one_command_that_builds_every_output(tmp_path: Path) -> None:
    printed: list[str] = []
    out = tmp_path / "out"
    steps = plan_steps(Plan("test", (recipe(channel="https://conda.anaconda.org/conda-forge"),)), settings(out))
    [result] = Pipeline(CondaBuildEngine(), Runner(dry_run=True, echo=printed.append), settings(out)).run(steps)
    assert result.ok and not out.exists()
    staging = out / ".torchforge-tmp-staging-split-demo-1.0-cpu"
    assert printed == [f"[dry-run] conda build {out}/recipes/split-demo-1.0-cpu --output-folder {staging} "
                       f"-c file://{out.resolve()} -c https://conda.anaconda.org/conda-forge --override-channels "
                       "--no-anaconda-upload --no-test"]


def test_the_results_table_has_a_row_per_output_with_its_published_file(
        built, capsys: pytest.CaptureFixture[str]) -> None:
    from torchforge.commands.build import print_results

    _, _, _, results, _ = built
    capsys.readouterr()
    print_results(results)
    rows = [line for line in capsys.readouterr().out.splitlines() if "torchforge_" in line]
    assert len(rows) == 3
    for row, stem, artifact in zip(rows, STEMS, results[0].artifacts):
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[1] == stem and cells[2] == "ok" and cells[6] == str(artifact)
