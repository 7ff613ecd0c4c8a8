"""End to end on this CPU machine: the conda-forge flavour's torchvision recipe, built through the pipeline against
the pytorch package of a local channel, installed next to it into a fresh prefix with py-rattler, imported and run.

The pytorch is tests/fixtures/torch_split built by `torchforge build` (the conda-forge flavour, the embedded
engine); the torchvision sources are tests/fixtures/vision_split (a miniature laid out like torchvision: a C++
extension linking the installed libtorch; its README says what it stands in for); everything else comes from a
stand-in channel (torchforge.standin: python, pip, setuptools, pillow ... as tiny packages of their shape).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.test_conda_forge_split import (PY, build_arguments, copy_fixture, flavour_commands_with_inputs, install_solved,
                                          run_checked)
from torchforge.channels import SiteChannels
from torchforge.cli import main
from torchforge.flavours import conda_forge
from torchforge.flavours.conda_forge import stack as conda_forge_stack

VISION = Path(__file__).parent / "fixtures" / "vision_split"
OWN = {"torchvision", "pytorch", "libtorch", "pytorch-cpu", "pytorch-gpu"}


def pytorch_package(recipe: conda_forge.CondaForgeRecipe) -> conda_forge_stack.PytorchBuild:
    """The pytorch file the flavour plans for PY: exactly what the torchvision recipe pins."""
    output = next(o for o in recipe.planned_outputs() if o.name == "pytorch" and o.python == PY)
    return conda_forge_stack.PytorchBuild(output.version, output.build_string, output.subdir, PY, recipe.cuda,
                                          None)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from torchforge import standin
    from torchforge.engines.choice import select_engine
    from torchforge.flavours.base import Plan
    from torchforge.pipeline import BuildSettings, Pipeline, plan_steps
    from torchforge.proc import Runner

    root = tmp_path_factory.mktemp("stack")
    torch_source, vision_source = copy_fixture(root / "torch_split"), Path(shutil.copytree(VISION, root / "vision"))
    (pytorch,) = flavour_commands_with_inputs(conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,)), torch_source)
    vision = conda_forge_stack.plan("torchvision", pytorch_package(pytorch))
    planned = conda_forge_stack.planned_recipe(vision, "rattler-build", conda_forge.load().flavour.channel,
                                               str(vision_source))
    recipes = root / "recipes"
    assert main(["render", *build_arguments("cpu", None, torch_source), "--format", "rattler-build",
                 "--out", str(recipes)]) == 0
    (recipes / vision.id).mkdir()
    for name, text in planned.files.items():
        (recipes / vision.id / name).write_text(str(text), encoding="utf-8")
    specs = {*standin.rendered_recipe_requirements(recipes / pytorch.id, {o.name for o in pytorch.outputs}),
             *standin.rendered_recipe_requirements(recipes / vision.id, OWN)}
    stubs, out = root / "stubs", root / "channel"
    standin.make_stub_channel(stubs, sorted(specs), conda_forge=True)
    (root / "torchforge.toml").write_text(f'[channels]\nreplace = ["{stubs.as_uri()}"]\n')
    assert main(["build", *build_arguments("cpu", None, torch_source), "--engine", "rattler-build",
                 "--config", str(root / "torchforge.toml"), "--out", str(out)]) == 0
    engine, _ = select_engine("rattler-build")
    settings = BuildSettings(out=out, site_channels=SiteChannels(replace=(stubs.as_uri(),)))
    results = Pipeline(engine, Runner(), settings).run(plan_steps(Plan("conda-forge", (planned,)), settings))
    logs = [log.read_text()[-4000:] for log in (out / "logs").glob("*torchvision*")]
    assert [r.ok for r in results] == [True], logs
    return {"vision": vision, "pytorch": pytorch, "out": out, "stubs": stubs, "settings": settings,
            "planned": planned}


@pytest.mark.slow
def test_the_planned_torchvision_package_is_in_the_channel_and_pins_the_exact_pytorch(stack) -> None:
    from tests.test_conda_forge_split import package_index

    vision: conda_forge_stack.CompanionRecipe = stack["vision"]
    package = stack["out"] / "linux-64" / f"{vision.stem}.conda"
    assert package.is_file(), sorted(p.name for p in (stack["out"] / "linux-64").iterdir())
    depends = package_index(package)["depends"]
    built = stack["vision"].pytorch
    assert f"pytorch {built.version} {built.build}" in depends or \
        f"pytorch =={built.version} {built.build}" in depends, depends
    assert any(d.startswith("python_abi") for d in depends), depends  # python's run_exports, as on conda-forge


@pytest.mark.slow
def test_installed_next_to_its_pytorch_it_imports_and_runs_on_the_channels_libtorch(stack, tmp_path: Path) -> None:
    vision: conda_forge_stack.CompanionRecipe = stack["vision"]
    prefix = tmp_path / "env"
    records = install_solved([stack["out"], stack["stubs"]], ["torchvision"], None, prefix)
    chosen = {r.name: r.build for r in records}
    assert chosen["torchvision"] == vision.build_string and chosen["pytorch"] == vision.pytorch.build
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = ("import torchvision, torchvision.ops as ops; print(torchvision.__version__, torchvision.torch_version, "
             "ops.ones_sum(4), torchvision._C.c10_version()); "
             "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))")
    lines = run_checked([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env).splitlines()
    assert lines[0] == f"{vision.version} 2.13.0 4.0 2.13.0"
    loaded = {Path(p).name: Path(p) for p in lines[1:]}
    for name in ("libtorch.so", "libtorch_cpu.so", "libc10.so"):  # the channel's libtorch, from the prefix
        assert loaded[name].resolve().parent == (prefix / "lib").resolve(), (name, loaded.get(name))


@pytest.mark.slow
def test_a_second_run_reuses_the_package(stack) -> None:
    from torchforge.flavours.base import Plan
    from torchforge.pipeline import Action, plan_steps

    (step,) = plan_steps(Plan("conda-forge", (stack["planned"],)), stack["settings"])
    assert step.action is Action.REUSE


def test_the_stand_in_pip_is_a_pip_command_of_its_prefix(tmp_path: Path) -> None:
    """Like the real package, the stand-in `pip` puts a `pip` command in bin/ that runs the prefix's python
    (the feedstocks' tests run `pip list | grep torchvision`): it sees what is installed in that prefix."""
    from torchforge import standin

    standin.make_stub_channel(tmp_path / "stubs", [f"python {PY}.*", "pip"], conda_forge=True)
    prefix = tmp_path / "env"
    install_solved([tmp_path / "stubs"], [f"python {PY}.*", "pip"], None, prefix)
    site = next((prefix / "lib").glob("python*/site-packages"))
    (site / "marker_pkg-1.2.3.dist-info").mkdir()
    (site / "marker_pkg-1.2.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: marker-pkg\n"
                                                                  "Version: 1.2.3\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    listed = run_checked([str(prefix / "bin" / "pip"), "list", "--disable-pip-version-check"], env=env)
    assert "marker-pkg" in listed and "1.2.3" in listed


def test_build_with_torchvision_and_torchaudio_plans_them_after_pytorch_pinned_to_its_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", PY, "--with", "torchvision,torchaudio",
                 "--engine", "rattler-build", "--dry-run", "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().err.split())
    (pytorch,) = flavour_commands_with_inputs(conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,)), None)
    for name in ("torchvision", "torchaudio"):
        recipe = conda_forge_stack.plan(name, pytorch_package(pytorch))
        assert f"build {recipe.stem} (rattler-build)" in printed
        # pinned to the pytorch file the same plan builds
        assert f"pytorch-2.13.0-{recipe.pytorch.build}" in printed
    assert printed.index("build libtorch-2.13.0") < printed.index("build torchvision-0.28.0")


@pytest.mark.parametrize(("arguments", "message"), [
    (["--pytorch", "2.13.0", "--with", "torchtext"], "--with names 'torchtext', which torchforge does not build"),
    (["--pytorch", "2.5.1", "--with", "torchvision,torchtext"], "--with names 'torchtext', which torchforge does not build"),
])
def test_build_with_what_it_cannot_build_is_a_usage_error(arguments: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--cuda", "cpu", "--py", PY, *arguments, "--dry-run", "--out", str(tmp_path / "out")]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.conda"))


def test_matrix_with_companions_names_every_planned_file_with_the_pinned_pytorch(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command: every package file of the plan, each companion pinned to the pytorch file it pairs."""
    import json

    assert main(["matrix", "--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", "3.12",
                 "--with", "torchvision,torchaudio", "--json"]) == 0
    entries = {entry["id"]: entry for entry in json.loads(capsys.readouterr().out)}
    pytorch = next(p for e in entries.values() for p in e["packages"] if p.startswith("pytorch-2.13.0-cuda130_"))
    vision, audio = entries["torchvision-0.28.0-cuda130-sm90-py312-linux_64"], entries["torchaudio-2.11.0-cuda130-sm90-py312-linux_64"]
    for entry, name in ((vision, "torchvision-0.28.0-cuda130_py312_"), (audio, "torchaudio-2.11.0-cuda130_py312")):
        assert entry["pytorch"] == pytorch.removeprefix("pytorch-") and entry["arch_list"] == "9.0"
        # the feedstock's build number and the Python, as the pytorch rows give theirs (they were "-" and [])
        assert entry["pythons"] == ["3.12"] and entry["build_number"] == int(entry["packages"][0].rsplit("_", 1)[1])
        (package,) = entry["packages"]
        assert package.startswith(name)


def test_every_pythons_companion_has_its_own_recipe_folder_and_log(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """One pytorch recipe for two Pythons gives two torchvision and two torchaudio builds: each its own log, recipe
    folder and staging folder (they shared one, so the second build overwrote the first's log and recipe)."""
    import re

    out = tmp_path / "out"
    assert main(["build", "--dry-run", "--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py",
                 "3.12,3.13", "--with", "torchvision,torchaudio", "--out", str(out)]) == 0
    said = capsys.readouterr().err
    logs = re.findall(r"^build (torch(?:vision|audio)-\S+) \(rattler-build\); log: (\S+)$", said, re.MULTILINE)
    recipes = re.findall(r"--recipe (\S*/torch(?:vision|audio)-\S+)", said)
    assert len(logs) == 4 and len({log for _, log in logs}) == 4, logs
    assert len(recipes) == 4 and len(set(recipes)) == 4, recipes
    for package, log in logs:  # each log names the Python its package is built for
        python = re.search(r"_py(31[23])", package).group(1)
        assert f"-py{python}-" in log, (package, log)


def test_render_with_torchvision_writes_its_folder_beside_libtorchs(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12", "--with", "torchvision",
                 "--format", "rattler-build", "--out", str(tmp_path)]) == 0
    recipe = (tmp_path / "torchvision-0.28.0-cpu-py312-linux_64" / "recipe.yaml").read_text()
    assert "- pytorch ==2.13.0 cpu_" in recipe and (tmp_path / "libtorch-2.13.0-cpu-linux_64").is_dir()


@pytest.mark.parametrize("command", ["matrix", "render"])
def test_matrix_and_render_refuse_with_where_the_official_flavour_has_no_facts(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The official flavour plans --with for 2.1-2.5 (tests/test_official_stack.py); an older release is refused."""
    extra = ["--out", str(tmp_path / "r")] if command == "render" else []
    assert main([command, "--pytorch", "2.0.1", "--cuda", "11.8", "--py", "3.11", "--with", "torchvision", *extra]) == 4
    assert "--with has no facts for PyTorch 2.0.1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_conda_build_builds_the_meta_yaml_against_the_same_pytorch_and_it_runs(stack, tmp_path: Path) -> None:
    """The same torchvision recipe in conda-build's format (meta.yaml), built by the vendored conda-build through
    the conda-build engine against the channel's pytorch, installed and run as the rattler-build one is."""
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from torchforge.engines import BuildJob
    from torchforge.engines.conda_build import CondaBuildEngine
    from torchforge.localchannel import index
    from torchforge.proc import Runner

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    vision: conda_forge_stack.CompanionRecipe = stack["vision"]
    source = Path(shutil.copytree(VISION, tmp_path / "vision"))
    recipe_dir = tmp_path / "recipes" / vision.id
    recipe_dir.mkdir(parents=True)
    files = conda_forge_stack.recipe_files(vision, "conda-build", str(source))
    for name, text in files.items():
        (recipe_dir / name).write_text(text)
    stubs = stack["stubs"]  # the stand-ins rattler-build's render asked for: the same names and pins
    job = BuildJob(recipe_dir=recipe_dir, staging_dir=tmp_path / "out", channels=(stack["out"].as_uri(), stubs.as_uri()),
                   python=PY, env=tool.env(tmp_path / "conda"), test=False)
    result = Runner().run(CondaBuildEngine().command(job), check=False, log_file=tmp_path / "build.log", timeout=1800)
    assert result.returncode == 0, result.output[-6000:]
    (package,) = sorted((tmp_path / "out" / "linux-64").glob("torchvision-*"))
    assert package.name.startswith(vision.stem)
    index(tmp_path / "out")
    prefix = tmp_path / "env"
    records = install_solved([tmp_path / "out", stack["out"], stubs], ["torchvision"], None, prefix)
    assert {r.name: r.build for r in records}["pytorch"] == vision.pytorch.build
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = "import torchvision, torchvision.ops as ops; print(torchvision.__version__, ops.ones_sum(5))"
    assert run_checked([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env) == f"{vision.version} 5.0\n"


def test_doctor_with_a_cuda_companion_names_it_and_says_the_arch_check_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.test_machine_checks_every_flavour import air_gapped
    site = air_gapped(tmp_path)  # conda-forge's channel is a local one here: the checks need no network
    main(["doctor", "--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", "3.12",
          "--with", "torchvision", "--json", "--config", str(site)])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["--with"]["detail"].startswith("torchvision-0.28.0-cuda130_py312_")
    assert "pytorch 2.13.0-cuda130_" in checks["--with"]["detail"]
    assert checks["arch check"]["status"] == "ok" and "no cuobjdump needed" in checks["arch check"]["detail"]
    assert main(["doctor", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12", "--with", "torchvision",
                 "--json", "--config", str(site)]) == 0
    assert "arch check" not in {c["name"] for c in json.loads(capsys.readouterr().out)["checks"]}


def _connections_of(pip_line: str, project: Path, home: Path) -> int:
    """How many connections a build script's pip line, run as a dry run on `project` with this venv's python as
    ${PYTHON}, opens to a proxy on localhost (a listener that accepts and closes): pip's check for a newer pip
    goes there. No pip configuration or self-check state of this machine's is read."""
    import socket
    import subprocess
    import sys
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    seen: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            seen.append(1)
            connection.close()

    thread = threading.Thread(target=accept)
    thread.start()
    proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHON": sys.executable, "PIP_CONFIG_FILE": os.devnull,
           "PIP_CACHE_DIR": str(home / "pip-cache"), "PIP_RETRIES": "0", "PIP_TIMEOUT": "5",
           "https_proxy": proxy, "http_proxy": proxy}
    try:
        done = subprocess.run(["bash", "-c", f"{pip_line} --dry-run"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert done.returncode == 0 and "Would install probe-1.0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    return len(seen)


def _rendered_build_script(package: str, tmp_path: Path) -> str:
    """The conda-forge flavour's build.sh for 2.13.0 cpu: pytorch's as `torchforge render` writes it."""
    (pytorch,) = flavour_commands_with_inputs(conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,)), None)
    if package != "pytorch":
        return conda_forge_stack.build_script(conda_forge_stack.plan(package, pytorch_package(pytorch)))  # type: ignore[arg-type]
    assert main(["render", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", PY, "--out", str(tmp_path / "recipes")]) == 0
    return (tmp_path / "recipes" / pytorch.id / "build.sh").read_text(encoding="utf-8")


@pytest.mark.parametrize("package", ["pytorch", "torchvision", "torchaudio"])
def test_the_build_scripts_pip_asks_no_index(package: str, tmp_path: Path) -> None:
    """The feedstocks' build scripts run `pip install . --no-deps --no-build-isolation`, which asks PyPI for a newer
    pip (issue 40 item 22: the suite's torchvision build reached the network there). The rendered build script's
    pip line, run by the real pip on a real project, connects nowhere; the feedstock's line does (known-bad)."""
    (pip_line,) = [line.strip() for line in _rendered_build_script(package, tmp_path).splitlines()
                   if " -m pip install " in line]
    project = tmp_path / "probe"
    project.mkdir()
    # built with hatchling, a test requirement of this venv (--no-build-isolation: the backend is the venv's)
    (project / "pyproject.toml").write_text('[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
                                            '[project]\nname = "probe"\nversion = "1.0"\n'
                                            '[tool.hatch.build.targets.wheel]\nbypass-selection = true\n')
    feedstocks = pip_line.replace(" --no-index", "")
    assert feedstocks != pip_line
    assert _connections_of(feedstocks, project, tmp_path / "home-feedstock") > 0
    assert _connections_of(pip_line, project, tmp_path / "home") == 0
