#!/usr/bin/env python3
"""Apply torchforge's known source fixes to a source tree. Rendered into recipes; runs inside the build.

Usage: source_edits.py EDITS.json SRC_DIR

Each edit is exact text, never a regular expression. Re-running is harmless: text already edited counts as
applied. A required edit whose file or text is missing fails the build, since building without it produces a
broken package; an optional one is reported and skipped (the code moved between releases).
Standard library only, Python 3.6+ (Jetson TX2's JetPack 4 ships Python 3.6).
"""

import json
import os
import sys


def apply_edit(edit, src_dir):
    path = os.path.join(src_dir, edit["file"])
    if not os.path.isfile(path):
        return "missing-file"
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    kind, find = edit["kind"], edit["find"]
    if kind == "replace":
        replace = edit["replace"]
        if find in text:
            text = text.replace(find, replace)
        elif replace in text:
            return "already-applied"
        else:
            return "missing-text"
    elif kind == "insert_after":
        addition = edit["text"]
        if addition in text:
            return "already-applied"
        lines = text.splitlines(True)
        for index, line in enumerate(lines):
            if find in line:
                ending = "" if line.endswith("\n") else "\n"
                lines.insert(index + 1, ending + addition + "\n")
                break
        else:
            return "missing-text"
        text = "".join(lines)
    elif kind == "comment_lines":
        prefix = edit["prefix"]
        lines = text.splitlines(True)
        changed = False
        for index, line in enumerate(lines):
            if find in line and not line.startswith(prefix):
                lines[index] = prefix + line
                changed = True
        if not changed:
            return "already-applied" if any(find in line for line in lines) else "missing-text"
        text = "".join(lines)
    else:
        return "unknown-kind"
    temporary = path + ".torchforge-tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return "applied"


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
        print("source edit {}: {} {} ({})".format(label, edit["kind"], edit["file"], outcome))
        if not ok and edit.get("required", True):
            failed += 1
    if failed:
        sys.stderr.write("{} required source edit(s) could not be applied: is this the right source tree?\n".format(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
