"""The pytorch a team already has (`--for SPEC`, issue 38): one pytorch package of a local channel, named by a
conda match spec, as a plan input like a planned one.

It is looked for in the channels of `--channel`, then `--out`. Its version, build string, subdir, Python and CUDA
runtime package come from its index record; its CUDA from its build string and requirements; for CUDA, its arch
list from the device code of pytorch's own libraries (`torch/lib`: libtorch_cuda.so and the rest, not NVIDIA's),
listed once, when the plan is made. Without --for and --pytorch, a request with --with or --extension is built for
the one pytorch of --out, and says so.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from torchforge import localchannel, rattlerchild
from torchforge.binaries.catalog import catalog
from torchforge.console import note
from torchforge.errors import UsageError
from torchforge.flavours.base import PytorchBuild, Request

PYTORCH = "pytorch"
SUBDIRS = ("linux-64", "linux-aarch64", "win-64", "osx-64", "osx-arm64")
# pytorch's python pin, as each shape writes it: `python >=3.11,<3.12.0a0` (a repacked wheel, the official
# channel), `python 3.11.* *_cpython` (conda-forge's recipes, torchforge's conda-forge flavour), `python_abi 3.11.*
# *_cp311` (conda-forge's run export)
_PYTHON_PIN = re.compile(r"^python(?:_abi)?\s+(?:>=?|==)?\s*(\d+\.\d+)")
_CUDA_IN_BUILD = re.compile(r"(?:cuda|cu)(\d+)\.?(\d)")
# NVIDIA's libraries a pytorch package may carry in torch/lib: not pytorch's own, their arch lists are NVIDIA's
_NVIDIA = re.compile(r"^lib(cu|nv|cudnn|nccl|cusparse|cublas|cufft|curand|cusolver|nvrtc|nvjitlink|nvshmem)")
_OWN_LIBRARY = re.compile(r"(^|/)torch/lib/[^/]+\.so[.0-9]*$")
FOR_HINT = "give --for a conda match spec of one pytorch package, e.g. 'pytorch ==2.13.0 whl_*'"


@dataclass(frozen=True)
class Found:
    """One record of a channel: where it is and what its index says."""

    channel: Path
    subdir: str
    filename: str
    record: dict[str, object]


def local_channels(urls: tuple[str, ...]) -> tuple[Path, ...]:
    """The channels --for reads: local folders and file:// URLs (a remote channel's files are not read here)."""
    return tuple(folder for url in urls if (folder := localchannel.folder_of(url)) is not None and folder.is_dir())


def _records(channel: Path) -> list[Found]:
    found = []
    for subdir in SUBDIRS:
        index = channel / subdir / "repodata.json"
        if not index.is_file():
            continue
        data = json.loads(index.read_text())
        for key in ("packages", "packages.conda"):
            for filename, record in data.get(key, {}).items():
                if record.get("name") == PYTORCH:
                    found.append(Found(channel, subdir, filename, record))
    return found


def matching(spec: str, records: list[tuple[str, str, dict[str, object]]]) -> list[int]:
    """The indexes of `records` ((subdir, file name, index record)) that the match spec takes: py-rattler's
    MatchSpec over the records as a repodata.json holds them (run in rattlerchild's child process)."""
    import rattler

    try:
        match = rattler.MatchSpec(spec)
    except Exception as exc:  # py-rattler's parse errors have no common base class
        raise UsageError(f"--for {spec!r} is not a conda match spec: {exc}", FOR_HINT) from exc
    chosen = []
    with tempfile.TemporaryDirectory(prefix="torchforge-for-") as scratch:
        for position, (subdir, filename, record) in enumerate(records):
            index = Path(scratch) / f"{position}.json"
            index.write_text(json.dumps({"info": {"subdir": subdir}, "packages": {}, "packages.conda": {
                filename: {"subdir": subdir, "depends": [], **record}}}))
            packages = rattler.RepoData.from_path(str(index)).into_repo_data(rattler.Channel(Path(scratch).as_uri()))
            if any(match.matches(package) for package in packages):
                chosen.append(position)
    return chosen


def find(spec: str, channels: tuple[str, ...]) -> Found:
    """The one pytorch package of `channels` the match spec takes; none or several is a usage error naming them."""
    if re.split(r"[\s\[=<>!~]", spec.strip(), maxsplit=1)[0] != PYTORCH:
        raise UsageError(f"--for {spec!r} names no pytorch package", FOR_HINT)
    folders = local_channels(channels)
    if not folders:
        raise UsageError(f"--for {spec!r}: no local channel to look in (--channel {', '.join(channels) or 'none'})",
                         "give the channel that holds it with --channel FOLDER, or --out")
    candidates = [found for folder in folders for found in _records(folder)]
    chosen = [candidates[i] for i in rattlerchild.call("torchforge.havepytorch:matching", spec, [
        (f.subdir, f.filename, f.record) for f in candidates])] if candidates else []
    if len(chosen) != 1:
        listed = ", ".join(f"{f.subdir}/{f.filename}" for f in (chosen or candidates)) or "no pytorch package"
        raise UsageError(f"--for {spec!r}: {len(chosen)} pytorch packages match in {', '.join(map(str, folders))} "
                         f"({'matching: ' if chosen else 'the channels hold: '}{listed}); a build is for exactly one",
                         "narrow the spec to one file (its version and build string)" if chosen else
                         "repack or build that pytorch into the channel first, or fix the spec")
    return chosen[0]


def _cuda_runtime(depends: list[str]) -> str | None:
    """The one of pytorch's requirements whose package holds libcudart, by its component name or conda-forge's."""
    holders = {name for key, c in catalog().components.items() if any(lib.startswith("libcudart") for lib in c.libraries)
               for name in (key, c.conda_forge)}
    return next((spec for spec in depends if spec.split()[0] in holders), None)


def listed_device_code(archive: Path) -> tuple[set[str], set[str]]:
    """(SASS archs, PTX archs) of pytorch's own CUDA libraries in a package: every library under torch/lib with device
    code except NVIDIA's, as torchforge.archcheck reads a package file."""
    from torchforge import archcheck

    def own(name: str) -> bool:
        return bool(_OWN_LIBRARY.search(name)) and not _NVIDIA.match(PurePosixPath(name).name)

    codes = archcheck.package_device_code(archive, include=own).values()
    return {a for code in codes for a in code.sass}, {a for code in codes for a in code.ptx}


def arch_list_of(sass: set[str], ptx: set[str]) -> str:
    """TORCH_CUDA_ARCH_LIST's words for a listing: each SASS arch as X.Y, the newest PTX one with +PTX."""
    def number(arch: str) -> tuple[int, int, str]:
        digits = re.match(r"sm_(\d+?)(\d)([af]?)$", arch)
        return (int(digits.group(1)), int(digits.group(2)), digits.group(3)) if digits else (0, 0, arch)

    newest_ptx = max(ptx, key=number) if ptx else None
    words = []
    for arch in sorted(sass | ({newest_ptx} if newest_ptx else set()), key=number):
        major, minor, suffix = number(arch)
        words.append(f"{major}.{minor}{suffix}" + ("+PTX" if arch == newest_ptx else ""))
    return ";".join(words)


def in_channel(channel: Path, subdir: str, arch_list: str | None = None) -> PytorchBuild:
    """The one pytorch package of `subdir` in a local channel (a stack's output channel once its torch is
    repacked), read as --for reads one (`arch_list`: the request's --arch-list); none or several is a usage error
    naming them."""
    found = [f for f in _records(channel) if f.subdir == subdir] if channel.is_dir() else []
    if len(found) != 1:
        listed = ", ".join(sorted(f.filename for f in found)) or "none"
        raise UsageError(f"{channel}/{subdir}: {len(found)} pytorch packages ({listed}); an extension is built for "
                         "exactly one", "build or repack that pytorch into the channel first, or name one with --for SPEC")
    return build_of(found[0], arch_list)


def build_of(found: Found, requested_arch_list: str | None = None) -> PytorchBuild:
    """The PytorchBuild of a channel's record; for CUDA, the arch list its own libraries carry (never empty): where
    they hold none that can be listed, `requested_arch_list` (--arch-list, which its companions and extensions take
    anyway), else a usage error."""
    record = found.record
    depends = [str(d) for d in record.get("depends", [])]  # type: ignore[attr-defined]
    python = next((m.group(1) for spec in depends if (m := _PYTHON_PIN.match(spec))), None)
    if python is None:
        raise UsageError(f"{found.filename}: no python pin in its requirements, so no Python to build for",
                         "rebuild or repack it with torchforge")
    cuda_match = _CUDA_IN_BUILD.search(str(record["build"]).replace("cpu", ""))
    cuda = f"{cuda_match.group(1)}.{cuda_match.group(2)}" if cuda_match else None
    arch_list = None
    if cuda:
        arch_list = arch_list_of(*listed_device_code(found.channel / found.subdir / found.filename)) \
            or requested_arch_list
        if not arch_list:
            raise UsageError(f"{found.filename}: a CUDA {cuda} pytorch whose own libraries (torch/lib) hold no device "
                             "code, so no arch list to build for", "give --arch-list, or name another pytorch")
    return PytorchBuild(str(record["version"]), str(record["build"]), found.subdir, python, cuda, arch_list,
                        _cuda_runtime(depends) if cuda else None,
                        split_libtorch=any(spec.split()[0] == "libtorch" for spec in depends if spec.strip()),
                        depends=tuple(depends))


# The flags that select a pytorch to build: --for names one that exists instead
_BUILD_FLAGS = ("pytorch", "cuda", "python", "source")


@cache
def given(request: Request) -> tuple[PytorchBuild, str] | None:
    """The pytorch of a request that names one (--for), or of --out where it asks for --with or --extension and no
    --pytorch: its build and where it was found, said once; None where the request plans its own pytorch. Read once
    per request (a CUDA package's libraries are listed)."""
    if request.for_pytorch is not None:
        clashing = [f"--{'py' if name == 'python' else name}" for name in _BUILD_FLAGS if getattr(request, name)]
        if clashing or request.patches:
            raise UsageError(f"--for names the pytorch to build for; {', '.join(clashing or ['--patch'])} would plan "
                             "one to build", "leave them out, or leave --for out")
        found = find(request.for_pytorch, request.for_channels)
        where = f"{found.subdir}/{found.filename} of {found.channel} (--for {request.for_pytorch})"
    elif request.pytorch is None and (request.with_packages or request.extensions) and request.for_channels:
        out = local_channels(request.for_channels[-1:])  # --out is the last one looked in
        records = _records(out[0]) if out else []
        if len(records) != 1:
            return None
        found = records[0]
        where = f"{found.subdir}/{found.filename} of {found.channel} (the one pytorch of --out)"
    else:
        return None
    build = build_of(found, request.arch_list)
    note(f"building for {build.stem}: {where}; no pytorch source build is planned"
         + ("" if request.for_pytorch else " (--for SPEC or --pytorch to choose another)"))
    return build, where
