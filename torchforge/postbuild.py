"""What is done to a package the engine built before it is published: its RPATHs fixed and audited, the index
fields its recipe format cannot say added, the __cuda_arch constraint of its device code stamped into its
index; each rewrites the archive in place, atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from torchforge import cudaarch, localchannel
from torchforge.proc import Runner
from torchforge.safeextract import extract_conda


def stamp_cuda_arch(artifact: Path, constraint: str | None) -> None:
    """Give a built CUDA package the CEP 46 `__cuda_arch` run constraint of the device code really in it
    (`constraint`, torchforge.cudaarch), unpacking and rewriting the archive only where its entry changes."""
    present = localchannel.info_json(artifact, "index.json").get("constrains", [])
    if cudaarch.with_constraint(present if isinstance(present, list) else [], constraint) == present:
        return
    with tempfile.TemporaryDirectory(prefix="torchforge-cuda-arch-", dir=artifact.parent) as tmp:
        tree = Path(tmp) / "pkg"
        extract_conda(artifact, tree)
        index_file = tree / "info" / "index.json"
        index = json.loads(index_file.read_text())
        index["constrains"] = cudaarch.with_constraint(index.get("constrains", []), constraint)
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True))
        _rearchive(tree, artifact, Path(tmp))


def _rearchive(tree: Path, artifact: Path, workdir: Path) -> None:
    """Compress an extracted package tree again under the archive's own name, replacing it atomically."""
    from conda_package_handling import api as cph

    files = sorted(str(f.relative_to(tree)) for f in tree.rglob("*") if f.is_file() or f.is_symlink())
    out_dir = workdir / "out"
    out_dir.mkdir()
    cph.create(str(tree), files, artifact.name, out_folder=str(out_dir))
    os.replace(out_dir / artifact.name, artifact)


def ensure_index_fields(artifact: Path, fields: tuple[tuple[str, str], ...], runner: Runner) -> Path:
    """Give the package's info/index.json the planned `fields` where the engine wrote other values."""
    if not fields or runner.dry_run:
        return artifact
    index = localchannel.info_json(artifact, "index.json")
    if all(index.get(name) == value for name, value in fields):
        return artifact
    with tempfile.TemporaryDirectory(prefix="torchforge-index-", dir=artifact.parent) as tmp:
        tree = Path(tmp) / "pkg"
        extract_conda(artifact, tree)
        index_file = tree / "info" / "index.json"
        index = json.loads(index_file.read_text())
        index.update(dict(fields))
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True))
        _rearchive(tree, artifact, Path(tmp))
    return artifact


def fix_and_audit_package(artifact: Path, runner: Runner) -> Path:
    """RPATH audit of the built package; when it flags something, fix the tree and rewrite the archive.

    The recipe's own patchelf step normally leaves nothing to fix, and then the archive is untouched. A fixed
    tree gets new sha256/size entries in info/paths.json before it is compressed again, next to the original.
    """
    import hashlib
    import json

    from torchforge.rpath import Layout, audit
    from torchforge.rpath.fix import fix_and_audit

    if audit(artifact, Layout.CONDA).ok:
        return artifact
    with tempfile.TemporaryDirectory(prefix="torchforge-fix-", dir=artifact.parent) as tmp:
        tree = Path(tmp) / "pkg"
        extract_conda(artifact, tree)
        fix_and_audit(tree, Layout.CONDA, runner)  # raises AuditFailedError if problems remain
        if runner.dry_run:  # the patchelf commands were printed; nothing is rewritten
            return artifact
        paths_file = tree / "info" / "paths.json"
        paths = json.loads(paths_file.read_text())
        for entry in paths["paths"]:
            path = tree / entry["_path"]
            if path.is_symlink():  # patchelf rewrote files only; a link may resolve only in an environment
                continue
            data = path.read_bytes()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            entry["size_in_bytes"] = len(data)
        paths_file.write_text(json.dumps(paths, indent=2, sort_keys=True))
        _rearchive(tree, artifact, Path(tmp))
    return artifact
