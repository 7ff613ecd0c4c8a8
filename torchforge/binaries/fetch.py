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
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packaging.utils import canonicalize_name

from torchforge import fileops
from torchforge.binaries.catalog import catalog
from torchforge.binaries.plan import TOOLKIT
from torchforge.flavours.base import STACK_PACKAGES
from torchforge.errors import ForgeError, PreflightError, RefusedError, ToolFailedError, UsageError
from torchforge.proc import Command, Runner
from torchforge.repack import sha256_of

# pip's platform tags for "Linux x86-64 with glibc 2.28" (the official wheels' manylinux_2_28 and the older
# tags the NVIDIA component wheels carry): pip does not widen an explicit --platform to older tags itself.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
COMPANIONS = (*STACK_PACKAGES, "triton")  # the wheels repack takes with torch
# pip's words when no file matches a requirement (pip 23 to 25).
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_FROM_VERSIONS = re.compile(r"Could not find a version that satisfies the requirement \S+ \(from versions: ([^)]*)\)")
# pip's words when an index does not answer (pip 23 to 26): a connection that fails (refused, no route, DNS,
# TLS; said on each retry) or an HTTP error on the index page. pip then goes on with "from versions: none".
_UNREACHABLE = re.compile(r"connection broken by '(?:.*?(\[Errno -?\d+\] [^\"')]*))?|Could not fetch URL ([^\n]*)"
                          r"|HTTP error (\d+ while getting [^\n]*)")
# pip's settings that say how to connect, never where from (a proxy, a CA bundle, retries): with a named
# --wheel-index pip runs --isolated, and these are passed on from the environment as its options.
_TRANSPORT_OPTIONS = {"PIP_CERT": "--cert", "PIP_CLIENT_CERT": "--client-cert", "PIP_PROXY": "--proxy",
                      "PIP_RETRIES": "--retries", "PIP_DEFAULT_TIMEOUT": "--timeout", "PIP_TIMEOUT": "--timeout",
                      "PIP_TRUSTED_HOST": "--trusted-host"}


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
    check_python(request.pytorch, request.python)
    reqs = [f"torch=={request.pytorch}"]
    for name in request.companions:
        reqs.append(f"torchaudio=={request.pytorch}" if name == "torchaudio" else name)
    return reqs


def check_python(pytorch: str, python: str) -> None:
    """`--py` before pip runs: X.Y, and for a release torchforge's tables know, one it published wheels for
    (pytorch.toml's Linux range and its experimental Pythons). A release the tables do not know is left to pip."""
    from torchforge.data import load
    from torchforge.versions import minor, parse

    if not re.fullmatch(r"\d+\.\d+", python):
        raise UsageError(f"--py {python} is not a Python X.Y", "give the Python the stack is for, e.g. --py 3.12")
    release = load().pytorch.releases.get(minor(pytorch))
    if release is None:
        return
    low, high = (release.patch[pytorch].python if pytorch in release.patch and release.patch[pytorch].python
                 else release.python)
    if not parse(low) <= parse(python) <= parse(high) and python not in release.python_experimental:
        raise RefusedError(f"PyTorch {pytorch} has wheels for Python {low} to {high}, not {python} "
                           "(torchforge/data/pytorch.toml)", f"give --py {high} or another Python in that range")


def _pip_failure(output: str, request: Request, reqs: list[str]) -> ForgeError:
    """pip's resolve failed: what was not found, where, and what would work; pip's own words only where they
    are the explanation."""
    where = (f"{request.index_url} (alone: pip's configuration set aside)" if request.index_url
             else "PyPI (with the indexes and find-links of pip's own configuration)")
    target = f"CPython {request.python} on Linux x86-64"
    unreachable = list(_UNREACHABLE.finditer(output))
    if unreachable:
        why = next((g for g in unreachable[-1].groups() if g), "the connection failed").strip()[:300]
        return _unreachable(request.index_url or "PyPI or an index of pip's configuration", why)
    missing = _NO_MATCH.search(output)
    if missing:
        found = _FROM_VERSIONS.search(output)
        have = f" (versions there: {found.group(1).strip() or 'none'})" if found else ""
        return UsageError(f"{where} has no wheel of {missing.group(1)} for {target}{have}",
                          "give a --pytorch and --py the index has wheels for, or another --wheel-index")
    errors = error_lines(output)
    if "ResolutionImpossible" in output:
        return UsageError(f"pip found no set of wheels for {' '.join(reqs)} on {target} from {where}: "
                          f"{'; '.join(e for e in errors if 'ResolutionImpossible' not in e)[:600]}",
                          "check --pytorch, --py and --with against what the index has, and pip's constraints "
                          "(PIP_CONSTRAINT, pip config list)")
    return ToolFailedError(f"pip could not resolve {' '.join(reqs)} from {where}: {'; '.join(errors)[:600] or 'no error line'}",
                           "check that the index is reachable (pip config list shows pip's own settings)", tail=output)


def _unreachable(index: str, why: str) -> PreflightError:
    return PreflightError(f"the wheel index {index} cannot be reached ({why}); nothing was fetched",
                          "check the URL, the network or proxy, or name a reachable mirror with --wheel-index "
                          "(a file:// index is a folder holding one folder per project)")


def check_index(request: Request) -> None:
    """A file:// --wheel-index must be a folder: pip only warns that it ignores one that is not."""
    local = fileops.path_of_file_url(request.index_url) if request.index_url else None
    if local is not None and not local.is_dir():
        raise _unreachable(request.index_url or "", f"{local} is not a folder")


def _pip(*args: str) -> tuple[str, ...]:
    import sys

    return (sys.executable, "-m", "pip", *args)


def _pip_command(request: Request, *args: str) -> Command:
    """pip with a named --wheel-index set apart from this machine's pip configuration (`pip_command`)."""
    return pip_command(*args, isolated=bool(request.index_url))


def pip_command(*args: str, isolated: bool) -> Command:
    """`python -m pip ARGS`; `isolated`: its configuration files (PIP_CONFIG_FILE=/dev/null) and PIP_* variables
    (--isolated) are set aside, so no extra index, find-links or constraint of this machine's pip takes part and
    the wheels come from where ARGS say or from nowhere (how to connect is passed on). Else pip's own applies."""
    if not isolated:
        return Command(argv=_pip(*args))
    transport: list[str] = []
    for variable, option in _TRANSPORT_OPTIONS.items():
        value = os.environ.get(variable, "")
        for each in value.split() if option == "--trusted-host" else [value] if value else []:
            transport += [option, each]
    return Command(argv=_pip(args[0], "--isolated", *transport, *args[1:]), env={"PIP_CONFIG_FILE": os.devnull})


def target_args(python: str) -> list[str]:
    """pip's options for wheels of CPython `python` on Linux x86-64 (every tag of PLATFORMS), binary only."""
    args = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def error_lines(output: str) -> list[str]:
    """pip's `ERROR:` lines, without the word."""
    return [line.strip().removeprefix("ERROR: ") for line in output.splitlines() if line.strip().startswith("ERROR:")]


def _target_args(request: Request) -> list[str]:
    args = target_args(request.python)
    if request.index_url:
        args += ["--index-url", request.index_url]
    return args


def resolve(request: Request, work: Path, runner: Runner) -> list[Planned]:
    """The stack's wheels as pip resolves them (metadata only; no download of the large files)."""
    report = work / "report.json"
    reqs = requirements(request)
    # Not streamed: a failure is translated (_pip_failure) rather than shown raw.
    done = runner.run(_pip_command(request, "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
                                   str(report), "--target", str(work / "unused"), *_target_args(request), *reqs),
                      check=False)
    if runner.dry_run:
        return []
    if done.returncode != 0:
        raise _pip_failure(done.output, request, reqs)
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


def origin(url: str) -> str:
    """Where pip took a file from, as its report's URL says: a find-links folder or an index's host."""
    local = fileops.path_of_file_url(url)
    if local is not None:
        return f"the folder {local.parent} (pip's find-links)"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def download(request: Request, wheel_dir: Path, runner: Runner,
             on_line: Callable[[str], None] | None = None) -> dict[Path, str]:
    """Fetch the stack into `wheel_dir` (kept between runs); returns each wheel file (hashes checked) with the
    URL pip took it from."""
    requirements(request)  # a malformed request is refused before anything is created
    check_index(request)
    fileops.ensure_dir(wheel_dir, "wheel folder")
    with fileops.scratch(wheel_dir, "resolve") as work:
        planned = resolve(request, work, runner)
        lines = [f"{p.url.split('#')[0]} --hash=sha256:{p.sha256}" for p in planned]
        pinned = work / "requirements.txt"
        pinned.write_text("".join(f"{line}\n" for line in lines))
        runner.run(_pip_command(request, "download", "--require-hashes", "--no-deps", "--dest", str(wheel_dir),
                                "-r", str(pinned), *_target_args(request)),
                   on_line=on_line)
    if runner.dry_run:
        return {}
    paths = {}
    for item in planned:
        path = wheel_dir / item.filename.replace("%2B", "+")
        if not path.is_file() or sha256_of(path) != item.sha256:
            raise UsageError(f"{path.name} is missing or does not match the index's sha256",
                             f"remove {path} and run the command again")
        paths[path] = item.url
    return paths
