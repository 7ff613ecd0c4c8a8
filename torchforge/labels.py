"""The one rule for a channel label, wherever a label comes from: `upload --label`, `promote --label` and
`--from-label`, a named target's `labels` (channels/*.toml), `ci`'s staging label (data/ci.toml), and every
uploader that turns a label into a folder (`<channel>/label/<L>`) or an anaconda.org URL.

A label is one name: it starts with a letter or digit, then letters, digits, '.', '_' or '-'. So it has no
'/', is never '.' or '..', and cannot lead a folder channel's path out of the channel. (anaconda.org's own
labels are such names: main, rc, dev, gcc7.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torchforge.errors import UsageError

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RULE = "a label is letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. main, rc, staging)"


def check_label(label: str, where: str) -> str:
    """`label` if it is a label, else UsageError (exit 2) naming `where` it came from and what would work."""
    if not _LABEL.fullmatch(label):  # fullmatch: '$' would let a trailing newline through
        raise UsageError(f"label {label!r} in {where} is not a valid label", RULE)
    return label


def check_labels(labels: Iterable[str], where: str) -> tuple[str, ...]:
    """Each label once, in the order first given (`-l main -l main` is one label, uploaded to and said once)."""
    return tuple(dict.fromkeys(check_label(label, where) for label in labels))
