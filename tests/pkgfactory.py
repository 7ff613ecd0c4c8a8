"""Tiny but real conda packages for tests, written with conda-package-handling (tooling.md §2).

Each package has info/index.json, info/paths.json, info/files and one payload file, so py-rattler can
index, solve and install it. Compression level 1 keeps creation in the milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from conda_package_handling import api


def make_package(
    out_dir: Path,
    name: str = "hello",
    version: str = "1.0",
    build: str = "py3.11_cpu_0",  # official-style: the dot is what strict MatchSpec parsing rejects
    subdir: str = "linux-64",
    depends: Sequence[str] = (),
    fmt: str = ".conda",
    payload_bytes: int = 0,
    about_extra: dict[str, object] | None = None,
    build_number: int = 0,
    constrains: Sequence[str] = (),
    extra_files: int = 0,
) -> Path:
    """Build `<name>-<version>-<build><fmt>` in `out_dir` and return its path.

    `payload_bytes` adds an incompressible-ish blob, for tests that need a file of some size; `extra_files`
    adds that many small files (an install that takes a while, as a real package's thousands of files do).
    """
    out_dir = out_dir.resolve()  # .tar.bz2 creation chdirs into the stage: the output must be absolute
    with tempfile.TemporaryDirectory(prefix="pkgfactory-") as tmp:
        return _make(Path(tmp), out_dir, name, version, build, subdir, depends, fmt, payload_bytes, about_extra,
                     build_number, constrains, extra_files)


def _make(
    stage: Path,
    out_dir: Path,
    name: str,
    version: str,
    build: str,
    subdir: str,
    depends: Sequence[str],
    fmt: str,
    payload_bytes: int,
    about_extra: dict[str, object] | None = None,
    build_number: int = 0,
    constrains: Sequence[str] = (),
    extra_files: int = 0,
) -> Path:
    (stage / "info").mkdir(parents=True, exist_ok=True)
    (stage / "share" / name).mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    paths: list[dict[str, object]] = []

    def add(rel: str, data: bytes) -> None:
        (stage / rel).write_bytes(data)
        files.append(rel)
        paths.append(
            {"_path": rel, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(), "size_in_bytes": len(data)}
        )

    add(f"share/{name}/hello.txt", f"hello from {name} {version}\n".encode())
    if payload_bytes:
        # SHAKE-256 output: deterministic and not compressible, so the archive really is about this big,
        # and fast enough (about 300 MB/s) for the suite's one package of hundreds of MB.
        add(f"share/{name}/blob.bin", hashlib.shake_256(f"{name}{version}".encode()).digest(payload_bytes))
    for number in range(extra_files):
        folder = stage / "share" / name / f"d{number // 100:03d}"
        folder.mkdir(exist_ok=True)
        add(f"share/{name}/d{number // 100:03d}/f{number:05d}.txt", f"{number}\n".encode())
    index: dict[str, object] = {
        "name": name,
        "version": version,
        "build": build,
        "build_number": build_number,
        "depends": list(depends),
        **({"constrains": list(constrains)} if constrains else {}),
        "license": "BSD-3-Clause",
        "subdir": subdir,
        "timestamp": int(time.time() * 1000),
    }
    if subdir != "noarch":
        os_name, _, arch = subdir.partition("-")
        index.update(platform=os_name, arch={"64": "x86_64", "aarch64": "aarch64", "arm64": "arm64"}.get(arch, arch))
    (stage / "info" / "index.json").write_text(json.dumps(index))
    (stage / "info" / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
    (stage / "info" / "files").write_text("\n".join(files) + "\n")
    members = [*files, "info/index.json", "info/paths.json", "info/files"]
    if about_extra is not None:
        (stage / "info" / "about.json").write_text(json.dumps({"extra": about_extra}))
        members.append("info/about.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    filename = f"{name}-{version}-{build}{fmt}"
    (out_dir / filename).unlink(missing_ok=True)
    kwargs: dict[str, object] = {"compression_level": 1} if fmt == ".conda" else {}
    created = api.create(str(stage), members, filename, out_folder=str(out_dir), **kwargs)
    return Path(created)
