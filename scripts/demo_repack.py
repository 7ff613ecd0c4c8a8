"""`make demo-repack`: fetch one torch wheel, repack it, audit the package repack wrote, install it, import it.

    python scripts/demo_repack.py --torch 2.13.0 --cpu-index URL --work .cache/demo --out forge-channel
    python scripts/demo_repack.py ... --plan    # only say which wheel would come from where (no download)

PyTorch's CPU index is asked first: its wheel is the CPU build (~190 MB). Where that index cannot be reached or
has no such wheel, the script says so and asks pip's own index as pip is configured; stock PyPI serves the CUDA
build there (~530 MB, official-builds.md §3.7). Whichever wheel came is named with its source and build, and the
package file is the one `torchforge repack` printed. A CUDA package needs conda-forge's CUDA libraries, which
the offline install below leaves out: for it the demo stops after the audit and says why.
Exit codes: torchforge's (errors.py); pip failures are ToolFailedError (6).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from torchforge.binaries.fetch import origin
from torchforge.errors import ForgeError, ToolFailedError, UsageError
from torchforge.proc import Command, Runner

IMPORT_DEPS = ("typing_extensions", "sympy", "networkx", "jinja2", "filelock", "fsspec", "numpy")


@dataclass(frozen=True)
class Resolved:
    """The wheel pip chose: where from, its sha256, and the requirements it declares."""

    url: str
    sha256: str
    requires: tuple[str, ...]

    @property
    def filename(self) -> str:
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])

    @property
    def source(self) -> str:
        return origin(self.url)  # repack --pytorch names a wheel's origin the same way

    def build(self) -> str:
        """The build as the index describes it (the file itself says it exactly once downloaded)."""
        version = self.filename.split("-")[1]
        if "+" in version:
            return f"the {version.split('+', 1)[1]} build"
        # PyPI's CUDA wheels drop +cuXYZ from the name; their NVIDIA requirements end in -cu12, -cu13 ...
        names = (r.split(";")[0].split("==")[0] for r in self.requires if r.startswith("nvidia-"))
        cuda = sorted({name.rsplit("-", 1)[1] for name in names if name.rsplit("-", 1)[1].startswith("cu")})
        return f"a CUDA build (it requires NVIDIA's {', '.join(cuda)} wheels)" if cuda else "a build without a local tag"


def _pip(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "pip", *args)


def resolve(torch: str, index: str | None, work: Path, runner: Runner) -> Resolved:
    """pip's choice of `torch==X.Y.Z` for this Python (metadata only, nothing downloaded)."""
    report = work / "report.json"
    report.unlink(missing_ok=True)
    where = ("--index-url", index, "--retries", "1", "--timeout", "20") if index else ()
    runner.run(Command(_pip("install", "--dry-run", "--ignore-installed", "--no-deps", "--only-binary=:all:",
                            "--quiet", "--report", str(report), "--target", str(work / "unused"), *where,
                            f"torch=={torch}")))
    item = json.loads(report.read_text("utf-8"))["install"][0]
    info = item["download_info"]
    return Resolved(info["url"], info["archive_info"]["hashes"]["sha256"],
                    tuple(item["metadata"].get("requires_dist", ())))


def choose(torch: str, cpu_index: str, work: Path, runner: Runner) -> Resolved:
    """The CPU index's wheel; where it fails, pip's own index's, saying so."""
    try:
        return resolve(torch, cpu_index, work, runner)
    except ToolFailedError as exc:
        lines = exc.tail.strip().splitlines()
        unreachable = any("Retrying" in line or "Failed to resolve" in line for line in lines)
        say(f"PyTorch's CPU index {cpu_index} did not serve torch {torch}: "
            + ("it is unreachable from here" if unreachable else f"pip said {lines[-1] if lines else 'nothing'}"))
        say("falling back to pip's own index as pip is configured (stock PyPI serves the CUDA build on Linux)")
        return resolve(torch, None, work, runner)


def download(chosen: Resolved, wheels: Path, work: Path, runner: Runner) -> Path:
    """Exactly the chosen file, its sha256 checked by pip (kept when already there)."""
    pinned = work / "requirements.txt"
    pinned.write_text(f"{chosen.url} --hash=sha256:{chosen.sha256}\n")
    runner.run(Command(_pip("download", "--no-deps", "--require-hashes", "--quiet", "--dest", str(wheels),
                            "-r", str(pinned))))
    return wheels / chosen.filename


def repack(torchforge: str, wheel: Path, out: Path, runner: Runner) -> Path:
    """The package `torchforge repack` wrote, from the line it printed (`PATH  (SIZE MB, ...)`)."""
    result = runner.run(Command((torchforge, "repack", str(wheel), "--out", str(out), "--replace")),
                        on_line=lambda line: print(f"  {line}", file=sys.stderr) if line.strip() else None)
    written = [line.rsplit("  (", 1)[0] for line in result.output.splitlines() if ".conda  (" in line]
    if len(written) != 1:
        raise UsageError(f"torchforge repack printed {len(written)} package lines, not one",
                         "run the repack command above by hand and read its output")
    return Path(written[0])


def import_python(work: Path, runner: Runner) -> Path:
    """A second Python with torch's pure-Python dependencies but no torch (made once)."""
    python = work / "py" / "bin" / "python"
    if not python.exists():
        runner.run(Command((sys.executable, "-m", "venv", str(work / "py"))))
        runner.run(Command((str(python), "-m", "pip", "install", "--quiet", *IMPORT_DEPS)))
    return python


def say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torch", required=True, help="the torch release X.Y.Z")
    parser.add_argument("--cpu-index", required=True, help="PyTorch's CPU wheel index, asked first")
    parser.add_argument("--work", type=Path, required=True, help="wheels/, py/ (the import venv) and env/ go here")
    parser.add_argument("--out", type=Path, required=True, help="the channel repack publishes into")
    parser.add_argument("--plan", action="store_true", help="only say which wheel would come from where")
    args = parser.parse_args(argv)
    try:
        return run_demo(args.torch, args.cpu_index, args.work, args.out, args.plan)
    except ForgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, ToolFailedError) and exc.tail:
            print(exc.tail.rstrip(), file=sys.stderr)
        return int(exc.exit_code)


def run_demo(torch: str, cpu_index: str, work: Path, out: Path, plan_only: bool) -> int:
    from torchforge import fileops
    from torchforge.binaries.wheels import read
    from torchforge.repack import install_from_channel

    runner = Runner(echo=lambda line: print(line, file=sys.stderr, flush=True))
    fileops.ensure_dir(work, "demo folder")
    with fileops.scratch(work, "resolve") as scratch:
        chosen = choose(torch, cpu_index, scratch, runner)
        say(f"torch {torch}: {chosen.filename} from {chosen.source}, {chosen.build()}")
        if plan_only:
            return 0
        wheel = download(chosen, work / "wheels", scratch, runner)
    cuda = read(wheel).cuda
    say(f"got {wheel} ({wheel.stat().st_size / 1e6:.0f} MB): the {f'CUDA {cuda}' if cuda else 'CPU'} build")
    torchforge = str(Path(sys.executable).with_name("torchforge"))
    package = repack(torchforge, wheel, out, runner)
    runner.run(Command((torchforge, "rpath", "audit", str(package))), on_line=print)
    if cuda:
        say(f"{package.name} is the CUDA {cuda} build: it needs conda-forge's CUDA packages, which the offline "
            f"install of this demo leaves out, so the install and import steps are not run; they need the CPU "
            f"build (reach {cpu_index}, or put its wheel in a pip find-links folder)")
        return 0
    python = import_python(work, runner)
    shutil.rmtree(work / "env", ignore_errors=True)  # a fresh prefix each run
    site = install_from_channel(out, work / "env", file_name=package.name)
    print(f"installed {package.name} into {work / 'env'}")
    runner.run(Command((str(python), "-c", "import torch; print(torch.__version__, torch.__file__); "
                        "print('torch.ones(3).sum() =', torch.ones(3).sum().item())"),
                       env={"PYTHONPATH": str(site)}), on_line=print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
