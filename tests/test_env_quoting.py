"""--env values reach the build literally (issue 25 item 5): build.sh single-quotes them (a `$(cmd)` once ran at
build time inside double quotes), bld.bat escapes `%`, the CI files keep them as one literal argument, and what
cannot be quoted (a newline; `"` for cmd.exe; `${{` that GitHub Actions expands in any `run:`) is refused."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from torchforge.cli import main

HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "$HOME", "a'b", 'say "hi"', "back\\slash", "${X:-y}", "100%", "a b"]
RECIPE = "pytorch-2.5.1-cpu-py311-linux_64"


def _exports(build_sh: str) -> str:
    return "\n".join(line for line in build_sh.splitlines() if line.startswith("export "))


@pytest.mark.parametrize("value", HOSTILE)
def test_build_sh_exports_an_env_value_literally(value: str, tmp_path: Path) -> None:
    out = tmp_path / "recipes"
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11", "--env", f"FORGE_X={value}",
                 "--out", str(out)]) == 0
    exports = _exports((out / RECIPE / "build.sh").read_text())
    assert "FORGE_X" in exports
    work = tmp_path / "work"
    work.mkdir()
    shell = subprocess.run(["bash", "-c", exports + '\nprintf %s "$FORGE_X"'], cwd=work, capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/home/someone", "CPU_COUNT": "2",
                                           "PREFIX": "/p", "SRC_DIR": "/s", "RECIPE_DIR": "/r"})
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout == value
    assert not (work / "PWNED").exists()


def test_bld_bat_escapes_percent_and_windows_refuses_a_double_quote(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "recipes"
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11", "--platform", "win-64",
                 "--env", "FORGE_X=100%PATH%", "--out", str(out)]) == 0
    bat = next(out.glob("pytorch-*win_64")) / "bld.bat"
    assert 'set "FORGE_X=100%%PATH%%"' in bat.read_text()
    capsys.readouterr()
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11", "--platform", "win-64",
                 "--env", 'FORGE_X=say "hi"', "--out", str(tmp_path / "again")]) == 2
    assert '"' in capsys.readouterr().err and not (tmp_path / "again").exists()


@pytest.mark.parametrize("value", ["line\nbreak", "carriage\rreturn"])
def test_a_value_no_script_can_hold_on_one_line_is_refused(value: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--cuda", "cpu", "--py", "3.11", "--env", f"FORGE_X={value}", "--out", str(tmp_path / "r")]) == 2
    assert "FORGE_X" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_ci_files_keep_an_env_value_literal_and_github_refuses_its_expressions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for provider in ("github", "gitlab"):
        repo = tmp_path / provider
        assert main(["ci", provider, "--out", str(repo), "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11",
                     "--env", "FORGE_X=$(touch PWNED) $HOME"]) == 0
        text = next(p for p in repo.rglob("*.yml")).read_text()
        lines = [line for line in _run_lines(YAML(typ="safe").load(text)) if "torchforge build" in line]
        assert lines, text
        for line in lines:
            argv = shlex.split(line.split("&&")[-1])
            assert "FORGE_X=$(touch PWNED) $HOME" in argv, line
    capsys.readouterr()
    assert main(["ci", "github", "--out", str(tmp_path / "gh2"), "--cuda", "cpu", "--py", "3.11",
                 "--env", "FORGE_X=${{ secrets.TOKEN }}"]) == 2
    assert "${{" in capsys.readouterr().err and not (tmp_path / "gh2").exists()


def _run_lines(node: object) -> list[str]:
    if isinstance(node, dict):
        return [line for key, value in node.items() for line in
                ([value] if key == "run" and isinstance(value, str) else _run_lines(value))]
    if isinstance(node, list):
        return [line for item in node for line in ([item] if isinstance(item, str) else _run_lines(item))]
    return []
