"""Builds sized to memory (torchforge/buildmemory.py, stepjobs.py): the memory a cgroup allows, each package's
per-job peak from the data, the peak memory the runner measures, and a build held to a memory limit it cannot fit
(prlimit --as, which needs no privileges) reported as out of memory, its rerun planning fewer jobs."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.test_compile_cache import TORCH_LIKE, offline, stubs  # noqa: F401 (stubs: the stand-in channel fixture)
from torchforge.buildmemory import (
    Kill, after_kill, available_memory, cgroup_free_gib, memory_failure, read_mem_available_gib, recorded_kills,
)
from torchforge.diagnose import explain_log
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.errors import ToolFailedError, ToolMissingError
from torchforge.pipeline import Pipeline, StepResult
from torchforge.preflight.table import choose_max_jobs, load_table, per_job_gib
from torchforge.proc import Command, Runner
from torchforge.flavours.official.render import plan
from torchforge.sequence import official_steps
from torchforge.flavours.official.variant import Options, Selection

GIB = 1024**3
# Address space g++ 12 needs to compile torch_like.cpp: it fails under 70 MB ("out of memory allocating") and
# passes at 90 MB (seen by hand, tests/fixtures/failures/compiler-out-of-memory.log).
TOO_LITTLE = 60_000_000


def _cgroup_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def test_a_v2_limit_counts_and_max_is_no_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/ci.slice/job-7\n")
    root = _cgroup_tree(tmp_path / "fs", {"ci.slice/job-7/memory.max": "max\n", "ci.slice/job-7/memory.current": f"{GIB}\n",
                                           "ci.slice/memory.max": f"{16 * GIB}\n", "ci.slice/memory.current": f"{4 * GIB}\n"})
    free, where = cgroup_free_gib(proc, root)  # type: ignore[misc]
    assert free == pytest.approx(12.0) and "ci.slice " in where + " " and "16.0 GiB limit" in where
    (root / "ci.slice" / "memory.max").write_text("max\n")
    assert cgroup_free_gib(proc, root) is None


def test_a_v1_limit_counts_and_its_no_limit_value_does_not(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/docker/abc\n0::/\n")
    root = _cgroup_tree(tmp_path / "fs", {"memory/docker/abc/memory.limit_in_bytes": f"{8 * GIB}\n",
                                           "memory/docker/abc/memory.usage_in_bytes": f"{3 * GIB}\n",
                                           "memory/memory.limit_in_bytes": "9223372036854771712\n",
                                           "memory/memory.usage_in_bytes": f"{40 * GIB}\n"})
    assert cgroup_free_gib(proc, root) == (pytest.approx(5.0), f"cgroup {root}/memory/docker/abc (8.0 GiB limit)")
    (root / "memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_free_gib(proc, root) is None


def test_the_tighter_of_the_cgroup_and_memavailable_is_used(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemAvailable:   33554432 kB\n")  # 32 GiB
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    root = _cgroup_tree(tmp_path / "fs", {"job/memory.max": f"{10 * GIB}\n", "job/memory.current": f"{2 * GIB}\n"})
    memory = available_memory(meminfo, proc, root)
    assert memory.gib == pytest.approx(8.0) and memory.basis.startswith("8.0 GiB free in cgroup ")
    (root / "job" / "memory.max").write_text(f"{100 * GIB}\n")
    assert available_memory(meminfo, proc, root).basis == "32.0 GiB available"
    here = available_memory()  # this machine: never more than MemAvailable
    assert here.gib is not None and here.gib <= (read_mem_available_gib() or 0) + 0.5


def test_each_measured_package_gets_its_own_budget_and_fewer_jobs_fit_for_a_heavier_one() -> None:
    table = load_table()
    assert per_job_gib("mamba-ssm", cuda=True) == (6.1, table.jobs.packages["mamba-ssm"].source)
    assert per_job_gib("vision-kernels", cuda=True)[0] == table.jobs.gib_per_job_cuda
    jobs = {name: choose_max_jobs(16, 120.0, cuda=True, per_job=per_job_gib(name, cuda=True)[0])
            for name in ("causal-conv1d", "mamba-ssm", "flash-attn")}
    assert jobs == {"causal-conv1d": 14, "mamba-ssm": 14, "flash-attn": 5}  # 16 - 2 cores; 118 / 20 GiB


def test_the_runner_measures_the_peak_of_a_grandchild() -> None:
    script = "b = bytearray(300 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"
    result = Runner().run(Command(("sh", "-c", f'"{sys.executable}" -c "{script}"; true'), measure_peak=True))
    assert result.peak_rss_kib > 300 * 1024
    # This process holds more than 100 MB (the 300 MB block below makes sure of it, wherever the test runs):
    # a direct child's ru_maxrss would count it, the launcher's child does not (CI measured 433288 KiB for `true`).
    ballast = bytearray(300 * 1024 * 1024)
    ballast[::4096] = b"x" * len(ballast[::4096])
    small = Runner().run(Command(("true",), measure_peak=True))
    assert 0 < small.peak_rss_kib < 100 * 1024, small
    del ballast


def test_a_measured_command_keeps_its_exit_status_output_signal_and_missing_tool_error(tmp_path: Path) -> None:
    failed = Runner().run(Command(("sh", "-c", "echo out; echo err >&2; exit 7"), measure_peak=True), check=False)
    assert (failed.returncode, failed.output, failed.peak_rss_kib > 0) == (7, "out\nerr\n", True)
    killed = Runner().run(Command(("sh", "-c", "kill -TERM $$"), measure_peak=True), check=False)
    assert killed.returncode == -signal.SIGTERM
    with pytest.raises(ToolMissingError, match="cannot run `no-such-tool-here`"):
        Runner().run(Command(("no-such-tool-here",), measure_peak=True))


def test_a_compile_held_to_too_little_memory_is_out_of_memory_and_the_status_alone_counts_too(tmp_path: Path) -> None:
    compiler = shutil.which("g++")
    if compiler is None or shutil.which("prlimit") is None:
        pytest.skip("needs g++ and prlimit (util-linux)")
    log = tmp_path / "build.log"
    with pytest.raises(ToolFailedError) as failed:
        Runner().run(Command(("prlimit", f"--as={TOO_LITTLE}", "--", compiler, "-O3", "-std=c++17", "-c",
                              str(TORCH_LIKE / "csrc" / "torch_like.cpp"), "-o", str(tmp_path / "a.o"))), log_file=log)
    found = tuple(d.id for d in explain_log(log))
    assert found == ("compiler-out-of-memory",)
    assert memory_failure(failed.value.returncode, found) is not None
    assert memory_failure(1, ("internal-compiler-error",)) is None  # a crash that is not memory
    assert memory_failure(137, ()) is not None and memory_failure(143, ()) is not None
    assert memory_failure(2, ()) is None


def test_a_rerun_plans_half_the_jobs_of_the_killed_build_and_says_so() -> None:
    kill = Kill(8, "its log says the compilers ran out of memory (compiler-killed)")
    assert after_kill(14, kill) == (4, f"its last build was killed for memory with MAX_JOBS 8 ({kill.why}): "
                                       "this build plans MAX_JOBS 4")
    assert after_kill(2, kill)[0] == 2  # memory and cores allow fewer already
    assert after_kill(14, None) == (14, "")
    assert after_kill(6, Kill(1, "x"))[0] == 1


def _torch_like(out: Path, channel: Path, cc: str | None, *, sized: bool) -> StepResult:
    """sized=False: `--jobs 4` given; True: --jobs left out (preflight's MAX_JOBS, then sized per build)."""
    extra = (("CC", cc),) if cc else ()
    sel = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(source=str(TORCH_LIKE), extra_env=extra))
    engine = RattlerBuildEngine()
    settings = offline(out, channel, force=True, use_cache=False, size_jobs=sized, extra_env={"MAX_JOBS": "4"})
    (result,) = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(sel), engine, settings))
                 if r.step.kind == "pytorch"]
    return result


@pytest.mark.slow
def test_a_build_that_cannot_fit_its_memory_limit_is_reported_and_its_rerun_plans_fewer_jobs(
        stubs: Path, tmp_path: Path) -> None:  # noqa: F811
    """torch_like's setuptools compile held by prlimit to an address space g++ cannot fit: the build fails as out
    of memory (its log, explain, the error), the kill is recorded, and the rerun plans fewer jobs and says so."""
    compiler = shutil.which("gcc")
    if compiler is None or shutil.which("prlimit") is None:
        pytest.skip("needs gcc and prlimit (util-linux)")
    out = tmp_path / "channel"
    killed = _torch_like(out, stubs, f"prlimit --as={TOO_LITTLE} {compiler}", sized=False)
    assert not killed.ok and killed.log is not None
    assert "compiler-out-of-memory" in {d.id for d in explain_log(killed.log)}
    assert killed.jobs == 4 and "out of memory with MAX_JOBS 4: " in killed.error
    assert "the rerun plans MAX_JOBS 2" in killed.error
    assert recorded_kills(out)["pytorch"].jobs == 4
    rerun = _torch_like(out, stubs, None, sized=True)
    assert rerun.ok, rerun.error
    assert rerun.jobs is not None and rerun.jobs <= 2
    log = rerun.log.read_text()  # type: ignore[union-attr]
    assert "its last build was killed for memory with MAX_JOBS 4" in log
    assert f"this build plans MAX_JOBS {rerun.jobs}" in log
    assert "torchforge: peak memory " in log and rerun.peak_rss_kib > 0
