"""rattler's shared package cache, as the embedded engine meets it: drop a build's own outputs before it runs.

rattler-build extracts every package it installs (build and host dependencies, and the outputs its test step
installs) into one cache per user, `<cache dir>/pkgs/<name>-<version>-<build>`, shared by every build and by
pixi. An entry is found by that name: when the folder is there, the test step takes the package under test
(its files and its test commands) from it, not from the archive just written. A rebuild with the same build
string (`--force`, or a recipe changed where the string does not see it) would be tested as the old package.
Removing the entries of the outputs about to be built, and only those, makes the test install what was built;
dependencies keep their entries, which is what the cache is for.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGES = "pkgs"  # rattler_cache's PACKAGE_CACHE_DIR, under the cache dir


def cache_dir(environ: Mapping[str, str]) -> Path:
    """rattler's cache folder: $RATTLER_CACHE_DIR, else the platform's cache folder (Rust `dirs`) + rattler/cache."""
    if environ.get("RATTLER_CACHE_DIR"):
        return Path(environ["RATTLER_CACHE_DIR"])
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "darwin":
        base = home / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    else:
        xdg = environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else home / ".cache"
    return base / "rattler" / "cache"


def evict(stems: Iterable[str], environ: Mapping[str, str]) -> list[Path]:
    """Remove the package cache's entries for these file stems (name-version-build); returns those removed."""
    packages = cache_dir(environ) / PACKAGES
    removed = []
    for stem in stems:
        if stem in ("", ".", "..") or Path(stem).name != stem:
            raise ValueError(f"not a package file stem: {stem!r}")
        entry = packages / stem
        lock = packages / f"{stem}.lock"
        if not lock.exists() and not entry.exists():
            continue
        # rattler holds an advisory lock on <entry>.lock while it fills or reads the folder: wait for it
        with open(lock, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            shutil.rmtree(entry, ignore_errors=True)
            lock.unlink(missing_ok=True)
        removed.append(entry)
    return removed
