"""`torchforge upload --to anaconda://...` driving the REAL anaconda-client against a loopback fake API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tool_venvs
from tests.fixtures.fake_anaconda_server import FakeAnacondaServer
from tests.hostile import cases, hostile_package
from tests.pkgfactory import make_package
from tests.test_upload_helpers import cli
from torchforge.archives import inspect_archive

pytestmark = [pytest.mark.slow, pytest.mark.network_services]

TOKEN = "tf-secret-token-3f9a1c7e55"
BASENAME = "linux-64/hello-1.0-py3.11_cpu_0.conda"


@pytest.fixture(scope="session")
def anaconda_exe() -> str:
    return str(tool_venvs.ensure("anaconda") / "anaconda")


@pytest.fixture
def server() -> Iterator[FakeAnacondaServer]:
    with FakeAnacondaServer(TOKEN, login="tester") as srv:
        yield srv


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    return make_package(tmp_path / "out" / "linux-64", payload_bytes=200_000)


class Env:
    """Runs torchforge with a private HOME and TMPDIR, so every file the client writes is under tmp_path."""

    def __init__(self, tmp_path: Path, server: FakeAnacondaServer, anaconda_exe: str) -> None:
        self.tmp = tmp_path
        self.server = server
        (tmp_path / "home").mkdir(exist_ok=True)
        (tmp_path / "tmp").mkdir(exist_ok=True)
        self.env = {
            "HOME": str(tmp_path / "home"),
            "TMPDIR": str(tmp_path / "tmp"),
            "TORCHFORGE_ANACONDA": anaconda_exe,
            "ANACONDA_API_TOKEN": TOKEN,
        }
        self.outputs: list[str] = []

    def upload(self, *args: str, token: str | None = TOKEN, extra: dict[str, str] | None = None):  # noqa: ANN201
        env = {**self.env, **(extra or {})}
        if token is None:
            env["ANACONDA_API_TOKEN"] = ""
        else:
            env["ANACONDA_API_TOKEN"] = token
        result = cli(*args, env=env)
        self.outputs.append(result.stdout + result.stderr)
        return result

    def to(self) -> list[str]:
        return ["--to", "anaconda://tester", "--api-url", self.server.url]

    def assert_token_never_leaked(self) -> None:
        for text in self.outputs:
            assert TOKEN not in text
        for path in self.tmp.rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path


@pytest.fixture
def env(tmp_path: Path, server: FakeAnacondaServer, anaconda_exe: str) -> Iterator[Env]:
    e = Env(tmp_path, server, anaconda_exe)
    yield e
    e.assert_token_never_leaked()


def test_success_with_labels_and_verification(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    result = env.upload("upload", str(pkg), *env.to(), "--label", "rc", "--label", "main")
    assert result.returncode == 0, result.stderr
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None
    local = inspect_archive(pkg)
    assert (dist.sha256, dist.size, dist.labels) == (local.sha256, local.size, ["rc", "main"])
    assert "hello-1.0-py3.11_cpu_0.conda" in result.stdout and "uploaded" in result.stdout
    assert f"verified: listed tester/hello/1.0/{BASENAME} sha256 {local.sha256[:12]}" in result.stdout
    # The command is shown with the token masked; telemetry is off; the token is not on the command line.
    shown = next(line for line in result.stderr.splitlines() if line.startswith("$ ") and " upload " in line)
    assert "BINSTAR_API_TOKEN=***" in shown and "OTEL_SDK_DISABLED=true" in shown
    assert "--label rc --label main" in shown and "-t " not in shown
    assert all(ok for (_m, p, _s, ok) in server.requests() if not p.startswith("/storage/"))


def test_bad_token_is_not_retried_and_names_the_variable(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    result = env.upload("upload", str(pkg), *env.to(), token="not-the-token")
    assert result.returncode == 7
    assert "refused the token from $ANACONDA_API_TOKEN" in result.stderr
    assert "set $ANACONDA_API_TOKEN" in result.stderr
    assert len(server.requests("HEAD", "^/$")) == 1  # one attempt only
    assert "not-the-token" not in result.stdout + result.stderr


def test_missing_token_fails_before_contacting_the_server(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    result = env.upload("upload", str(pkg), *env.to(), token=None)
    assert result.returncode == 7
    assert "no anaconda.org token" in result.stderr and "$ANACONDA_API_TOKEN" in result.stderr
    assert server.requests() == []


def test_existing_file_fail_skip_force(env: Env, server: FakeAnacondaServer, pkg: Path, tmp_path: Path) -> None:
    assert env.upload("upload", str(pkg), *env.to()).returncode == 0

    # The same bytes again (a rerun after an interruption): the server's copy is checked, nothing fails.
    again = env.upload("upload", str(pkg), *env.to())
    assert again.returncode == 0, again.stderr
    assert "identical" in again.stdout

    rebuilt = make_package(tmp_path / "rebuilt" / "linux-64", payload_bytes=100_000)
    refused = env.upload("upload", str(rebuilt), *env.to())
    assert refused.returncode == 7
    assert "already exists" in refused.stderr and "--skip-existing" in refused.stderr

    skipped = env.upload("upload", str(rebuilt), *env.to(), "--skip-existing")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped" in skipped.stdout

    forced = env.upload("upload", str(rebuilt), *env.to(), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "replaced" in forced.stdout
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.sha256 == inspect_archive(rebuilt).sha256
    assert len(server.requests("DELETE", "^/dist/")) == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "^/stage/"), ("POST", "^/storage/"), ("POST", "^/commit/")],
    ids=["stage", "storage", "commit"],
)
def test_server_error_then_success(env: Env, server: FakeAnacondaServer, pkg: Path, method: str, path: str) -> None:
    server.fail(method, path, 503 if path == "^/commit/" else 500)
    result = env.upload("upload", str(pkg), *env.to())
    assert result.returncode == 0, result.stderr
    assert "retrying" in result.stderr
    assert [s for (_m, _p, s, _a) in server.requests(method, path)][:2] in ([500, 200], [503, 200], [500, 201])
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.sha256 == inspect_archive(pkg).sha256


def test_connection_dropped_mid_upload(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    server.drop("POST", "^/storage/")
    result = env.upload("upload", str(pkg), *env.to())
    assert result.returncode == 0, result.stderr
    assert "Connection aborted" in result.stderr and "retrying" in result.stderr
    statuses = [s for (_m, _p, s, _a) in server.requests("POST", "^/storage/")]
    assert statuses == [0, 201]  # 0: the dropped one
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.sha256 == inspect_archive(pkg).sha256


def test_a_package_of_many_chunks_goes_whole_with_the_digests_the_service_checks(
        env: Env, server: FakeAnacondaServer, tmp_path: Path) -> None:
    """anaconda-client's staged upload: POST /stage with the file's sha256, one multipart POST of the file to the
    storage URL (read from disk in pieces of 8 KiB) with its Content-MD5 and Content-Length, then POST /commit.
    A file of megabytes arrives whole: the storage's MD5 and length checks and the commit's sha256 check pass."""
    big = make_package(tmp_path / "big" / "linux-64", payload_bytes=(3 << 20) + 4321)
    result = env.upload("upload", str(big), *env.to())
    assert result.returncode == 0, result.stderr
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.size == big.stat().st_size > 3 << 20 and dist.data == big.read_bytes()
    assert [s for (_m, _p, s, _a) in server.requests("POST", "^/storage/")] == [201]


@pytest.mark.parametrize(("where", "refusal"), [("transfer", "BinstarError: ('Error uploading package!', 400)"),
                                                ("storage", "sha256 mismatch: staged")])
def test_a_damaged_upload_is_refused_nothing_is_listed_and_a_rerun_sends_it_whole(
        env: Env, server: FakeAnacondaServer, pkg: Path, where: str, refusal: str) -> None:
    """One byte changed on the way (the storage's MD5 check refuses it: S3's BadDigest) or once stored (the commit
    compares the sha256 the client staged): the upload fails (exit 7) and the service lists nothing."""
    server.damage(where)
    result = env.upload("upload", str(pkg), *env.to())
    assert result.returncode == 7, result.stdout + result.stderr
    assert refusal in result.stderr, result.stderr
    assert server.dist("tester", "hello", "1.0", BASENAME) is None
    again = env.upload("upload", str(pkg), *env.to())
    assert again.returncode == 0, again.stderr
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.sha256 == inspect_archive(pkg).sha256 and dist.data == pkg.read_bytes()


def test_persistent_server_error_gives_up(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    for _ in range(4):
        server.fail("POST", "^/stage/", 502)
    result = env.upload("upload", str(pkg), *env.to())
    assert result.returncode == 7
    assert "gave up after 4 attempts" in result.stderr
    assert len(server.requests("POST", "^/stage/")) == 4
    assert server.dist("tester", "hello", "1.0", BASENAME) is None


def test_named_target_token_env_and_promote(env: Env, server: FakeAnacondaServer, pkg: Path, tmp_path: Path) -> None:
    channels = tmp_path / "channels"
    channels.mkdir()
    (channels / "team.toml").write_text(
        f'kind = "anaconda"\nowner = "tester"\napi_url = "{server.url}"\nlabels = ["rc"]\ntoken_env = "TEAM_TOKEN"\n'
    )
    named = ["--to", "team", "--channels-dir", str(channels)]
    up = env.upload("upload", str(pkg), *named, token=None, extra={"TEAM_TOKEN": TOKEN})
    assert up.returncode == 0, up.stderr
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.labels == ["rc"]

    copy = env.upload("promote", *named, "--from-label", "rc", "--label", "main", "hello/1.0",
                      token=None, extra={"TEAM_TOKEN": TOKEN})
    assert copy.returncode == 0, copy.stderr
    assert f"copied: {BASENAME} rc -> main" in copy.stdout
    assert dist.labels == ["rc", "main"]

    need_version = env.upload("promote", *named, "--from-label", "rc", "hello", extra={"TEAM_TOKEN": TOKEN})
    assert need_version.returncode == 2 and "NAME/VERSION" in need_version.stderr

    move = env.upload("promote", *named, "--from-label", "rc", "--label", "stable", "--move", "hello/1.0",
                      token=None, extra={"TEAM_TOKEN": TOKEN})
    assert move.returncode == 0, move.stderr
    assert f"moved: {BASENAME} rc -> stable" in move.stdout
    assert sorted(dist.labels) == ["main", "stable"]


@pytest.mark.parametrize("label", ["../../../ESCAPED", "..", "rc/../../main", "rc\n"])
def test_a_hostile_label_is_refused_before_the_client_runs(env: Env, server: FakeAnacondaServer, pkg: Path,
                                                            label: str) -> None:
    """Labels become path parts of the client's API URLs: the label rule refuses them first (exit 2)."""
    server.add_dist("tester", "hello", "1.0", BASENAME, pkg.read_bytes(), ["rc"])
    for argv in (("upload", str(pkg), *env.to(), "--label", label),
                 ("promote", *env.to(), "--from-label", label, "--label", "main", "--move", "hello/1.0"),
                 ("promote", *env.to(), "--from-label", "rc", "--label", label, "hello/1.0")):
        result = env.upload(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert "is not a valid label" in result.stderr and "letters, digits" in result.stderr
    assert server.requests() == []
    dist = server.dist("tester", "hello", "1.0", BASENAME)
    assert dist is not None and dist.labels == ["rc"]


def test_dry_run_shows_masked_command_and_sends_nothing(env: Env, server: FakeAnacondaServer, pkg: Path) -> None:
    result = env.upload("upload", str(pkg), *env.to(), "--label", "main", "--force", "--dry-run")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("[dry-run] "))
    assert "BINSTAR_API_TOKEN=***" in line and "OTEL_SDK_DISABLED=true" in line
    assert line.endswith(f"upload --user tester --label main --no-progress --force {pkg}")
    assert server.requests() == []


@pytest.mark.parametrize("case_id", ["dotdot", "symlink", "device"])
def test_a_package_with_a_member_outside_its_prefix_is_refused_before_sending(
        case_id: str, env: Env, server: FakeAnacondaServer, tmp_path: Path) -> None:
    case = {c.id: c for c in cases(tmp_path / "victim.txt", tmp_path / "outside")}[case_id]
    package = hostile_package(tmp_path / "hostile" / "linux-64", case.members)
    result = env.upload("upload", str(package), *env.to())
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{package}: member '{case.refused}' {case.why}" in " ".join(result.stderr.split())
    assert server.requests() == []  # not even the login check: nothing was sent
