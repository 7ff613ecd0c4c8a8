"""The container checks of a preflight: the container tool answers, each build's image (or the image torchforge
derives from it) can build it, with the cuDNN its packages bundle; where this machine lacks a CUDA's nvcc or
host compiler, the image that has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchforge.config import SiteConfig
from torchforge.containers import (TOOL_VARIABLE, ContainerSettings, accel_name, check_cudnn, describe, image_for,
                                   no_tool, reference, require_image)
from torchforge.errors import ForgeError
from torchforge.proc import Runner
from torchforge.flavours.base import MachineNeeds
from torchforge.preflight.report import Context, Level, PreflightReport, probe_machine


def check_images(ctx: Context, container: ContainerSettings, targets: Sequence[tuple[str, str]]) -> None:
    """The container tool answers, and each build's image, given as (accel, bundled cuDNN or ""), can build it."""
    if not container.tool:
        missing = no_tool()  # none on PATH, or TORCHFORGE_CONTAINER_TOOL names no docker or podman
        ctx.add("container tool", Level.FAIL, missing.message, missing.hint)
        answers = False
    else:
        answers = _container_engine_answers(ctx, container.tool)
    for accel in dict.fromkeys(accel for accel, _ in targets):
        name = f"image ({accel_name(accel)})"
        try:
            image = require_image(accel, container.images)
        except ForgeError as exc:
            ctx.add(name, Level.FAIL, exc.message, exc.hint)
            continue
        cudnns = [c for c in dict.fromkeys(c for a, c in targets if a == accel) if c] or [""]
        try:
            warnings = [w for w in (check_cudnn(accel, image, c) for c in cudnns) if w]
        except ForgeError as exc:
            ctx.add(name, Level.FAIL, exc.message, exc.hint)
            continue
        detail = f"{'; '.join(describe(accel, image, c) for c in cudnns)} via {container.tool}: {image.contents}"
        fixes = [f"give the image's cuDNN in torchforge.toml [images.\"{accel}\"] cudnn = \"X.Y.Z.B\" (checked before "
                 "any build), or name a base there so torchforge adds the variant's cuDNN"] if warnings else []
        # Only where the engine answers: is each image (or derived tag) already here, or fetched at the first build?
        missing = [r for r in dict.fromkeys(reference(accel, image, c) for c in cudnns)
                   if answers and not _has_image(ctx, container.tool, r)]
        if missing:
            pulled = image.base or image.image
            what = f"the first build derives it from {pulled}" if image.derived else "the first build pulls it"
            warnings.append(f"{', '.join(missing)} is not on this machine: {what}")
            fixes.append(f"make sure its registry is reachable, or `{Path(container.tool).name} pull {pulled}` first")
        if warnings:
            ctx.add(name, Level.WARN, f"{detail}; {'; '.join(warnings)}", "; ".join(fixes))
        else:
            ctx.add(name, Level.OK, detail)


def container_report(container: ContainerSettings, targets: Sequence[tuple[str, str]], runner: Runner) -> PreflightReport:
    """The container checks alone, for builds planned without the official flavour's variants (the conda-forge
    flavour's recipes): `targets` are their (accel, bundled cuDNN or "") pairs."""
    ctx = Context(runner, probe_machine(), MachineNeeds())
    check_images(ctx, container, targets)
    return PreflightReport(tuple(ctx.checks), 0, "conda-build")


def _container_engine_answers(ctx: Context, tool: str) -> bool:
    """`docker info` / `podman info`: the client alone is not enough (a docker client without a daemon)."""
    name = Path(tool).name
    answered = ctx.run(tool, "info")
    if answered is not None and answered[0] == 0:
        ctx.add("container tool", Level.OK, f"{tool} (`{name} info` answers)")
        return True
    why = (answered[1].strip().splitlines() or ["no output"])[-1] if answered else "it does not start"
    other = "podman" if name == "docker" else "docker"
    ctx.add("container tool", Level.FAIL, f"{tool} is on PATH but `{name} info` fails: {why}",
            f"start {name}'s service, or set {TOOL_VARIABLE}={other} to use {other} instead")
    return False


def _has_image(ctx: Context, tool: str, reference: str) -> bool:
    found = ctx.run(tool, "image", "inspect", "--format", "{{.Id}}", reference)
    return found is not None and found[0] == 0


def suggest_images(ctx: Context, site: SiteConfig | None) -> None:
    """Where this machine lacks a variant's nvcc or host compiler, name the image that has them."""
    images = site.images if site else {}
    for cuda in ctx.cuda_versions:
        failed = [c.name for c in ctx.checks if c.status is Level.FAIL
                  and c.name in (f"nvcc (CUDA {cuda})", f"host compiler (CUDA {cuda})")]
        if not failed:
            continue
        image = image_for(cuda, images)
        if image is None:
            ctx.add(f"image (CUDA {cuda})", Level.WARN, f"no build image with a source is known for CUDA {cuda}",
                    f"install the toolkit here, or name an image in torchforge.toml [images.\"{cuda}\"]")
        else:
            ctx.add(f"image (CUDA {cuda})", Level.OK,
                    f"{describe(cuda, image)} provides what {' and '.join(failed)} lack: {image.contents}",
                    "torchforge build --container (docker or podman)" + (
                        "" if image.derived or image.conda_build else
                        f"; this image has no conda-build: name it as base in torchforge.toml [images.\"{cuda}\"]"))
