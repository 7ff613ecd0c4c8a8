"""A real `torchforge build --container` of the conda-forge flavour (the default for 2.6+) with podman: the
torch_split fixture's cpu recipe (libtorch, pytorch for Python 3.11, the metapackage from one engine run) built
by the conda-build inside the local Debian image of tests/container_image.py, named in a site torchforge.toml
[images]; then, on this machine, the planned packages audited, installed with a real solver next to the
stand-ins of conda-forge's requirements, imported and run, as tests/test_conda_forge_split.py does for the
builds made here.

Skipped, with the reason, where podman cannot run (tests/container_image.check_podman).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import container_image
from tests.test_conda_forge_flavour import stand_in_specs
from tests.test_conda_forge_split import PY, assert_planned_and_audited, copy_fixture, install_solved, run_checked
from tests.test_container_build import CONDA_BUILD_INSIDE, engine_line, podman_env
from tests.test_upload_helpers import cli
from torchforge import standin
from torchforge.flavours import Request, conda_forge
from torchforge.flavours.conda_forge import planning
from torchforge.sourcestate import Source

__all__ = ["podman_env"]  # the fixture, imported to be used here


@pytest.mark.slow
def test_the_conda_forge_flavours_cpu_recipe_built_in_the_image_installs_and_imports_here(
        podman_env: dict[str, str], tmp_path: Path) -> None:
    source = copy_fixture(tmp_path / "torch_split")
    planned = conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,))
    (recipe,) = planning.with_inputs((planned,), Request(source=str(source)))
    files = conda_forge.recipe_files(planned, Source("path", str(source), ""))
    stubs = tmp_path / "stubs"
    # The stand-in python links to /usr/bin/python3.11: the image holds the same Debian Python as this machine.
    standin.make_stub_channel(stubs, sorted(stand_in_specs(files, {o.name for o in planned.outputs})),
                              conda_forge=True, bin_dir=Path("/usr/bin"))
    site = tmp_path / "torchforge.toml"
    site.write_text(f'[channels]\nreplace = ["{stubs.as_uri()}"]\n' + container_image.site_images(cuda=False))
    out = tmp_path / "channel"
    # --no-test: conda-build's own test step, left out as in test_conda_forge_split's conda-build build (the empty
    # stand-in compilers export no -rpath); the pipeline's RPATH fix runs after the build and the import below
    result = cli("build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", PY, "--source", str(source), "--container",
                 "--no-test", "--config", str(site), "--out", str(out), env=podman_env, timeout=1800)
    log = out / "logs" / f"{recipe.id}.log"
    assert result.returncode == 0, result.stderr[-4000:] + (log.read_text()[-4000:] if log.is_file() else "")
    assert "using conda-build inside the build image (--container)" in result.stderr
    assert "(`podman info` answers)" in result.stderr  # preflight's container rows ran
    # one engine run inside the image made every output: the runner's `podman run ... IMAGE conda build` line and
    # conda-build's own messages from the image's installation (no such folder exists on this machine)
    text = log.read_text()
    first = engine_line(text)
    assert first.startswith("$ ") and " run --rm " in first and f" {container_image.CPU} conda build " in first
    assert f"--volume {source}:{source}:ro" in first  # the local source, mounted read-only at the same path
    assert CONDA_BUILD_INSIDE in text and not Path(CONDA_BUILD_INSIDE).exists()
    assert "torchforge: compile cache " in text  # the compile cache went into the image with the build
    packages = [out / "linux-64" / f"{p.stem}.conda" for p in recipe.planned_outputs()]
    assert all(p.is_file() for p in packages), sorted(p.name for p in (out / "linux-64").iterdir())
    assert_planned_and_audited(recipe, packages)
    assert not list(out.glob(".torchforge-tmp-*"))

    prefix = tmp_path / "env"
    install_solved([out, stubs], ["libtorch", "pytorch", recipe.outputs[-1].name], None, prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = "import torch; print(torch.__version__, torch.ones_sum(3), torch.cuda_built())"
    assert run_checked([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env) == "2.13.0 3.0 False\n"
