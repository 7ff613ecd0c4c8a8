"""`make ci-local`: the GitLab pipeline `torchforge ci gitlab` writes, run end to end here by gitlab-ci-local.

No GitLab and no registry are reachable here, so the pieces a real GitLab would give are made locally:

- the runner: gitlab-ci-local 4.65.0 (npm; newer releases need Node 22, this machine has Node 20), its docker
  executor driven through podman (`--container-executable podman`) with the configuration of
  tests/container_image.py, each job in the image the emitted file names: the local build images of
  `make container-image`, named in the scratch repository's torchforge.toml [images];
- torchforge: `torchforge ci` commits this checkout's wheel into the repository (.torchforge/) and every job
  installs that file; its dependencies come as wheels from a folder every job reaches (PIP_FIND_LINKS +
  PIP_NO_INDEX, set with `--variable`), so no job asks an index for anything;
- the conda channels: the stand-in channel of tests/stubchannel.py ([channels] replace), its python linked to
  the images' /usr/bin/python3.11, and the bundled-library stand-ins (cuDNN ...) the CUDA recipe copies in.

`SHARED` (stand-ins, wheels, the upload's directory channel) is mounted into every job at its own path, so the
file:// URLs in torchforge.toml and --upload-to mean the same inside and out. The scratch repository holds the
fixtures (torch_heavy, magma_like), torchforge.toml, a test script for the fixture (it is not PyTorch: no matmul)
and the emitted .gitlab-ci.yml, committed to git as a CI checkout is.

The pipeline runs twice; each run's log is kept (.cache/ci-local/run-N.log). `python -m tests.ci_local [--no-cuda]`.

The conda-forge flavour's pipeline (the default from 2.6) runs the same way, twice, from a repository of its own
(.cache/ci-local/repo-conda-forge, logs conda-forge-run-N.log): a 2.13.0 cpu build of tests/fixtures/torch_split
(one job for the recipe folder: libtorch, pytorch for 3.11 and the metapackage), its test, the upload into a
`file://` channel of its own and the promote, against stand-ins of conda-forge's packages (torchforge.standin,
linked to the image's /usr/bin/python3.11). `python -m tests.ci_local --conda-forge` runs only that one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests import container_image
from tests.test_conda_build import COMMON, MAGMA_LIKE, PYTORCH
from tests.test_container_build import prepare
from torchforge import selfwheel
from torchforge.proc import Runner

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".cache" / "ci-local"
SHARED = HOME / "shared"  # mounted into every job at the same path
REPO = HOME / "repo"
CHANNEL = SHARED / "channel"  # the upload's directory target
WHEELS = SHARED / "wheels"
GCL_VERSION = "4.65.0"
GCL = HOME / "npm" / "node_modules" / ".bin" / "gitlab-ci-local"
# torch_heavy, not torch_like: its CMake build takes the compiler launchers from the environment, so every
# compile goes through torchforge's ccache and the second run shows the reuse (torch_like's setup.py build
# bypasses the launcher: "no compiler calls went through the cache"). Three generated units keep it small.
TORCH_HEAVY = str(Path(__file__).parent / "fixtures" / "torch_heavy")
FIXTURE_ENV = "TORCH_HEAVY_TUS=3"
CHECK_SCRIPT = "ci/torch_heavy_check.py"
# The fixture stands in for torch (tests/fixtures/torch_heavy/README.md): the test job checks what it has.
CHECK = '''"""The test stage's check for the torch_heavy fixture (not PyTorch: no matmul, no GPU here)."""
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--version", required=True)
parser.add_argument("--cuda", action="store_true")
args = parser.parse_args()
print("torch", torch.__version__, "from", torch.__file__, "built for", torch.built_for())
print("ones_sum(3) =", torch.ones_sum(3), "units() =", torch.units())
assert torch.__version__ == args.version and torch.ones_sum(3) == 3.0
assert torch.built_for() == "3.11"  # the binding was compiled for the environment's Python
print("fixture check passed")
'''


class Unavailable(Exception):
    """gitlab-ci-local or podman cannot run here; the message says why."""


# Every command the pipeline run needs, with the Debian package that brings it: podman and runc run the jobs,
# debootstrap makes their images, node and npm install and run gitlab-ci-local, rsync copies its checkouts.
TOOLS = (("podman", "podman"), ("runc", "runc"), ("debootstrap", "debootstrap"), ("rsync", "rsync"),
         ("node", "nodejs"), ("npm", "npm"))


def check_tools() -> None:
    """Raises Unavailable naming every missing command at once, with the one command that installs them."""
    missing = [(tool, package) for tool, package in TOOLS if shutil.which(tool) is None]
    if missing:
        names = ", ".join(tool for tool, _ in missing)
        raise Unavailable(f"{names} {'is' if len(missing) == 1 else 'are'} not on PATH; install "
                          f"{'it' if len(missing) == 1 else 'them all'} with: apt-get install -y "
                          + " ".join(package for _, package in missing))


@dataclass(frozen=True)
class Run:
    returncode: int
    log: str


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")


def ensure_gitlab_ci_local() -> Path:
    """gitlab-ci-local at its pinned version, from npm into .cache/ci-local/npm (once)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise Unavailable("node and npm are not on PATH (apt-get install nodejs npm)")
    if shutil.which("rsync") is None:
        raise Unavailable("rsync is not on PATH (apt-get install rsync): gitlab-ci-local copies the checkout with it")
    if GCL.exists():
        found = _run([str(GCL), "--version"])
        if found.returncode == 0 and found.stdout.strip() == GCL_VERSION:
            return GCL
    (HOME / "npm").mkdir(parents=True, exist_ok=True)
    _check(_run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(HOME / "npm"),
                 f"gitlab-ci-local@{GCL_VERSION}"], timeout=900), "npm install gitlab-ci-local")
    return GCL


HELPER = "localhost/torchforge-ci-local-helper:bookworm"
# What gitlab-ci-local's helper container runs (chown, chmod, and rsync for artifacts and caches); its default,
# docker.io/firecow/gitlab-ci-local-util, is on a registry this machine cannot reach.
HELPER_DEBS = ("rsync", "libpopt0", "libxxhash0")


def helper_image() -> str:
    """The local build image's Debian base plus rsync, from Debian's packages (once)."""
    env = {**os.environ, **container_image.podman_env()}
    if _run(["podman", "image", "exists", HELPER], env=env).returncode == 0:
        return HELPER
    context = HOME / "helper"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    _check(_run(["apt-get", "download", *HELPER_DEBS], cwd=context, timeout=600), "apt-get download rsync")
    (context / "Containerfile").write_text(f"FROM {container_image.BASE}\nCOPY *.deb /tmp/debs/\n"
                                           "RUN dpkg -i /tmp/debs/*.deb && rm -rf /tmp/debs\n")
    _check(_run(["podman", "build", "--tag", HELPER, str(context)], env=env, timeout=900), "podman build (helper)")
    shutil.rmtree(context)
    return HELPER


def wheelhouse() -> Path:
    """This checkout as a wheel, and its dependencies for the images' Python (Debian 12's 3.11, as here)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    for old in WHEELS.glob("torchforge*.whl"):
        old.unlink()
    wheel = selfwheel.build(Runner(), WHEELS)
    _check(_run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(WHEELS),
                 "--find-links", str(WHEELS), str(wheel)], timeout=900), "pip download (dependencies)")
    return wheel


@dataclass(frozen=True)
class Pipeline:
    """One emitted pipeline: its repository, the log name of its runs, its upload channel."""

    repo: Path
    log_prefix: str
    channel: Path

    def log(self, number: int) -> Path:
        return HOME / f"{self.log_prefix}run-{number}.log"


OFFICIAL = Pipeline(REPO, "", CHANNEL)
CONDA_FORGE = Pipeline(HOME / "repo-conda-forge", "conda-forge-", SHARED / "channel-conda-forge")
TORCH_SPLIT = Path(__file__).parent / "fixtures" / "torch_split"
CF_SELECTION = ("--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11")
CF_CHECK_SCRIPT = "ci/torch_split_check.py"
CF_CHECK = '''"""The test stage's check for the torch_split fixture (not PyTorch: no matmul)."""
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--version", required=True)
parser.add_argument("--cuda", action="store_true")
args = parser.parse_args()
print("torch", torch.__version__, "from", torch.__file__, "cuda built:", torch.cuda_built())
assert torch.__version__ == args.version and torch.ones_sum(3) == 3.0
assert torch.cuda_built() is args.cuda
print("fixture check passed")
'''


def _commit(repo: Path) -> None:
    """The repository as a CI checkout has it: committed, with an origin remote."""
    (repo / ".gitignore").write_text(".gitlab-ci-local/\n")
    # gitlab-ci-local derives CI_PROJECT_* from the origin remote; nothing is fetched from it.
    for argv in (["git", "init", "--quiet"], ["git", "remote", "add", "origin", "https://gitlab.example/ci-local/repo.git"],
                 ["git", "add", "."],
                 ["git", "-c", "user.name=ci-local", "-c", "user.email=ci-local@localhost", "commit", "--quiet", "-m", "ci-local"]):
        _check(_run(argv, cwd=repo), " ".join(argv[:2]))


def conda_forge_repository(wheel: Path) -> dict[str, str]:
    """The conda-forge flavour's repository: torch_split, stand-ins of its requirements in SHARED (the site's
    `[channels] replace`), the local cpu image, the emitted .gitlab-ci.yml and the torchforge `wheel`."""
    from torchforge import standin
    from torchforge.flavours import Request
    from torchforge.flavours.conda_forge import planning

    recipes = planning.recipes(Request(*CF_SELECTION[1::2], "linux-64", None, 0))
    stubs = SHARED / "standin-conda-forge"
    shutil.rmtree(stubs, ignore_errors=True)
    standin.make_stub_channel(stubs, standin.flavour_requirements(recipes), bin_dir=Path("/usr/bin"), conda_forge=True)
    repo = CONDA_FORGE.repo
    shutil.rmtree(repo, ignore_errors=True)
    (repo / "ci").mkdir(parents=True)
    shutil.copytree(TORCH_SPLIT, repo / "fixtures" / "torch_split",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (repo / "torchforge.toml").write_text(f'[channels]\nreplace = ["{stubs.as_uri()}"]\n'
                                          + container_image.site_images(cuda=False))
    (repo / CF_CHECK_SCRIPT).write_text(CF_CHECK)
    flags = [*CF_SELECTION, "--source", "fixtures/torch_split", "--upload-to", CONDA_FORGE.channel.as_uri(),
             "--config", "torchforge.toml", "--test-script", CF_CHECK_SCRIPT]
    _check(_run([str(ROOT / ".venv" / "bin" / "torchforge"), "ci", "gitlab", *flags, "--wheel", str(wheel), "--out", "."],
                cwd=repo), "torchforge ci gitlab (conda-forge)")
    _commit(repo)
    return {}


def scratch_repository(cuda: bool, wheel: Path) -> dict[str, str]:
    """The stand-ins in SHARED, the repository in REPO with its emitted .gitlab-ci.yml and the torchforge `wheel`
    its jobs install; returns the variables that name the bundled-library stand-ins."""
    accels = f"cpu,{container_image.CUDA_VERSION}" if cuda else "cpu"
    cuda_flags = ["--arch-list", "8.0;9.0", "--magma-source"] if cuda else []
    # The stand-ins for every requirement of this selection's recipes (the fixtures at their own paths).
    SHARED.mkdir(parents=True, exist_ok=True)
    _, bundled = prepare(None, SHARED, [*COMMON, "--cuda", accels, *cuda_flags, *([MAGMA_LIKE] if cuda else [])],  # type: ignore[arg-type]
                         in_container=True)
    shutil.rmtree(REPO, ignore_errors=True)
    (REPO / "fixtures").mkdir(parents=True)
    for fixture in (TORCH_HEAVY, MAGMA_LIKE):
        shutil.copytree(fixture, REPO / "fixtures" / Path(fixture).name,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.move(SHARED / "torchforge.toml", REPO / "torchforge.toml")
    (REPO / "ci").mkdir()
    (REPO / CHECK_SCRIPT).write_text(CHECK)
    flags = ["--pytorch", PYTORCH, "--flavour", "official", "--cuda", accels, "--py", "3.11", "--source", "fixtures/torch_heavy", "--env", FIXTURE_ENV,
             "--upload-to", CHANNEL.as_uri(), "--config", "torchforge.toml", "--test-script", CHECK_SCRIPT,
             *cuda_flags, *(["fixtures/magma_like", "--skip-preflight"] if cuda else [])]
    # --skip-preflight with CUDA: the image holds this machine's toolkit, which has no cuBLAS/cuSPARSE, and the
    # preflight refuses it (rightly: MAGMA links them); the fixtures link neither (as tests/test_conda_build.py).
    _check(_run([str(ROOT / ".venv" / "bin" / "torchforge"), "ci", "gitlab", *flags, "--wheel", str(wheel), "--out", "."],
                cwd=REPO),
           "torchforge ci gitlab")
    _commit(REPO)
    return bundled


def run_pipeline(bundled: dict[str, str], number: int, pipeline: Pipeline = OFFICIAL) -> Run:
    """One `gitlab-ci-local` run of the whole pipeline; the log also goes to .cache/ci-local/[PREFIX]run-N.log."""
    variables = {"CI_PIPELINE_SOURCE": "web", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS),
                 "PIP_DISABLE_PIP_VERSION_CHECK": "1", **bundled}
    argv = [str(GCL), "--container-executable", "podman", "--volume", f"{SHARED}:{SHARED}", "--concurrency", "1",
            "--pull-policy", "if-not-present", "--helper-image", HELPER, "--no-color", "--manual", "promote",
            # the jobs without an image (upload, promote) run on this machine, each in its own folder
            "--shell-isolation", "--ignore-predefined-vars", "CI_PIPELINE_SOURCE"]
    for name, value in variables.items():
        argv += ["--variable", f"{name}={value}"]
    env = {**os.environ, **container_image.podman_env()}
    path = pipeline.log(number)
    with path.open("w") as log:  # written as it runs: `tail -f` shows the jobs
        result = subprocess.run(argv, cwd=pipeline.repo, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=3600, check=False)
    return Run(result.returncode, path.read_text())


def main(cuda: bool, pipeline: Pipeline = OFFICIAL) -> int:
    """Emit `pipeline`'s repository and run it twice (the second run from the first one's caches)."""
    try:
        check_tools()
        container_image.ensure(cuda=cuda)
        ensure_gitlab_ci_local()
        helper_image()
    except (container_image.Unavailable, Unavailable) as exc:
        print(f"ci-local cannot run here: {exc}", file=sys.stderr)
        return 1
    shutil.rmtree(pipeline.channel, ignore_errors=True)
    pipeline.channel.mkdir(parents=True)
    wheel = wheelhouse()
    bundled = conda_forge_repository(wheel) if pipeline is CONDA_FORGE else scratch_repository(cuda, wheel)
    for number in (1, 2):
        run = run_pipeline(bundled, number, pipeline)
        if run.returncode != 0:
            print(f"ci-local: run {number} failed ({run.returncode}); log in {pipeline.log(number)}", file=sys.stderr)
            return 1
        print(f"ci-local: run {number} passed; log in {pipeline.log(number)}")
    return 0


def preflight() -> int:
    """`python -m tests.ci_local --check-tools` (`make ci-local`'s first step): exit 1 naming what is missing."""
    try:
        check_tools()
    except Unavailable as exc:
        print(f"ci-local cannot run here: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if "--check-tools" in sys.argv:
        sys.exit(preflight())
    chosen = CONDA_FORGE if "--conda-forge" in sys.argv else OFFICIAL
    # the conda-forge pipeline is a cpu one: its CUDA image is not needed
    sys.exit(main("--no-cuda" not in sys.argv and chosen is OFFICIAL and container_image.cuda_available(), chosen))
