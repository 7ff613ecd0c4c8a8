"""What a `--patch` / `--magma-patch` file must be: a patch that changes something.

A file with no hunk (a note, an empty file, headers alone) applies cleanly and changes nothing, yet its sha256
would make the build "custom" and its recorded settings would list it: such a file is refused before anything is
read further or written. Hunks are recognised in the forms `patch` and `git apply` take: unified (`@@ -1,2 +1,3
@@`), context (`*** 1,2 ****` after a `***************` line) and git's binary patches.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from torchforge.errors import UsageError

_UNIFIED_HUNK = re.compile(rb"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.MULTILINE)
_CONTEXT_HUNK = re.compile(rb"^\*{15}[ \t]*\r?\n\*\*\* \d+(,\d+)? \*\*\*\*", re.MULTILINE)
_GIT_BINARY = re.compile(rb"^GIT binary patch\r?$", re.MULTILINE)


def has_hunks(content: bytes) -> bool:
    return any(form.search(content) for form in (_UNIFIED_HUNK, _CONTEXT_HUNK, _GIT_BINARY))


def check_patches(flag: str, paths: list[Path] | None) -> list[Path] | None:
    """The patch files of `flag`, each one checked to hold at least one hunk."""
    for path in paths or ():
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{flag} {path} cannot be read: {exc.strerror}", "give a readable patch file") from None
        if not has_hunks(content):
            what = "is empty" if not content.strip() else "has no hunk (no `@@ -l,s +l,s @@` line): it changes nothing"
            raise UsageError(f"{flag} {path} is not a patch: it {what}",
                             f"give a unified diff (`git diff`, `diff -u`), or leave {flag} out")
    return paths


def digests(patches: Sequence[Path] | None) -> tuple[str, ...]:
    """The sha256 of each patch file: patches change the binary, so their content (not their path) is part of a
    package's settings."""
    return tuple(hashlib.sha256(p.read_bytes()).hexdigest() for p in patches or ())
