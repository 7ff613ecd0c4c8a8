"""One label rule (torchforge/labels.py) at every entry point: hostile labels against a real folder channel.

Each command runs as a user runs it (a child process, the real exit code). The channel sits two folders deep
beside a victim channel; after every refused command the whole tree, bytes included, is as it was: nothing
written above the channel, nothing deleted from the victim.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.test_upload_helpers import ROOT, cli, cli_env

pytestmark = pytest.mark.slow

# The two of issue 34 (one escapes upwards, one reaches a sibling channel), then every other way out.
# "{tmp}/abs" becomes an absolute path inside the test's folder, so the snapshot sees a write there.
HOSTILE = ("../../../ESCAPED", "../../../../victimchan", "..", "rc/../../..", "{tmp}/abs", "rc\n", "")


class World:
    """tmp/a/b/chan with `hello` in label rc, and tmp/victimchan with `victim` in main."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.chan = tmp / "a" / "b" / "chan"
        self.victim = tmp / "victimchan"
        make_package(tmp / "out" / "linux-64", name="hello")
        make_package(tmp / "victim-out" / "linux-64", name="victim")
        for args in (("--from", str(tmp / "out"), "--to", self.chan.as_uri(), "--label", "rc"),
                     ("--from", str(tmp / "victim-out"), "--to", self.victim.as_uri())):
            done = cli("upload", *args, "--no-verify")
            assert done.returncode == 0, done.stderr
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, str]:
        """Every path under tmp and the sha256 of every file: a write, a delete or a new folder shows."""
        return {str(p.relative_to(self.tmp)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
                for p in sorted(self.tmp.rglob("*"))}

    def refused(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = cli(*(arg.replace("{tmp}", str(self.tmp)) for arg in args), env=env)
        assert result.returncode == 2, (args, result.returncode, result.stdout, result.stderr)
        assert "is not a valid label" in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "letters, digits" in result.stderr  # what would work
        assert self.snapshot() == self.before, args
        assert (self.victim / "linux-64" / "victim-1.0-py3.11_cpu_0.conda").is_file()
        return result


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.mark.parametrize("label", HOSTILE)
def test_promote_refuses_a_hostile_label_and_touches_nothing(world: World, label: str) -> None:
    to = ("--to", world.chan.as_uri())
    world.refused("promote", *to, "--from-label", "rc", "--label", label)
    world.refused("promote", *to, "--from-label", label, "--label", "main", "--move")
    world.refused("promote", *to, "--from-label", label, "--label", "main", "--move", "--dry-run")


@pytest.mark.parametrize("label", HOSTILE)
def test_upload_refuses_a_hostile_label_and_touches_nothing(world: World, label: str) -> None:
    world.refused("upload", "--from", str(world.tmp / "out"), "--to", world.chan.as_uri(), "--label", label)


def _named(world: World, label: str) -> Path:
    """channels/team.toml: the folder channel with `label` in its labels (a TOML basic string keeps \\n)."""
    channels = world.tmp.parent / f"{world.tmp.name}-channels"
    channels.mkdir(exist_ok=True)
    escaped = label.replace("{tmp}", str(world.tmp)).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    (channels / "team.toml").write_text(f'kind = "directory"\nurl = "{world.chan.as_uri()}"\nlabels = ["{escaped}"]\n')
    return channels


@pytest.mark.parametrize("label", ["../../../ESCAPED", "..", "rc\n", "{tmp}/abs"])
def test_a_named_target_with_a_hostile_label_is_refused_by_every_command(world: World, label: str) -> None:
    channels = str(_named(world, label))
    world.refused("channels", "--channels-dir", channels)
    world.refused("upload", "--from", str(world.tmp / "out"), "--to", "team", "--channels-dir", channels)
    world.refused("promote", "--to", "team", "--channels-dir", channels, "--from-label", "rc")
    out = world.tmp.parent / f"{world.tmp.name}-ci"
    world.refused("ci", "github", "--cuda", "cpu", "--py", "3.12", "--upload-to", "team", "--out", str(out),
                  env={"TORCHFORGE_CHANNELS_DIR": channels})
    assert not out.exists()


def test_ci_refuses_a_staging_label_that_is_not_a_label(tmp_path: Path) -> None:
    """data/ci.toml's staging label goes through the same rule; a bad one is a data error (exit 3), before
    anything is written. The package is copied so the table can be changed without touching the checkout."""
    package = tmp_path / "pkg" / "torchforge"
    shutil.copytree(ROOT / "torchforge", package, ignore=shutil.ignore_patterns("__pycache__"))
    # `ci` plans the recipes it writes jobs for, which renders them: the templates beside the package, as in a checkout
    shutil.copytree(ROOT / "recipe_templates", package.parent / "recipe_templates")
    table = package / "data" / "ci.toml"
    text = table.read_text()
    assert 'staging_label = "staging"' in text
    table.write_text(text.replace('staging_label = "staging"', 'staging_label = "../../ESCAPED"'))
    out = tmp_path / "ci"
    env = cli_env()
    env["PYTHONPATH"] = str(tmp_path / "pkg")
    result = subprocess.run([sys.executable, "-m", "torchforge.cli", "ci", "gitlab", "--cuda", "cpu", "--py", "3.12",
                             "--upload-to", (tmp_path / "chan").as_uri(), "--out", str(out)],
                            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "staging_label" in result.stderr and "is not a valid label" in result.stderr
    assert not out.exists() and not (tmp_path / "chan").exists() and not (tmp_path / "ESCAPED").exists()


@pytest.mark.parametrize("label", ["main", "rc", "dev-2", "gcc7", "py3.11_cpu"])
def test_ordinary_labels_still_promote(world: World, label: str) -> None:
    """The rule refuses only what is not a label: real names still reach their folder."""
    done = cli("promote", "--to", world.chan.as_uri(), "--from-label", "rc", "--label", label)
    if label == "rc":
        assert done.returncode == 2 and "is also a --label" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    dest = world.chan if label == "main" else world.chan / "label" / label
    assert (dest / "linux-64" / "hello-1.0-py3.11_cpu_0.conda").is_file()


def test_a_label_given_twice_is_one_label(world: World, tmp_path: Path) -> None:
    """`-l main -l main` uploads to main once and says so once (it printed "main, main")."""
    make_package(tmp_path / "again" / "linux-64", name="again")
    done = cli("upload", "--from", str(tmp_path / "again"), "--to", world.chan.as_uri(), "-l", "main", "-l", "rc",
               "-l", "main", "--no-verify")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "label(s) main, rc" in said and "main, rc, main" not in said, said
    assert (world.chan / "linux-64" / "again-1.0-py3.11_cpu_0.conda").is_file()
