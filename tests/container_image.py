"""Local build images for a real `torchforge build --container`, made without any registry, run with podman.

No registry is reachable here, so the images are made from Debian packages and the vendored conda wheels:

- `BASE`: Debian bookworm (minbase) from debootstrap with gcc/g++ 12, make, Python 3.11, patchelf, file,
  imported with `podman import`;
- `CPU`: BASE plus conda 26.7.1 + conda-build 26.7.1 (../shared/vendor, the pins of .venv-conda in
  tests/tool_venvs.py) in /opt/conda, `conda build` on PATH: what images.toml calls `conda_build = true`;
- `CUDA`: CPU plus this machine's CUDA toolkit (/usr/local/cuda, nvcc 13.0) copied in, as the official builder
  images carry theirs under /usr/local/cuda-X.Y.

Each image carries a label with the digest of its inputs; `ensure()` rebuilds only an image whose inputs changed
(`make container-image`), so a rerun costs a few `podman image inspect` calls.

podman runs from a configuration of its own under .cache/container (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
`podman_env()`), never the machine's global files. What this machine needs, found by trying:
- runtime runc: crun 1.8.1 (Debian's default) stops with "cgroups in hybrid mode not supported" on this host's
  cgroup v1 + v2 hybrid mount;
- default_ulimits: podman's rootful defaults (nofile 1048576, nproc 4194304) are above this machine's hard
  limits and the process lacks CAP_SYS_RESOURCE, so the container's setrlimit fails ("error setting rlimit");
  nofile takes this process's own limit, nproc pid_max (higher values fail here; no more processes can exist);
- cgroup_manager cgroupfs and the file events logger: there is no systemd;
- the overlay storage driver works here (root, ext4); vfs works too but copies the whole image per container.
The default (bridge) network works; the builds need none (their channels are local folders).

Run `python -m tests.container_image` (or `make container-image`) to make them ahead of a test run.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from tests import tool_venvs

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".cache" / "container"
BASE = "localhost/torchforge-base:bookworm"
CPU = "localhost/torchforge-conda-builder:cpu"
CUDA_VERSION = "13.0"
CUDA = f"localhost/torchforge-conda-builder:cuda{CUDA_VERSION}"
CUDA_HOME = f"/usr/local/cuda-{CUDA_VERSION}"  # where the toolkit lives inside (images.toml's cuda_home)
HOST_CUDA = Path(CUDA_HOME)
LABEL = "org.torchforge.inputs"

SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# What conda-build and the fixtures' recipes need: compilers, make, Python 3.11 with venv (conda runs from a venv
# as in .venv-conda), patchelf and file (conda-build's post-processing), patch (source edits), libarchive13
# (python-libarchive-c, which conda-build imports, loads it). python3-dev, -setuptools and -pip: the stand-in
# `python` of tests/stubchannel.py made with bin_dir=/usr/bin links to /usr/bin/python3.11, which must build
# extensions and install with pip inside as it does on this machine (Debian 12's Python, the same version).
# cmake and ninja: the stand-in channel's cmake/ninja are markers, so the recipes run the machine's, as here.
PACKAGES = ("gcc", "g++", "make", "python3", "python3-venv", "python3-dev", "python3-setuptools", "python3-pip",
            "patchelf", "file", "patch", "libarchive13", "cmake", "ninja-build")
IMAGE_PYTHON = "3.11.2"  # bookworm's python3
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The conda inside: the same condarc the tests give the vendored conda (tests/condabuild.py), as the image's
# system-wide configuration. Offline: the builds' channels are mounted folders.
CONDARC = "channels: []\noffline: true\nregister_envs: false\nnotify_outdated_conda: false\nsolver: rattler\n"
# pip's `conda` script refuses to run ("Conda has not been initialized"); `python -m conda` runs (vendor README).
CONDA_SHIM = '#!/bin/sh\nexec /opt/conda/bin/python -m conda "$@"\n'
CPU_CONTAINERFILE = """FROM {base}
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/conda \\
 && /opt/conda/bin/pip install --quiet --no-index --find-links /tmp/wheels {requirements} \\
 && rm -rf /tmp/wheels /root/.cache
COPY condarc /etc/conda/condarc
COPY conda /usr/local/bin/conda
# conda-build writes its work folders and package cache under /opt/conda: any --user may build (as the
# official builder images make /opt/conda world-writable).
RUN ln -s /opt/conda/bin/conda-build /usr/local/bin/conda-build && chmod -R a+rwX /opt/conda
"""
CUDA_CONTAINERFILE = f"""FROM {CPU}
COPY . {CUDA_HOME}
RUN ln -s cuda-{CUDA_VERSION} /usr/local/cuda
"""


class Unavailable(Exception):
    """podman cannot run here; the message says why."""


def _conf_files() -> tuple[Path, Path]:
    HOME.mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], pid_max)
    containers = HOME / "containers.conf"
    storage = HOME / "storage.conf"
    _write_if_changed(containers, (
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'cgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n'))
    _write_if_changed(storage, (
        "[storage]\n"
        f'driver = "overlay"\ngraphroot = "{HOME / "storage"}"\nrunroot = "{HOME / "run"}"\n'))
    return containers, storage


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def podman_env() -> dict[str, str]:
    """The variables that point podman (and torchforge's `podman run`) at this configuration."""
    containers, storage = _conf_files()
    return {"CONTAINERS_CONF": str(containers), "CONTAINERS_STORAGE_CONF": str(storage)}


def _podman(*args: str, stdin: int | None = None, input_: bytes | None = None,
            timeout: float = 1800) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", *args], env={**os.environ, **podman_env()}, capture_output=True,
                          timeout=timeout, stdin=stdin, input=input_)


def check_podman() -> None:
    """Raises Unavailable unless podman is on PATH and can start a container here."""
    if shutil.which("podman") is None:
        raise Unavailable("podman is not on PATH (apt-get install podman runc; see docs/channels-and-images.md, 'Builds in containers')")
    if shutil.which("runc") is None:
        raise Unavailable("runc is not on PATH (apt-get install runc: crun cannot run on this host's cgroups)")
    if not tool_venvs.vendored_conda_present():
        raise Unavailable(f"the conda wheels the images install are missing from {tool_venvs.VENDOR}")
    if os.geteuid() != 0:
        # debootstrap needs root, and this configuration (storage in the checkout, runc, cgroupfs) is rootful
        # podman's; rootless podman was not tried here.
        raise Unavailable("the local images are made with debootstrap and run with rootful podman: run as root")
    info = _podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=120)
    if info.returncode != 0:
        raise Unavailable(f"`podman info` fails: {info.stderr.decode(errors='replace').strip()[-500:]}")


def _label(image: str) -> str | None:
    found = _podman("image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image, timeout=120)
    return found.stdout.decode().strip() if found.returncode == 0 else None


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _check(result: subprocess.CompletedProcess[bytes], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}):\n" + (result.stdout + result.stderr).decode(errors="replace")[-4000:])


def _fresh(folder: Path) -> Path:
    """An empty scratch folder (what an interrupted earlier run left there is removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _base(log: list[str]) -> str:
    digest = _digest(SUITE, MIRROR, *PACKAGES, PATH)
    if _label(BASE) == digest:
        return digest
    if shutil.which("debootstrap") is None:
        raise Unavailable("debootstrap is not on PATH (apt-get install debootstrap)")
    rootfs = _fresh(HOME / "build" / "rootfs")
    _check(subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                           str(rootfs), MIRROR], capture_output=True, timeout=1800), "debootstrap")
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:  # closes its pipe
        imported = _podman("import", "--change", f"LABEL {LABEL}={digest}", "--change", f"ENV PATH={PATH}",
                           "-", BASE, stdin=tar.stdout.fileno() if tar.stdout else None)
    _check(imported, "podman import")
    if tar.returncode != 0:
        raise RuntimeError(f"tar of {rootfs} failed ({tar.returncode})")
    shutil.rmtree(rootfs)
    log.append(f"made {BASE}")
    return digest


def _cpu(base: str, log: list[str]) -> str:
    pins = tool_venvs.TOOLS["conda"]
    names = [Path(p).name if p.endswith(".whl") else p for p in pins]
    containerfile = CPU_CONTAINERFILE.format(base=BASE, requirements=" ".join(_requirement(p) for p in pins))
    digest = _digest(base, containerfile, CONDARC, CONDA_SHIM, IMAGE_PYTHON, *names)
    if _label(CPU) == digest:
        return digest
    context = _fresh(HOME / "build" / "cpu")
    # Resolved here for the image's Python (Debian's 3.11.2: soupsieve's newest wants 3.11.5), wheels only: the
    # image has no Python headers and reaches no index. conda's pycosat is published as an sdist only: its wheel
    # is built here (this machine is Debian 12 with a Python 3.11 too, so it runs inside).
    wheels = context / "wheels"
    _check(subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
                           "pycosat"], capture_output=True, timeout=1800), "pip wheel pycosat")
    _check(subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                           "--python-version", IMAGE_PYTHON, "--find-links", str(wheels), "--dest", str(wheels),
                           *pins], capture_output=True, timeout=1800), "pip download")
    (context / "condarc").write_text(CONDARC)
    (context / "conda").write_text(CONDA_SHIM)
    (context / "conda").chmod(0o755)
    (context / "Containerfile").write_text(containerfile)
    _check(_podman("build", "--label", f"{LABEL}={digest}", "--tag", CPU, str(context)), "podman build (cpu)")
    shutil.rmtree(context)
    log.append(f"made {CPU}")
    return digest


def _requirement(pin: str) -> str:
    """A pin as pip names it inside the image: a vendored wheel by its project name and version."""
    if not pin.endswith(".whl"):
        return pin
    name, version = Path(pin).name.split("-")[:2]
    return f"{name}=={version}"


def _cuda(cpu: str, log: list[str]) -> str:
    versions = sorted(p.name for p in (HOST_CUDA / "dist-info").glob("*.dist-info"))
    digest = _digest(cpu, CUDA_CONTAINERFILE, *versions)
    if _label(CUDA) == digest:
        return digest
    context = _fresh(HOME / "build" / "cuda")
    (context / "Containerfile").write_text(CUDA_CONTAINERFILE)
    # The toolkit folder itself is the build context (315 MB; its symlinks are relative).
    _check(_podman("build", "--label", f"{LABEL}={digest}", "--tag", CUDA, "--file", str(context / "Containerfile"),
                   str(HOST_CUDA)), "podman build (cuda)")
    shutil.rmtree(context)
    log.append(f"made {CUDA}")
    return digest


def cuda_available() -> bool:
    return (HOST_CUDA / "bin" / "nvcc").is_file() and (HOST_CUDA / "dist-info").is_dir()


def ensure(cuda: bool = True) -> list[str]:
    """Makes the images whose inputs changed (all of them the first time); returns what was made."""
    check_podman()
    made: list[str] = []
    with FileLock(str(HOME / ".images.lock"), timeout=3600):
        cpu = _cpu(_base(made), made)
        if cuda and cuda_available():
            _cuda(cpu, made)
        if made:  # the images these replaced (this storage is ours alone)
            _podman("image", "prune", "--force", timeout=600)
    return made


def site_images(cuda: bool) -> str:
    """The [images] of a torchforge.toml naming these local images."""
    text = (f'[images.cpu]\nimage = "{CPU}"\ncuda_home = ""\nprovides = "Debian 12 gcc 12, conda 26.7.1 + '
            f'conda-build 26.7.1 (tests/container_image.py)"\nconda_build = true\n')
    if cuda:
        text += (f'[images."{CUDA_VERSION}"]\nimage = "{CUDA}"\ncuda_home = "{CUDA_HOME}"\nprovides = "this '
                 f'machine\'s CUDA {CUDA_VERSION} toolkit (no cuDNN, no NCCL) over the cpu image"\n'
                 f'conda_build = true\n')
    return text


if __name__ == "__main__":
    try:
        for line in ensure(cuda="--no-cuda" not in sys.argv) or ["images up to date"]:
            print(line)
        print(json.dumps(podman_env()))
    except Unavailable as exc:
        print(f"podman cannot run here: {exc}", file=sys.stderr)
        sys.exit(1)
