"""Failure signatures against real message excerpts (tests/fixtures/failures), the loader's validation, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_upload_helpers import cli
from torchforge.diagnose import catalog, explain_log, parse_catalog
from torchforge.errors import DataError, UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "failures"
LOGS = sorted(FIXTURES.glob("*.log"))


def _header(path: Path) -> tuple[str, int]:
    """(expected signature id, number of leading comment lines) from a fixture's `# expect:` / `# source:` lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# expect: "), f"{path.name} must start with '# expect: ID'"
    assert lines[1].startswith("# source: "), f"{path.name} must say where its text comes from"
    return lines[0].removeprefix("# expect: ").strip(), 2


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_each_fixture_is_recognised_as_its_signature(log: Path) -> None:
    expected, comment_lines = _header(log)
    diagnoses = explain_log(log)
    if expected == "nothing":
        assert diagnoses == []
        return
    assert [d.id for d in diagnoses] == [expected]
    # matched on the excerpt itself, not on the comment that names the source
    assert diagnoses[0].line > comment_lines
    assert diagnoses[0].text.strip("…") in log.read_text(encoding="utf-8")


def test_every_signature_and_every_pattern_has_a_real_excerpt() -> None:
    excerpt_lines = [line for log in LOGS for line in log.read_text(encoding="utf-8").splitlines()[2:]]
    expected_ids = {_header(log)[0] for log in LOGS}
    for compiled in catalog().signatures:
        assert compiled.id in expected_ids, f"no fixture for signature {compiled.id}"
        for regex in compiled.regexes:
            assert any(regex.search(line) for line in excerpt_lines), f"{compiled.id}: {regex.pattern!r} matches no excerpt"


def test_the_issue_list_is_covered() -> None:
    ids = set(catalog().ids())
    required = {
        "relocation-overflow", "conda-dependency-needs-building", "nvcc-unknown-option", "cmake-install-permission",
        "missing-submodules", "compiler-killed", "internal-compiler-error", "unsupported-gnu-version",
        "unsupported-gpu-architecture", "lnk1161-vs-17-4", "nvtoolsext-missing-windows", "launch-out-of-resources-701",
        "forward-compat-804", "driver-mismatch-803", "no-kernel-image-209", "driver-too-old-35", "unknown-cuda-arch",
    }
    assert required <= ids


def test_every_signature_names_a_source_explanation_and_fix() -> None:
    for compiled in catalog().signatures:
        sig = compiled.signature
        assert sig.source and sig.fix and sig.explanation and sig.title, compiled.id


def test_order_is_first_match_line_and_each_signature_is_reported_once_with_its_count() -> None:
    log = "\n".join([
        "[1/3] Building CXX object a.o",
        "nvcc fatal   : Unsupported gpu architecture 'compute_35'",
        "g++: fatal error: Killed signal terminated program cc1plus",
        "nvcc fatal   : Unsupported gpu architecture 'compute_37'",
        "ok",
    ])
    diagnoses = explain_log(log)
    assert [(d.id, d.line, d.count) for d in diagnoses] == [
        ("unsupported-gpu-architecture", 2, 2),
        ("compiler-killed", 3, 1),
    ]
    assert diagnoses[0].text == "nvcc fatal   : Unsupported gpu architecture 'compute_35'"


def test_a_killed_compiler_is_memory_not_a_generic_internal_compiler_error() -> None:
    # gcc < 8 words an OOM kill as an "internal compiler error"; the specific signature must win.
    diagnoses = explain_log("c++: internal compiler error: Killed (program cc1plus)\nPlease submit a full bug report,")
    assert [d.id for d in diagnoses] == ["compiler-killed"]


def test_ansi_colour_codes_do_not_hide_a_message() -> None:
    coloured = "\x1b[01m\x1b[Kg++:\x1b[m\x1b[K \x1b[01;31m\x1b[Kfatal error: \x1b[m\x1b[KKilled signal terminated program cc1plus"
    diagnoses = explain_log(coloured)
    assert [d.id for d in diagnoses] == ["compiler-killed"]
    assert "\x1b" not in diagnoses[0].text


def test_a_very_long_line_is_shown_around_the_match() -> None:
    line = "x" * 5000 + " relocation truncated to fit: R_X86_64_PC32 against symbol `b' " + "y" * 5000
    (diagnosis,) = explain_log(line)
    assert len(diagnosis.text) < 400
    assert "relocation truncated to fit: R_X86_64_PC32" in diagnosis.text


def test_text_path_and_str_path_give_the_same_answer(tmp_path: Path) -> None:
    log = FIXTURES / "forward-compat-804.log"
    fifth = log.read_text(encoding="utf-8").splitlines()[4]
    for given in (log, str(log), log.read_text(encoding="utf-8")):
        # Each form is read as the log itself: a str path must not be scanned as if it were the log's text.
        (diagnosis,) = explain_log(given)
        assert (diagnosis.id, diagnosis.line, diagnosis.count) == ("forward-compat-804", 5, 1), given
        assert diagnosis.text.strip("…") in fifth


def test_missing_log_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        explain_log(tmp_path / "nope.log")


def test_latin1_bytes_in_a_log_do_not_crash(tmp_path: Path) -> None:
    log = tmp_path / "msvc.log"
    log.write_bytes(b"\xb5\xbc\xb3\xf6 LazyNativeFunctions.cpp.obj : fatal error LNK1161: \xb5\xbc\xb3\xf6\r\n")
    assert [d.id for d in explain_log(log)] == ["lnk1161-vs-17-4"]


_VALID = """
schema = 1
[meta]
source = "test"
[signatures.one]
title = "t"
patterns = ['abc']
explanation = "e"
fix = "f"
source = "s"
"""


def test_parse_catalog_accepts_a_minimal_table() -> None:
    assert parse_catalog(_VALID).ids() == ("one",)


def test_an_invalid_regex_is_a_data_error_naming_the_key() -> None:
    bad = _VALID.replace("patterns = ['abc']", "patterns = ['abc', 'unbalanced (paren']")
    with pytest.raises(DataError, match=re.escape("signatures.one.patterns[1] is not a valid regex")):
        parse_catalog(bad, "failures.toml")


def test_a_signature_without_patterns_or_with_an_empty_one_is_rejected() -> None:
    with pytest.raises(DataError, match="signatures.one has neither patterns nor literals"):
        parse_catalog(_VALID.replace("patterns = ['abc']", ""))
    with pytest.raises(DataError, match="empty pattern"):
        parse_catalog(_VALID.replace("patterns = ['abc']", "patterns = ['']"))


def test_a_missing_field_or_unknown_key_is_rejected() -> None:
    with pytest.raises(DataError, match="fix"):
        parse_catalog(_VALID.replace('fix = "f"\n', ""))
    with pytest.raises(DataError, match="pattern"):
        parse_catalog(_VALID.replace("patterns =", "pattern ="))


def test_bad_ids_and_clashing_group_names_are_rejected() -> None:
    with pytest.raises(DataError, match="lowercase words"):
        parse_catalog(_VALID.replace("[signatures.one]", "[signatures.One_Bad]"))
    two = _VALID.replace("patterns = ['abc']", "patterns = ['(?P<g>a)']") + _VALID.split("[meta]")[1].split("\n", 2)[2] \
        .replace("[signatures.one]", "[signatures.two]").replace("patterns = ['abc']", "patterns = ['(?P<g>b)']")
    with pytest.raises(DataError, match="cannot be combined"):
        parse_catalog(two)


def test_literals_are_matched_verbatim() -> None:
    table = parse_catalog(_VALID.replace("patterns = ['abc']", "literals = ['a+b (c)']"))
    assert [d.id for d in explain_log("x a+b (c) y", signatures=table)] == ["one"]
    assert explain_log("aab c", signatures=table) == []


def test_a_large_log_is_scanned_to_its_last_line(tmp_path: Path) -> None:
    # A PyTorch CUDA build log runs to ~6,000 ninja steps with long compile lines; 200,000 lines, the failure
    # on the very last. (Its speed is measured by `make bench`, bench/bench_explain.py, not asserted here.)
    line = "[1208/6244] Building CXX object caffe2/CMakeFiles/torch_cuda.dir/x.cu.o " + "-DFLAG " * 40 + "\n"
    log = tmp_path / "big.log"
    log.write_text(line * 200_000 + "g++: fatal error: Killed signal terminated program cc1plus\n", encoding="utf-8")
    diagnoses = explain_log(log)
    assert [(d.id, d.line, d.count) for d in diagnoses] == [("compiler-killed", 200_001, 1)]


def test_cli_explain_prints_the_fix_and_exits_0() -> None:
    result = cli("explain", str(FIXTURES / "relocation-overflow.log"))
    assert result.returncode == 0, result.stderr
    assert "relocation-overflow" in result.stdout
    assert "arch" in result.stdout and "line 5" in result.stdout


def test_cli_explain_json() -> None:
    result = cli("explain", "--json", str(FIXTURES / "unsupported-gnu-version.log"))
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)
    assert entry["id"] == "unsupported-gnu-version"
    assert entry["line"] == 5
    assert "later than 15" in entry["text"]
    assert set(entry) == {"id", "title", "line", "text", "count", "explanation", "fix", "source"}


def test_cli_explain_exits_1_and_says_so_when_nothing_matches() -> None:
    result = cli("explain", str(FIXTURES / "clean-build.log"))
    assert result.returncode == 1
    assert "no known failure signature" in result.stderr
    json_result = cli("explain", "--json", str(FIXTURES / "clean-build.log"))
    assert json_result.returncode == 1
    assert json.loads(json_result.stdout) == []


def test_cli_explain_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("explain", str(tmp_path / "nope.log"))
    assert result.returncode == 2
