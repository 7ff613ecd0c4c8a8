#!/usr/bin/env python3
"""Apply torchforge's known source fixes to a source tree. Rendered into recipes; runs inside the build.

Usage: source_edits.py EDITS.json SRC_DIR

Each edit is exact text (it may span lines), never a regular expression. Re-running is harmless: text already
edited counts as applied. A required edit whose file or text is missing fails the build and prints the text it
looked for, since building without it produces a broken package; an optional one is reported and skipped (the
code moved between releases).
Standard library only, Python 3.6+ (Jetson TX2's JetPack 4 ships Python 3.6).
"""

import json
import os
import sys


def _replace(text, edit):
    find, replace = edit["find"], edit["replace"]
    # The replacement may contain the text it replaces (a guard around it): applied means no bare `find` is left.
    if replace in text and find not in text.replace(replace, ""):
        return text, "already-applied"
    if find not in text:
        return text, "missing-text"
    return text.replace(find, replace), "applied"


def _insert_after(text, edit):
    find, addition = edit["find"], edit["text"]
    if addition in text:
        return text, "already-applied"
    lines = text.splitlines(True)
    for index, line in enumerate(lines):
        if find in line:
            ending = "" if line.endswith("\n") else "\n"
            lines.insert(index + 1, ending + addition + "\n")
            return "".join(lines), "applied"
    return text, "missing-text"


def _comment_lines(text, edit):
    find, prefix = edit["find"], edit["prefix"]
    lines = text.splitlines(True)
    changed = False
    for index, line in enumerate(lines):
        if find in line and not line.startswith(prefix):
            lines[index] = prefix + line
            changed = True
    if not changed:
        return text, "already-applied" if any(find in line for line in lines) else "missing-text"
    return "".join(lines), "applied"


def _comment_range(text, edit):
    """Prefix every line from the first one containing `find` through the next one containing `until`."""
    find, until, prefix = edit["find"], edit["until"], edit["prefix"]
    lines = text.splitlines(True)
    start = next((i for i, line in enumerate(lines) if find in line), None)
    if start is None:
        return text, "missing-text"
    end = next((i for i in range(start, len(lines)) if until in lines[i]), None)
    if end is None:
        return text, "missing-end"
    if lines[start].startswith(prefix):
        return text, "already-applied"
    for index in range(start, end + 1):
        lines[index] = prefix + lines[index]
    return "".join(lines), "applied"


KINDS = {"replace": _replace, "insert_after": _insert_after, "comment_lines": _comment_lines,
         "comment_range": _comment_range}


def apply_edit(edit, src_dir):
    path = os.path.join(src_dir, edit["file"])
    if not os.path.isfile(path):
        return "missing-file"
    kind = KINDS.get(edit["kind"])
    if kind is None:
        return "unknown-kind"
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    text, outcome = kind(text, edit)
    if outcome == "applied":
        temporary = path + ".torchforge-tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    return outcome


def _describe(edit, outcome):
    if outcome == "missing-file":
        return "  {} does not exist in the source tree".format(edit["file"])
    wanted = edit["until"] if outcome == "missing-end" else edit["find"]
    shown = "\n".join("    | " + line for line in wanted.splitlines())
    return "  {} has no {}:\n{}".format(edit["file"], "closing line" if outcome == "missing-end" else "text", shown)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1], encoding="utf-8") as handle:
        edits = json.load(handle)
    failed = 0
    for edit in edits:
        outcome = apply_edit(edit, argv[2])
        ok = outcome in ("applied", "already-applied")
        label = "ok" if ok else ("FAILED" if edit.get("required", True) else "skipped")
        fix = " [{}]".format(edit["fix"]) if edit.get("fix") else ""
        print("source edit {}: {} {} ({}){}".format(label, edit["kind"], edit["file"], outcome, fix))
        if not ok and edit.get("required", True):
            failed += 1
            sys.stderr.write("source edit FAILED{}:\n{}\n".format(fix, _describe(edit, outcome)))
    if failed:
        sys.stderr.write("{} required source edit(s) could not be applied: is this the right source tree "
                         "(version) for this recipe?\n".format(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
