"""`torchforge repack` and `torchforge verify`: thin wrappers over torchforge.binaries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import Progress, TextColumn
from rich.table import Table

from torchforge.binaries.verify import PROBE_TIMEOUT_S
from torchforge.commands.options import nonempty_path
from torchforge.console import err, note, out
from torchforge.errors import AuditFailedError, UsageError
from torchforge.proc import Runner
from torchforge.sharedflags import check_build_number

if TYPE_CHECKING:
    from torchforge.binaries.plan import CudaLibs
    from torchforge.binaries.verify import Check


def default_wheel_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "torchforge" / "wheels"


def fetch_wheels(pytorch: str, cuda: str | None, python: str | None, with_: str, index_url: str | None,
           wheel_dir: Path) -> dict[Path, str]:
    from torchforge.binaries import fetch

    if python is None:
        raise UsageError("--pytorch needs --py X.Y: the Python the stack is for", "e.g. --py 3.12")
    request = fetch.Request(pytorch, python, cuda, fetch.parse_with(with_), index_url)
    fetch.requirements(request)  # checked before anything is said or created
    fetch.check_index(request)
    note(f"fetching torch {pytorch} for Python {python} into {wheel_dir}")
    fetched = fetch.download(request, wheel_dir, Runner(), on_line=lambda line: err.print(f"  {line}", markup=False))
    for path, url in fetched.items():
        note(f"{path.name}: from {fetch.origin(url)}")
    return fetched


def _check_cuda(cuda: str | None, got: str | None, source: str) -> None:
    """The build that came must be the one asked for; `source` says where pip took torch from."""
    if cuda is None or (cuda == "cpu" and got is None) or cuda == got:
        return
    served = f"CUDA {got}" if got else "the CPU build"
    tag = "cpu" if cuda == "cpu" else "cu" + cuda.replace(".", "")
    raise UsageError(f"{source} served {served} of torch, not {cuda}",
                     f"pass --wheel-index https://download.pytorch.org/whl/{tag} (or your mirror of it)"
                     + ("; pip took torch from its find-links: set PIP_FIND_LINKS= to leave that folder out"
                        if "find-links" in source else ""))


def _checked_repack_flags(wheels: list[Path] | None, cuda_libs: str, pytorch: str | None, fetch_flags: bool,
                          level: int | None, build_number: int) -> CudaLibs:
    """Refuse a combination of repack's flags before anything is fetched or read; the CUDA libraries' source."""
    from torchforge.binaries.plan import CudaLibs
    from torchforge.repack import check_zstd_level

    try:
        mode = CudaLibs(cuda_libs)
    except ValueError:
        raise UsageError(f"--cuda-libs {cuda_libs} is not a source of CUDA libraries",
                         "use conda-forge (the default) or wheels") from None
    if level is not None:
        check_zstd_level(level)
    check_build_number(build_number)
    if pytorch is None and fetch_flags:
        raise UsageError("--cuda, --py, --with and --wheel-index go with --pytorch", "add --pytorch X.Y.Z")
    if pytorch is None and not wheels:
        raise UsageError("no wheels given", "pass wheel files, or --pytorch X.Y.Z --py X.Y to fetch them")
    if pytorch is not None and wheels:
        raise UsageError("wheel files and --pytorch were both given", "pass one or the other")
    return mode


def register(app: typer.Typer) -> None:
    @app.command("repack")
    def repack_cmd(
        wheels: list[Path] = typer.Argument(None, help="Wheels of torch, torchvision, torchaudio, triton and the NVIDIA component wheels torch requires."),
        out_channel: Path = typer.Option(..., "--out", parser=nonempty_path, help="Local channel folder to publish into."),
        cuda_libs: str = typer.Option("conda-forge", "--cuda-libs", help="Where the CUDA libraries come from: conda-forge (run requirements on conda-forge's CUDA packages) or wheels (NVIDIA's component wheels repacked too)."),
        pytorch: str | None = typer.Option(None, "--pytorch", help="Fetch this torch release X.Y.Z with pip instead of taking wheel files."),
        cuda: str | None = typer.Option(None, "--cuda", help="With --pytorch: the CUDA build X.Y (or cpu) the index must serve."),
        python: str | None = typer.Option(None, "--py", "--python", help="With --pytorch: the Python X.Y."),
        with_: str = typer.Option("", "--with", help="With --pytorch: companions to fetch, e.g. torchvision,torchaudio (triton comes with a CUDA torch)."),
        index_url: str | None = typer.Option(None, "--wheel-index", help="With --pytorch: the index, e.g. https://download.pytorch.org/whl/cu126 (default: PyPI)."),
        wheel_dir: Path = typer.Option(None, "--wheel-dir", help="With --pytorch: where wheels are downloaded and kept (default: ~/.cache/torchforge/wheels)."),
        build_number: int = typer.Option(0, "--build-number", min=0, help="Build number (CUDA builds add 200)."),
        level: int | None = typer.Option(None, "--zstd-level", help="zstd level for .conda (default 10; 19 = cph default, ~18x slower)."),
        replace: bool = typer.Option(False, "--replace", help="Overwrite packages already in the channel."),
    ) -> None:
        """Convert official PyTorch wheels into one conda stack (pytorch, torchvision, torchaudio, triton) in a channel."""
        from torchforge.binaries.stack import repack_stack

        mode = _checked_repack_flags(wheels, cuda_libs, pytorch, bool(cuda or python or with_ or index_url),
                                     level, build_number)
        fetched = {} if wheels else fetch_wheels(pytorch or "", cuda, python, with_, index_url,
                                            wheel_dir or default_wheel_dir())
        paths = list(wheels) if wheels else list(fetched)
        if pytorch is not None:
            from torchforge.binaries import fetch
            from torchforge.binaries.stack import plan_wheels

            stack = plan_wheels(paths, mode, build_number)
            torch = next(p.wheel.path for p in stack.packages if p.wheel.project == "torch")
            _check_cuda(cuda, stack.cuda, fetch.origin(fetched[torch]))
        with Progress(TextColumn("{task.description}"), console=err, transient=True) as progress:
            task = progress.add_task("repacking")
            result = repack_stack(paths, out_channel, Runner(), mode=mode, build_number=build_number,
                                  zstd_level=level, replace_=replace,
                                  on_step=lambda name, s: progress.update(task, description=f"{name}: {s}"))
        for warning in result.plan.warnings:
            err.print(f"warning: {warning}", markup=False)
        if result.plan.ignored:
            note(f"--cuda-libs conda-forge: {len(result.plan.ignored)} NVIDIA component wheel(s) not needed "
                 "(their libraries come from conda-forge's packages)")
        for package in sorted(result.packages, key=lambda p: p.archive.name):
            how = "reused: already repacked from this wheel" if package.reused else f"{package.seconds:.1f} s"
            out.print(f"{package.archive}  ({package.size / 1e6:.1f} MB, {how})", markup=False)

    @app.command("verify")
    def verify_cmd(
        prefix: Path = typer.Argument(..., help="The conda environment to check."),
        python: Path | None = typer.Option(None, "--python", help="Interpreter to probe with (default: PREFIX/bin/python); the prefix's site-packages go first on its path."),
        want: str = typer.Option("auto", "--want", help="cuda, cpu or auto (cuda where an NVIDIA driver is present)."),
        timeout: float = typer.Option(PROBE_TIMEOUT_S, "--timeout", min=1, help="Seconds the probe may take before it is stopped."),
        gpu_arch: str | None = typer.Option(None, "--gpu-arch", help="The GPU's compute capability (e.g. 9.0) every installed package's CUDA code must run on (default: torch's GPU 0, else nvidia-smi's; none checked without a GPU)."),
        stack: Path | None = typer.Option(None, "--stack", dir_okay=False, help="A stack file: the prefix must hold exactly its lock's package files (missing, extra and different ones are named)."),
        stack_python: str | None = typer.Option(None, "--py", help="With --stack: the Python of the locked environment (default: the lock's only one)."),
    ) -> None:
        """Check an installed PyTorch environment: loads from the prefix, CUDA agrees and works, no foreign CUDA library."""
        from torchforge.binaries.devicecode import detected_gpu_arch, parse_gpu_arch
        from torchforge.binaries.verify import checks, cuda_arch_check, probe

        if want not in ("cuda", "cpu", "auto"):
            raise UsageError(f"--want {want} is not cuda, cpu or auto", "use --want cuda where a GPU build is required")
        given = parse_gpu_arch(gpu_arch, "--gpu-arch") if gpu_arch is not None else None
        runner = Runner()
        if stack_python is not None and stack is None:
            raise UsageError("--py goes with --stack", "give --stack FILE with it")
        # the lock first: a stack file or lock that is not there is refused before the probe runs
        lock_rows = _lock_checks(stack, stack_python, prefix) if stack is not None else []
        report = probe(prefix, python, runner, timeout)
        from torchforge.prefix import cuda_arch_seen

        found = [*checks(prefix, report, want, given or detected_gpu_arch(report, runner)),
                 cuda_arch_check(cuda_arch_seen()), *lock_rows]
        _print_verdict(prefix, found)


def _print_verdict(prefix: Path, found: list[Check]) -> None:
    """verify's table, then AuditFailedError naming each failed check."""
    table = Table(title=f"torchforge verify {prefix}")
    for column in ("check", "result", "detail"):
        table.add_column(column, overflow="fold")
    for check in found:
        table.add_row(check.name, "not run" if not check.ran else "ok" if check.ok else "[red]FAILED[/red]",
                      check.detail, style=None if check.ran else "dim")
    out.print(table)
    failed = [f"{c.name} (not so: {_short(c.detail)})" for c in found if not c.ok]
    if failed:
        raise AuditFailedError(f"{len(failed)} of {len(found)} checks failed: {'; '.join(failed)}",
                               "the table says what was found; docs/repack.md says what each check means")


def _short(detail: str, width: int = 100) -> str:
    """A failed row's detail on one line, cut (the table above has it whole)."""
    line = " ".join(detail.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _lock_checks(stack: Path, python: str | None, prefix: Path) -> list[Check]:
    """verify --stack: one row for the lock, naming every package of the prefix that is missing, extra or another
    file than the locked one."""
    from torchforge.binaries.verify import Check
    from torchforge.stackfile import load, lock
    from torchforge.stackfile.lockcheck import differences

    read = load.read(stack)
    env = lock.read(read.lock_path).environment(python, read.lock_path)
    found = differences(env, prefix)
    detail = "; ".join(map(str, found)) if found else f"exactly the {len(env.packages)} locked package files"
    return [Check(f"stack lock {read.lock_path.name}", not found, detail)]
