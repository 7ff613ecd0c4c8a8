"""`torchforge repack --pytorch X.Y.Z --cuda X.Y --py X.Y --with torchvision,torchaudio`: the wheels of a
stack, fetched with pip.

Two pip runs through the one runner: a resolve (`pip install --dry-run --report`, metadata only) that names
every wheel of the stack for Linux x86-64 and the Python asked for, with the index's sha256; then `pip download
--require-hashes --no-deps` of exactly those files into the wheel folder, so pip checks each hash and keeps
what is already there. torchforge hashes the files again before using them. Only wheels `repack` turns into
packages are downloaded (torch's pure-Python requirements come from the user's channels).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from torchforge import fileops
from torchforge.binaries.catalog import catalog
from torchforge.binaries.plan import TOOLKIT
from torchforge.errors import UsageError
from torchforge.proc import Command, Runner
from torchforge.repack import sha256_of

# pip's platform tags for "Linux x86-64 with glibc 2.28" (the official wheels' manylinux_2_28 and the older
# tags the NVIDIA component wheels carry): pip does not widen an explicit --platform to older tags itself.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
COMPANIONS = ("torchvision", "torchaudio", "triton")


@dataclass(frozen=True)
class Request:
    pytorch: str
    python: str
    cuda: str | None  # "12.8"; "cpu" for the CPU build; None: whatever the index serves by default
    companions: tuple[str, ...]
    index_url: str | None


@dataclass(frozen=True)
class Planned:
    filename: str
    url: str
    sha256: str
    project: str


def parse_with(text: str) -> tuple[str, ...]:
    names = tuple(canonicalize_name(n) for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in COMPANIONS]
    if unknown:
        raise UsageError(f"--with {text}: {', '.join(unknown)} is not part of a PyTorch stack",
                         f"--with takes a comma-separated list of {', '.join(COMPANIONS)}")
    return names


def requirements(request: Request) -> list[str]:
    """torch==X.Y.Z and the companions: torchaudio is released with the torch of the same version (torchaudio
    2.10.0 requires torch==2.10.0); torchvision's own `torch==` requirement picks its version."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", request.pytorch):
        raise UsageError(f"--pytorch {request.pytorch} is not a release version", "give X.Y.Z, e.g. --pytorch 2.10.0")
    reqs = [f"torch=={request.pytorch}"]
    for name in request.companions:
        reqs.append(f"torchaudio=={request.pytorch}" if name == "torchaudio" else name)
    return reqs


def _pip(*args: str) -> tuple[str, ...]:
    import sys

    return (sys.executable, "-m", "pip", *args)


def _target_args(request: Request) -> list[str]:
    args = ["--python-version", request.python, "--implementation", "cp", "--only-binary=:all:"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    if request.index_url:
        args += ["--index-url", request.index_url]
    return args


def resolve(request: Request, work: Path, runner: Runner, on_line: Callable[[str], None] | None = None) -> list[Planned]:
    """The stack's wheels as pip resolves them (metadata only; no download of the large files)."""
    report = work / "report.json"
    runner.run(Command(argv=_pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                                 "--target", str(work / "unused"), *_target_args(request), *requirements(request))),
               on_line=on_line)
    if runner.dry_run:
        return []
    planned = []
    for item in json.loads(report.read_text("utf-8"))["install"]:
        project = canonicalize_name(item["metadata"]["name"])
        if catalog().project(project) is None and catalog().component(project) is None and project != TOOLKIT:
            continue  # pure Python: from the user's channels
        info = item["download_info"]
        hashes = info.get("archive_info", {}).get("hashes", {})
        sha = hashes.get("sha256") or info.get("archive_info", {}).get("hash", "").removeprefix("sha256=")
        if not sha:
            raise UsageError(f"the index gives no sha256 for {info['url']}", "use an index that publishes hashes")
        planned.append(Planned(info["url"].rsplit("/", 1)[-1].split("#")[0], info["url"], sha, project))
    return planned


def download(request: Request, wheel_dir: Path, runner: Runner,
             on_line: Callable[[str], None] | None = None) -> list[Path]:
    """Fetch the stack into `wheel_dir` (kept between runs); returns the wheel files, hashes checked."""
    requirements(request)  # a malformed request is refused before anything is created
    fileops.ensure_dir(wheel_dir, "wheel folder")
    with fileops.scratch(wheel_dir, "resolve") as work:
        planned = resolve(request, work, runner, on_line)
        lines = [f"{p.url.split('#')[0]} --hash=sha256:{p.sha256}" for p in planned]
        pinned = work / "requirements.txt"
        pinned.write_text("".join(f"{line}\n" for line in lines))
        runner.run(Command(argv=_pip("download", "--require-hashes", "--no-deps", "--dest", str(wheel_dir),
                                     "-r", str(pinned), *_target_args(request))),
                   on_line=on_line)
    if runner.dry_run:
        return []
    paths = []
    for item in planned:
        path = wheel_dir / item.filename.replace("%2B", "+")
        if not path.is_file() or sha256_of(path) != item.sha256:
            raise UsageError(f"{path.name} is missing or does not match the index's sha256",
                             f"remove {path} and run the command again")
        paths.append(path)
    return paths
