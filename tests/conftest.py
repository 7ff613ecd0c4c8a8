from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.skips_allowed import ALLOWED_SKIPS, allowed, strict

REPO = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = REPO.parent / "shared" / "reference"
CACHE = REPO / ".cache" / "torchforge-tests"
TORCH = "2.13.0"
# Larger than every streaming loop's chunk many times over (copy 8 MiB, hash 1 MiB, quetz 1 MiB), so each
# loop iterates; incompressible, so the archive is really this big. Generated per session, never stored.
BIG_PAYLOAD_BYTES = 300 << 20
# The suite's builds are of kilobyte stand-ins (tests/fixtures/torch_like ...), not of a PyTorch: the preflight's
# disk row asks for the free space they need, not the data's 40 GiB estimate for a real one (a CI machine with 39
# GiB free failed 21 tests on that row alone). Set here, so every CLI subprocess inherits it; the disk row's own
# tests (tests/test_preflight.py) unset or raise it.
os.environ["TORCHFORGE_MIN_FREE_GIB"] = "1"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup` (make test): a test marked xdist_group runs on its group's one worker. pytest-xdist 3.8
    names it `ID@GROUP` by setting `item._nodeid`, which pytest 9 no longer reads (Node.nodeid is str(item._id)),
    so every group was spread over the workers (two torch-scatter builds at once, seen in `ps`); the same name,
    set where pytest 9 keeps it, after xdist's hook (a no-op where xdist's own took)."""
    if not config.getoption("loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")  # type: ignore[attr-defined]


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """TMPDIR for the whole session: a folder under pytest's basetemp, which pytest rotates away. py-rattler-build's
    Stage0Recipe.from_yaml leaves a `rattler_build_*` folder per parse in the temporary folder it sees at its first
    use in a process (set later, it is not read again), hundreds per run; they no longer pile up in /tmp."""
    folder = tmp_path_factory.mktemp("tmpdir")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", None)  # Python's own tempfile re-reads TMPDIR
        yield


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not SHARED_REFERENCE.is_dir():
        pytest.skip("../shared/reference is not beside this checkout")
    return SHARED_REFERENCE


def session_shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder that every xdist worker of this session shares and no later session sees: the session's own
    basetemp (pytest-N). Under xdist each worker's basetemp is pytest-N/popen-gwK; without it basetemp is pytest-N
    itself, and its parent (pytest-of-<user>) outlives the session. What tests build with torchforge's code is
    shared here, so it is rebuilt by each session's code, never reused from an older one."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def cached(name: str, build: Callable[[Path], None]) -> Path:
    """`CACHE/name`, built once by `build` across sessions and xdist workers (a lock, then a marker). Only for
    what no torchforge code makes (a downloaded wheel, a pip venv): see `session_shared` for the rest."""
    target = CACHE / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / f"{name}.lock")):
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            (target / ".complete").write_text("")
    return target


@pytest.fixture(scope="session")
def torch_wheel() -> Path:
    """The official torch CPU wheel, downloaded once into .cache/ (every test that needs it asks for it here,
    so order and parallelism never decide whether it is there)."""
    def download(dest: Path) -> None:
        subprocess.run([sys.executable, "-m", "pip", "download", f"torch=={TORCH}", "--no-deps", "-d", str(dest),
                        "--quiet"], check=True)

    wheels = sorted(cached(f"torch-{TORCH}-wheel", download).glob("torch-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session")
def big_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300 MiB stand-in with an official-style name (pytorch-2.13.0-py3.11_cpu_0.conda)."""
    from tests.pkgfactory import make_package

    out = tmp_path_factory.mktemp("big") / "linux-64"
    return make_package(out, name="pytorch", version=TORCH, build="py3.11_cpu_0", payload_bytes=BIG_PAYLOAD_BYTES)


# ------------------------------------------------------------------------------------------------ skips
# In CI (CI or TORCHFORGE_STRICT_SKIPS set; .ci/run sets it) a skip fails the run unless tests/skips_allowed.py
# lists it with the reason it cannot be helped: a toolkit bump must not silently drop the real CUDA builds.



def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_seen_skips: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _seen_skips.append((report.nodeid, _skip_reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _seen_skips.append((report.nodeid, _skip_reason(report)))


def _unexpected() -> list[tuple[str, str]]:
    return [(node, reason) for node, reason in _seen_skips if not allowed(node, reason)]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if strict() and _unexpected() and exitstatus == 0 and not hasattr(session.config, "workerinput"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    write = terminalreporter.write_line
    terminalreporter.section("skips allowed on these machines (tests/skips_allowed.py)")
    for pattern, why in ALLOWED_SKIPS:
        write(f"{pattern}: {why}")
    if not ALLOWED_SKIPS:
        write("(none)")
    unexpected = _unexpected()
    if unexpected:
        terminalreporter.section("skips NOT in tests/skips_allowed.py" + (" (fail the run: strict)" if strict() else ""))
        for node, reason in unexpected:
            write(f"{node}: {reason}")


@pytest.fixture()
def bundled_libraries(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding empty files under every name a CUDA recipe bundles into torch/lib (bundle.toml), and
    the recipes' folder variables (CUDNN_LIB_DIR ...) pointing at it, for checks that only look for them."""
    from torchforge import data as tables

    folder = tmp_path_factory.mktemp("bundled")
    data = tables.load()
    for rule in data.bundle.linux:
        for cuda in data.cuda.toolkits:
            for lib in rule.libs:
                (folder / lib.name.format(cuda=cuda, cuda_major=cuda.split(".")[0]).replace("*", "")).touch()
    for directory in data.bundle.linux_dirs.values():
        monkeypatch.setenv(directory.var, str(folder))
    return folder
