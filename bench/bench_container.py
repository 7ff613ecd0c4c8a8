"""`torchforge build --container` with podman against the same build on this machine, in one run.

The torch_like fixture (cpu, PyTorch's layout, not PyTorch) built by conda-build twice per round: inside the
local image `localhost/torchforge-conda-builder:cpu` (tests/container_image.py) and directly here with the
vendored conda-build (tests/condabuild.py), each a `torchforge build` process with fresh stand-ins and output.
Also timed: `make container-image` when the images are current (the cost each CI run pays once they exist).
Where podman cannot run here, one row says why.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench import Row

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 2


def _build(root: Path, in_container: bool) -> float:
    from tests import container_image
    from tests.condabuild import find_conda_tool
    from tests.test_conda_build import CPU_ARGS
    from tests.test_container_build import prepare
    from tests.test_upload_helpers import cli
    from torchforge.containers import TOOL_VARIABLE

    tool = find_conda_tool()
    assert tool is not None
    forge, bundled = prepare(tool, root, CPU_ARGS, in_container=in_container)
    extra = ["--container"] if in_container else []
    env = {**container_image.podman_env(), TOOL_VARIABLE: "podman"} if in_container else tool.env(root / "conda")
    start = time.perf_counter()
    result = cli("build", *CPU_ARGS, *extra, "--config", str(forge.site), "--out", str(forge.out),
                 env={**env, **bundled}, timeout=1800)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return seconds


def run(quick: bool = False) -> list[Row]:
    rounds = 1 if quick else ROUNDS
    sys.path.insert(0, str(ROOT))  # the helpers live in the test package
    from tests import container_image

    try:
        container_image.ensure(cuda=False)
    except container_image.Unavailable as exc:
        return [Row("container", "torch_like cpu in podman / on this machine", "-", skipped=str(exc))]
    start = time.perf_counter()
    container_image.ensure(cuda=container_image.cuda_available())
    current = time.perf_counter() - start
    inside: list[float] = []
    here: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-container-") as tmp_name:
        for i in range(rounds):
            here.append(_build(Path(tmp_name) / f"here-{i}", in_container=False))
            inside.append(_build(Path(tmp_name) / f"inside-{i}", in_container=True))
    return [
        Row("container", "torch_like cpu (conda-build): in podman / on this machine", f"{min(inside) / min(here):.3f}",
            f"best of {rounds}: {min(inside):.1f} s in localhost/torchforge-conda-builder:cpu, {min(here):.1f} s here"),
        Row("container", "make container-image with current images", f"{current:.2f} s", "label checks only"),
    ]
