"""Target URLs, channels/*.toml files and token lookup."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from tests.test_upload_helpers import ROOT, cli
from torchforge.errors import UsageError
from torchforge.targets import TargetKind, find_token, load_all, load_file, parse_url, resolve


def test_url_forms() -> None:
    d = parse_url("file:///srv/chan")
    assert (d.kind, d.path, d.labels) == (TargetKind.DIRECTORY, Path("/srv/chan"), ("main",))
    a = parse_url("anaconda://my-org", labels=("rc", "main"))
    assert (a.kind, a.owner, a.labels, a.token_vars) == (TargetKind.ANACONDA, "my-org", ("rc", "main"),
                                                         ("ANACONDA_API_TOKEN",))
    q = parse_url("quetz+http://127.0.0.1:8000/torch")
    assert (q.kind, q.base_url, q.channel, q.token_vars) == (TargetKind.QUETZ, "http://127.0.0.1:8000", "torch",
                                                             ("QUETZ_API_KEY",))
    assert q.url == "quetz+http://127.0.0.1:8000/torch"


@pytest.mark.parametrize(
    ("text", "hint_part"),
    [
        ("file://relative/chan", "file:///absolute"),
        ("/srv/chan", "file:///srv/chan"),
        ("anaconda://", "anaconda://OWNER"),
        ("quetz+http://host:1/", "quetz+http://HOST:PORT/CHANNEL"),
        ("s3://bucket/x", "file:///"),
    ],
)
def test_bad_urls_say_what_would_work(text: str, hint_part: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve(text, channels_dir=Path("/nonexistent"))
    assert hint_part in (info.value.hint or "")


def test_bad_label() -> None:
    with pytest.raises(UsageError, match="not a valid label"):
        parse_url("anaconda://x", labels=("has space",))


def test_repository_channel_files_load() -> None:
    targets = load_all(ROOT / "channels")
    assert "local" in targets and targets["local"].kind is TargetKind.DIRECTORY
    kinds = {t.kind for t in targets.values()}
    assert kinds == {TargetKind.DIRECTORY, TargetKind.ANACONDA, TargetKind.QUETZ}
    for path in (ROOT / "channels").glob("*.toml"):
        text = path.read_text()
        assert "token =" not in text.replace("token_env =", "")


def test_unknown_key_rejected_with_allowed_keys(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_text('kind = "anaconda"\nowner = "x"\nlabel = ["main"]\n')
    with pytest.raises(UsageError) as info:
        load_file(tmp_path / "team.toml")
    assert "label: unknown key" in info.value.message
    assert "labels" in (info.value.hint or "")


def test_token_in_file_refused(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_text('kind = "anaconda"\nowner = "x"\ntoken = "abc"\n')
    with pytest.raises(UsageError) as info:
        load_file(tmp_path / "team.toml")
    assert "token_env" in (info.value.hint or "")


def test_named_target_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_text(
        'kind = "anaconda"\nowner = "team"\nlabels = ["rc"]\ntoken_env = "TEAM_TOKEN"\n'
    )
    t = resolve("team", channels_dir=tmp_path)
    assert (t.owner, t.labels, t.token_vars) == ("team", ("rc",), ("TEAM_TOKEN", "ANACONDA_API_TOKEN"))
    t2 = resolve("team", channels_dir=tmp_path, labels=("main",), api_url="http://127.0.0.1:9/api/")
    assert (t2.labels, t2.api_url) == (("main",), "http://127.0.0.1:9/api")
    with pytest.raises(UsageError, match="no target named 'other'") as info:
        resolve("other", channels_dir=tmp_path)
    assert "team" in (info.value.hint or "")
    with pytest.raises(UsageError, match="anaconda:// targets only"):
        resolve("file:///x", api_url="http://127.0.0.1:9")


def test_token_lookup_order_and_repr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "team.toml").write_text('kind = "quetz"\nurl = "http://h:1/c"\ntoken_env = "TEAM_KEY"\n')
    t = resolve("team", channels_dir=tmp_path)
    # Without the keyring package, nothing else holds a token; with one, its answer is used: both on any machine
    # (a stand-in module for the keyring, whether or not this machine has the package).
    monkeypatch.setitem(sys.modules, "keyring", None)  # `import keyring` raises ImportError
    assert find_token(t, env={}) is None
    stored = {("torchforge", "team"): "from-the-keyring"}
    monkeypatch.setitem(sys.modules, "keyring", types.SimpleNamespace(get_password=lambda s, u: stored.get((s, u))))
    held = find_token(t, env={})
    assert held is not None and (held.value, held.source) == ("from-the-keyring", "keyring torchforge/team")
    cred = find_token(t, env={"QUETZ_API_KEY": "generic", "TEAM_KEY": "specific-secret"})
    assert cred is not None and cred.value == "specific-secret" and cred.source == "$TEAM_KEY"
    assert "specific-secret" not in repr(cred) and "specific-secret" not in str(cred)
    cred2 = find_token(t, env={"QUETZ_API_KEY": "generic"})
    assert cred2 is not None and cred2.source == "$QUETZ_API_KEY"


def test_channels_command_lists_targets_never_tokens(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_text(
        'kind = "anaconda"\nowner = "team"\ntoken_env = "TEAM_TOKEN"\ndescription = "the team"\n'
    )
    (tmp_path / "disk.toml").write_text('kind = "directory"\nurl = "file:///srv/c"\n')
    result = cli("channels", "--channels-dir", str(tmp_path), env={"TEAM_TOKEN": "tok-very-secret-123"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "kind", "where"]
    team = next(line for line in lines if line.startswith("team"))
    assert "anaconda://team" in team and "$TEAM_TOKEN(set)" in team and "the team" in team
    assert any(line.startswith("disk") and "file:///srv/c" in line for line in lines)
    assert "tok-very-secret-123" not in result.stdout + result.stderr


def test_channels_command_reports_bad_file(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('kind = "ftp"\n')
    result = cli("channels", "--channels-dir", str(tmp_path))
    assert result.returncode == 2
    assert "bad.toml is not a valid target" in result.stderr


def test_a_channels_file_that_is_not_utf8_is_bad_input_naming_file_and_byte(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_bytes('kind = "anaconda"\nowner = "team"\ndescription = "café"\n'.encode("latin-1"))
    result = cli("channels", "--channels-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'team.toml'} is not UTF-8 text: byte 51 (line 3) is 0xe9" in result.stderr
    assert "internal error" not in result.stderr


def test_a_config_file_that_is_not_utf8_is_bad_input_naming_file_and_byte(tmp_path: Path) -> None:
    config = tmp_path / "torchforge.toml"
    config.write_bytes(b'# \xff\n[channels]\nreplace = ["file:///srv/c"]\n')
    result = cli("build", "--dry-run", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert f"{config} is not UTF-8 text: byte 2 (line 1) is 0xff" in result.stderr
    assert "save it as UTF-8" in result.stderr


def test_outside_the_checkout_no_example_target_is_used(tmp_path: Path) -> None:
    """A folder without channels/ has no named targets: the checkout's examples (/srv/conda/torchforge) are not
    a fallback."""
    listed = cli("channels", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert f"no named targets in {tmp_path / 'channels'}" in " ".join(listed.stderr.split())
    assert "/srv/conda" not in listed.stdout + listed.stderr
    (tmp_path / "out" / "linux-64").mkdir(parents=True)
    upload = cli("upload", "--from", str(tmp_path / "out"), "--to", "local", cwd=tmp_path)
    assert upload.returncode == 2, upload.stderr
    assert f"no target named 'local' in {tmp_path / 'channels'}" in " ".join(upload.stderr.split())
    assert "named targets: none" in upload.stderr
