"""Wheel repair for `--format wheel`: RPATH fix + audit, manylinux tag from the GLIBC versions the ELF files
really require, local version (`+cpu`, `+cu128`), regenerated `*.dist-info/RECORD`, atomic re-zip.

This is the job official `build_common.sh` does by hand because "auditwheel repair doesn't work correctly"
(official-builds.md §3.1, §3.7): same steps, but the tag is computed instead of hard-coded.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchforge import fileops
from torchforge.elf import iter_tree, maybe_elf, read_elf
from torchforge.errors import UsageError
from torchforge.proc import Runner
from torchforge.rpath import Layout
from torchforge.rpath.fix import fix_and_audit
from torchforge.wheelzip import extract_wheel

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


@dataclass(frozen=True)
class WheelName:
    name: str
    version: str
    python: str
    abi: str
    platform: str
    build: str | None = None  # the optional build tag (PyPI's torch 2.10.0 files carry `-3-`)

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        match = _WHEEL_NAME.match(filename)
        if not match:
            raise UsageError(f"{filename} is not a wheel file name", "expected NAME-VERSION-PY-ABI-PLATFORM.whl")
        return cls(match["name"], match["version"], match["py"], match["abi"], match["plat"], match["build"])

    @property
    def public_version(self) -> str:
        return self.version.split("+", 1)[0]

    @property
    def local(self) -> str | None:
        return self.version.split("+", 1)[1] if "+" in self.version else None

    @property
    def filename(self) -> str:
        build = f"-{self.build}" if self.build else ""
        return f"{self.name}-{self.version}{build}-{self.python}-{self.abi}-{self.platform}.whl"


def file_hash(path: Path) -> tuple[str, int]:
    """RECORD's `sha256=<urlsafe b64, no padding>` and the size."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return record_digest(digest.digest()), size


def record_digest(sha256: bytes) -> str:
    """RECORD's form of a sha256 digest."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode()


def write_record(root: Path, dist_info: str, known: Mapping[str, tuple[str, int]] | None = None) -> Path:
    """Rewrite `<dist_info>/RECORD` for every file under `root` (RECORD itself gets `,,`). `known` gives files'
    sha256 (hex) and size by path relative to `root`, already computed by the caller: those are not read again."""
    record = root / dist_info / "RECORD"
    lines = []
    for path in iter_tree(root):
        rel = path.relative_to(root).as_posix()
        if rel == f"{dist_info}/RECORD":
            continue
        if known is not None and rel in known:
            digest, size = record_digest(bytes.fromhex(known[rel][0])), known[rel][1]
        else:
            digest, size = file_hash(path)
        lines.append(f"{rel},{digest},{size}")
    lines.append(f"{dist_info}/RECORD,,")
    record.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return record


def required_glibc(root: Path) -> tuple[int, int] | None:
    """The highest GLIBC_x.y symbol version any ELF file under `root` requires."""
    highest: tuple[int, int] | None = None
    for path in iter_tree(root):
        if maybe_elf(path):
            info = read_elf(path, glibc=True)
            if info is not None and info.glibc is not None:
                highest = info.glibc if highest is None else max(highest, info.glibc)
    return highest


def manylinux_tag(root: Path, arch: str = "x86_64") -> str:
    """PEP 600 tag for the glibc the binaries need (manylinux_2_17 is the floor pip still installs widely)."""
    glibc = required_glibc(root) or (2, 17)
    major, minor = max(glibc, (2, 17))
    return f"manylinux_{major}_{minor}_{arch}"


def _dist_info(root: Path) -> Path:
    found = sorted(root.glob("*.dist-info"))
    if len(found) != 1:
        raise UsageError(f"expected one *.dist-info folder in the wheel, found {len(found)}")
    return found[0]


def _zip_tree(root: Path, target: Path, dist_info: str) -> None:
    # dist-info last, as `wheel pack` does, so streaming readers see the payload before RECORD.
    files = sorted(iter_tree(root), key=lambda p: (p.relative_to(root).as_posix().startswith(dist_info + "/"), p.as_posix()))
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path in files:
            info = zipfile.ZipInfo.from_file(path, path.relative_to(root).as_posix())
            info.compress_type = zipfile.ZIP_DEFLATED
            with path.open("rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def repair(
    wheel: Path,
    out_dir: Path,
    runner: Runner,
    *,
    local: str | None = None,
    layout: Layout = Layout.WHEEL_BUNDLED,
    bundle: Sequence[Path] = (),
    nvidia_era: str = "cu12",
) -> Path:
    """Repair `wheel` into `out_dir`; returns the new wheel path. The work happens in a scratch folder of
    `out_dir`; the new wheel appears under its final name only complete (zipped there, then renamed)."""
    name = WheelName.parse(wheel.name)
    if not name.platform.startswith(("linux_", "manylinux")):
        raise UsageError(f"{wheel.name} is not a Linux wheel", "wheel repair handles linux_* and manylinux* wheels")
    # The unpacked wheel (700 MB for torch) lives in a scratch folder of `out_dir`, which the next run
    # removes if this one is killed.
    with fileops.scratch(out_dir, "repair") as tmp:
        root = tmp / "w"
        extract_wheel(wheel, root)
        fix_and_audit(root, layout, runner, bundle=bundle, nvidia_era=nvidia_era)
        arch = name.platform.split("_", 1)[1] if name.platform.startswith("linux_") else name.platform.rsplit("_", 2)[-1]
        arch = "x86_64" if "x86_64" in name.platform else ("aarch64" if "aarch64" in name.platform else arch)
        platform = manylinux_tag(root, arch)
        version = name.public_version + (f"+{local}" if local else (f"+{name.local}" if name.local else ""))
        dist = _dist_info(root)
        new_dist = root / f"{name.name}-{version}.dist-info"
        if dist != new_dist:
            dist.rename(new_dist)
        metadata = new_dist / "METADATA"
        metadata.write_text(re.sub(r"^Version: .*$", f"Version: {version}", metadata.read_text("utf-8"), count=1,
                                   flags=re.MULTILINE), encoding="utf-8")
        wheel_file = new_dist / "WHEEL"
        text = wheel_file.read_text("utf-8")
        text = re.sub(r"^Tag: .*\n?", "", text, flags=re.MULTILINE).rstrip("\n") + "\n"
        text += f"Tag: {name.python}-{name.abi}-{platform}\n"
        wheel_file.write_text(text, encoding="utf-8")
        write_record(root, new_dist.name)
        repaired = WheelName(name.name, version, name.python, name.abi, platform)
        target = out_dir / repaired.filename
        partial = tmp / repaired.filename
        _zip_tree(root, partial, new_dist.name)
        fileops.move_into_place(partial, target)
        return target
