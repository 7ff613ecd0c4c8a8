"""A real `torchforge build --container --engine conda-build` with podman: the torch_like fixture (cpu, and CUDA
13.0 with magma_like) built by conda-build inside local build images (tests/container_image.py: Debian 12 with
conda 26.7.1 + conda-build 26.7.1, and this machine's CUDA 13.0 toolkit copied in), named in a site
torchforge.toml [images]; then, on this machine, installed from the output channel by a real `conda create
--offline` and imported with nothing on LD_LIBRARY_PATH, and audited, as tests/test_conda_build.py does for the
same builds without a container.

Skipped, with the reason, where podman cannot run (tests/container_image.check_podman).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests import container_image
from tests.condabuild import CondaTool
from tests.stubchannel import make_stub_channel, recipe_requirements
from tests.test_conda_build import (CPU_ARGS, CUDA_ARGS, PYTORCH, Forge, Planned, _bundle_stand_ins, _bundled_cudnn_loads,
                                    _create, _imports_and_runs, _log, _plan, _planned, _published, conda_tool, needs_nvcc)
from tests.test_upload_helpers import cli
from torchforge.containers import TOOL_VARIABLE
from torchforge.flavours.official.render import recipe_folders
from torchforge.templates import RecipeFormat

__all__ = ["conda_tool"]  # the fixture, imported to be used here

# The image's conda-build: a path that exists inside the image only, so a log naming it was written there.
CONDA_BUILD_INSIDE = "/opt/conda/lib/python3.11/site-packages/conda_build/"
# The runner's log line: `$ .../podman run --rm ... IMAGE conda build RECIPE ...`.
PODMAN_BUILD_LINE = re.compile(r"^\$ \S*podman run --rm .* localhost/torchforge-conda-builder:\S+ conda build ", re.MULTILINE)


@pytest.fixture(scope="session")
def podman_env() -> dict[str, str]:
    """podman's configuration, with the images made (or found up to date); skips where podman cannot run."""
    try:
        container_image.ensure(cuda=container_image.cuda_available())
    except container_image.Unavailable as exc:
        pytest.skip(f"podman cannot run here: {exc}")
    return {**container_image.podman_env(), TOOL_VARIABLE: "podman"}


def prepare(tool: CondaTool, root: Path, args: list[str], *, in_container: bool) -> tuple[Forge, dict[str, str]]:
    """Stand-ins for the requirements of `torchforge build ARGS`, its site torchforge.toml and the planned
    packages, without building: (the forge, the variables naming the bundled-library stand-ins).

    `in_container`: the stand-ins' python and patchelf link to /usr/bin, where the image holds the same Debian
    Python 3.11 as this machine, so the package built inside installs and imports here too; the bundled-library
    stand-ins lie beside the stand-in channel, which the build mounts (read-only, at the same path); the site
    names the local images. Otherwise as tests/test_conda_build.py builds on this machine."""
    render_plan = _plan(args)
    built_here = {"magma-"} | {c.name + " " for c in render_plan.companions}
    specs = {"pip"}
    folders = recipe_folders(render_plan, RecipeFormat.CONDA_BUILD).values()
    for files in folders:
        specs.update(s for s in recipe_requirements(str(files["meta.yaml"])) if not (s + " ").startswith(tuple(built_here)))
    stubs = root / "stubs"
    make_stub_channel(stubs, sorted(specs), bin_dir=Path("/usr/bin") if in_container else None)
    stand_ins = stubs / "bundled" / "lib" if in_container else root / "bundled" / "lib"
    bundled = {name: value for files in folders
               for name, value in _bundle_stand_ins(str(files.get("build.sh", "")), stand_ins).items()}
    site = root / "torchforge.toml"
    images = container_image.site_images(cuda=container_image.cuda_available()) if in_container else ""
    site.write_text(f'[channels]\nreplace = ["file://{stubs}"]\n' + images)
    planned = [Planned(c.id, c.filename_stem, c.subdir, None) for c in render_plan.companions]
    return Forge(root / "out", stubs, tool, site, {p.folder: p for p in [*planned, *_planned(render_plan, None)]}), bundled


def _forge_in_container(tool: CondaTool, podman: dict[str, str], root: Path, args: list[str]) -> Forge:
    """`torchforge build ARGS --container` in a new process, against stand-ins for its requirements."""
    forge, bundled = prepare(tool, root, args, in_container=True)
    # conda's own variables (tool.env) go to the `conda create` below, not into the image: wrap passes the
    # engine command's variables only. With its preflight, which contacts podman and finds the images (the
    # fixtures' args skip it elsewhere).
    result = cli("build", *(a for a in args if a != "--skip-preflight"), "--container", "--config", str(forge.site),
                 "--out", str(forge.out), env={**podman, **bundled}, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "using conda-build inside the build image (--container)" in result.stderr
    assert "(`podman info` answers)" in result.stderr
    assert not list(forge.out.glob(".torchforge-tmp-*"))
    return forge


def engine_line(log: str) -> str:
    """The runner's first command line of a build log (`$ ...`): the lines before it are torchforge's own notes
    (the compile-job count sized to the machine's memory)."""
    return next((line for line in log.splitlines() if line.startswith("$ ")), log.splitlines()[0] if log else "")


def _ran_inside(forge: Forge, package: str, image: str) -> None:
    """The build's log: the runner's `podman run ... IMAGE conda build` line, and conda-build's own messages
    from the image's installation (no such folder exists on this machine)."""
    log = _log(forge, package)
    first = engine_line(log)
    assert first.startswith("$ ") and " run --rm " in first and f" {image} conda build " in first
    assert CONDA_BUILD_INSIDE in log and not Path(CONDA_BUILD_INSIDE).exists()


def _owned_by_caller(forge: Forge) -> None:
    """Everything the container wrote into the output channel belongs to the user who ran torchforge."""
    foreign = [p for p in forge.out.rglob("*") if p.lstat().st_uid != os.getuid() or p.lstat().st_gid != os.getgid()]
    assert not foreign, foreign[:5]


@pytest.mark.slow
def test_cpu_torch_like_built_in_the_image_installs_imports_and_audits_here(
        conda_tool: CondaTool, podman_env: dict[str, str], tmp_path: Path) -> None:
    forge = _forge_in_container(conda_tool, podman_env, tmp_path / "forge", CPU_ARGS)
    torch_id = f"pytorch-{PYTORCH}-cpu-py311-linux_64"
    _ran_inside(forge, torch_id, container_image.CPU)
    _published(forge, PODMAN_BUILD_LINE)  # repodata, the RPATH audit of every package, conda-build's own test phase
    _owned_by_caller(forge)
    _imports_and_runs(forge, tmp_path / "torch-env", forge.planned[torch_id].stem)


@needs_nvcc
@pytest.mark.slow
def test_cuda_magma_like_then_torch_like_built_in_the_cuda_image_install_and_import_here(
        conda_tool: CondaTool, podman_env: dict[str, str], tmp_path: Path) -> None:
    if not container_image.cuda_available():
        pytest.skip(f"no CUDA toolkit in {container_image.HOST_CUDA} to copy into the image")
    forge = _forge_in_container(conda_tool, podman_env, tmp_path / "forge", CUDA_ARGS)
    torch_id = f"pytorch-{PYTORCH}-cu130-py311-linux_64"
    (magma_id,) = (i for i in forge.planned if i.startswith("magma-cuda130-"))
    for package in (magma_id, torch_id):
        _ran_inside(forge, package, container_image.CUDA)
    # The image's toolkit: CUDA_HOME is the image's cuda_home, never this machine's value.
    assert f"CUDA_HOME={container_image.CUDA_HOME} " in engine_line(_log(forge, torch_id))
    _published(forge, PODMAN_BUILD_LINE)
    _owned_by_caller(forge)
    name, version, build = forge.planned[magma_id].stem.rsplit("-", 2)
    prefix = _create(forge, tmp_path / "magma-env", f"{name} =={version} {build}")
    assert (prefix / "lib" / "libmagma.a").is_file() and (prefix / "include" / "magma.h").is_file()
    prefix = _imports_and_runs(forge, tmp_path / "torch-env", forge.planned[torch_id].stem)
    # The cuDNN stand-in the recipe bundled inside the image (from the mounted folder).
    _bundled_cudnn_loads(prefix)


def test_doctor_finds_the_local_images_through_podman_and_warns_for_one_it_would_pull(
        podman_env: dict[str, str], tmp_path: Path) -> None:
    site = tmp_path / "torchforge.toml"
    site.write_text(container_image.site_images(cuda=False) +
                    '[images."12.4"]\nimage = "registry.example/builder:cuda12.4"\ncuda_home = "/usr/local/cuda-12.4"\n'
                    'provides = "CUDA 12.4"\nconda_build = true\n')
    result = cli("doctor", "--container", "--pytorch", "2.5.1", "--cuda", "12.4,cpu", "--py", "3.11", "--json",
                 "--config", str(site), "--out", str(tmp_path / "out"), env=podman_env)
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["container tool"]["status"] == "ok"
    assert checks["image (cpu)"]["status"] == "ok" and container_image.CPU in checks["image (cpu)"]["detail"]
    assert checks["image (CUDA 12.4)"]["status"] == "warn"
    assert "registry.example/builder:cuda12.4 is not on this machine" in checks["image (CUDA 12.4)"]["detail"]
    # the bundled cuDNN is the image's: not looked for on this machine
    assert not [name for name in checks if name.startswith("bundled ")]
