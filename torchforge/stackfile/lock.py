"""The stack's lock: every package file of the stack after a build (name, version, build, subdir, sha256, the
arches of its device code, the channel), beside the stack file; `install --stack` installs exactly that set.

The lock is made by solving the stack's own packages (exact name, version and build) from the output channel and
the channels the stack installs next to, per Python; installing it queries each locked file's channel for that one
record (no solve) and refuses a file the channel no longer holds or whose sha256 differs.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from torchforge.datamodels import FrozenModel
from torchforge.errors import UsageError
from torchforge.fileops import atomic_write, path_of_file_url, sha256_file

LOCK_VERSION = 1
# Written once after a build (`build --stack`); its first lines say so, for whoever opens it.
HEADER = ("# torchforge lock of {stack}: the exact package files of the stack, written by `torchforge build --stack`.\n"
          "# `torchforge install --stack {stack}` installs exactly these; `torchforge verify --stack` checks a prefix\n"
          "# against them. Do not edit: rebuild to change it.\n")


class LockedPackage(FrozenModel):
    name: str
    version: str
    build: str
    subdir: str
    file: str
    sha256: str
    channel: str
    arch: tuple[str, ...] = ()  # sm_XY (SASS) and compute_XY (PTX) of its device code; () for none (or a CPU stack)

    @property
    def stem(self) -> str:
        return f"{self.name}-{self.version}-{self.build}"


class Environment(FrozenModel):
    python: str
    platform: str
    packages: tuple[LockedPackage, ...]


class Lock(FrozenModel):
    version: int
    stack: str
    stack_sha256: str
    environments: tuple[Environment, ...]

    def environment(self, python: str | None, lock_path: Path) -> Environment:
        """The one environment of `python` (None: the lock's only one)."""
        if python is None and len(self.environments) == 1:
            return self.environments[0]
        found = [env for env in self.environments if env.python == python]
        pythons = ", ".join(env.python for env in self.environments)
        if python is None or not found:
            raise UsageError(f"{lock_path} locks the Pythons {pythons}" + ("" if python is None else f", not {python}"),
                             f"give --py with one of {pythons}")
        return found[0]


def _toml_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def render(lock: Lock) -> str:
    """The lock as TOML, in a stable order (its packages by name)."""
    lines = [HEADER.format(stack=lock.stack), f"version = {lock.version}", f"stack = {_toml_value(lock.stack)}",
             f"stack_sha256 = {_toml_value(lock.stack_sha256)}"]
    for env in lock.environments:
        lines += ["", "[[environments]]", f"python = {_toml_value(env.python)}",
                  f"platform = {_toml_value(env.platform)}"]
        for package in sorted(env.packages, key=lambda p: (p.name, p.file)):
            lines += ["", "[[environments.packages]]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in package.model_dump().items()]
    return "\n".join(lines) + "\n"


def read(path: Path) -> Lock:
    import tomllib

    if not path.is_file():
        raise UsageError(f"no lock {path} beside the stack file",
                         "run `torchforge build --stack` first: it writes the lock after the build")
    try:
        return Lock.model_validate(tomllib.loads(path.read_text("utf-8")))
    except (tomllib.TOMLDecodeError, ValidationError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a torchforge lock: {str(exc).splitlines()[0]}",
                         "rebuild with `torchforge build --stack` to write it again") from None


def write(stack_path: Path, lock_path: Path, environments: Sequence[Environment]) -> Path:
    """The lock beside the stack file, written whole (a reader sees the old lock or the new one)."""
    lock = Lock(version=LOCK_VERSION, stack=stack_path.name, stack_sha256=sha256_file(stack_path),
                environments=tuple(environments))
    return atomic_write(lock_path, render(lock))


def locked_environment(stems: Sequence[str], channels: Sequence[str], python: str, platform: str,
                       cuda: str) -> Environment:
    """Solve the stack's packages (`stems`: name-version-build, each exactly) and what they need from `channels`,
    with the stack's CUDA as the __cuda the solve sees; each record becomes a locked file."""
    from torchforge.prefix import channel_url
    from torchforge.rattlerchild import call

    specs = [f"{stem.rsplit('-', 2)[0]} =={stem.rsplit('-', 2)[1]} {stem.rsplit('-', 2)[2]}" for stem in stems]
    urls = [channel_url(c) for c in channels]
    with tempfile.TemporaryDirectory(prefix="torchforge-lock-") as work:
        records: list[dict[str, str]] = call("torchforge.stackfile.lock:_solved", specs, urls, platform,
                                             "" if cuda == "cpu" else cuda, Path(work))
    packages = tuple(LockedPackage(**record, arch=_arches(record, cuda)) for record in records)
    return Environment(python=python, platform=platform, packages=packages)


def _arches(record: dict[str, str], cuda: str) -> tuple[str, ...]:
    """sm_XY of the SASS and compute_XY of the PTX of a locked file of a CUDA stack in a local channel, sorted
    (torchforge.archcheck's reader); () for a package without device code."""
    local = path_of_file_url(record["channel"].rstrip("/") + f"/{record['subdir']}/{record['file']}")
    if cuda == "cpu" or local is None or not local.is_file():
        return ()
    from torchforge.archcheck import package_device_code

    codes = package_device_code(local).values()
    return tuple(sorted({a for c in codes for a in c.sass} | {a.replace("sm_", "compute_") for c in codes for a in c.ptx}))


def _solved(specs: list[str], urls: list[str], platform: str, cuda: str, work: Path) -> list[dict[str, str]]:
    """In the child (torchforge.rattlerchild): the solve, as plain records."""
    import rattler
    from rattler.exceptions import SolverError

    from torchforge.aio import run_async

    if cuda:
        os.environ["CONDA_OVERRIDE_CUDA"] = cuda  # the stack's CUDA, whatever this machine's driver
    virtual = rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env())
    try:
        records = run_async(rattler.solve(urls, [rattler.MatchSpec(spec) for spec in specs],
                                          platforms=[platform, "noarch"], virtual_packages=virtual,
                                          gateway=rattler.Gateway(cache_dir=work / "repodata")))
    except SolverError as exc:
        raise UsageError(f"the stack's packages do not install together from {', '.join(urls)}: "
                         f"{' '.join(str(exc).split())[:600]}",
                         "add the channel that has the missing packages to [channels] next_to") from None
    return [_plain(record) for record in records]


def _plain(record: Any) -> dict[str, str]:
    return {"name": record.name.normalized, "version": str(record.version), "build": str(record.build),
            "subdir": str(record.subdir), "file": str(record.file_name),
            "sha256": record.sha256.hex() if record.sha256 else "", "channel": _channel_of(record)}


def _channel_of(record: Any) -> str:
    """The channel's URL: the record's URL without /<subdir>/<file>."""
    url = str(record.url)
    return url[: -len(f"/{record.subdir}/{record.file_name}")] if url.endswith(f"/{record.file_name}") else url
