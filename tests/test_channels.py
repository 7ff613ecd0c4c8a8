"""Channels and build images: the channels of the plan per era, the exact commands of both engines, a site's
torchforge.toml replacing them, `--container` command lines, and the CI files for one variant of each era."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.golden.ci_regenerate import self_wheel
from tests.offline_site import offline_site
from tests.official_report import official_report
from torchforge import containers
from torchforge.channels import data_channels, parse_table
from torchforge.ci import Provider
from torchforge.cli import main
from torchforge.errors import DataError, ExitCode, ToolMissingError
from torchforge.pipeline import BuildSettings, Pipeline
from torchforge.sequence import official_steps
from torchforge.engines.conda_build import CondaBuildEngine
from torchforge.proc import Command, Runner
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.variant import Options, Selection

PYTORCH = "https://conda.anaconda.org/pytorch"
NVIDIA = "https://conda.anaconda.org/nvidia"
FORGE = "https://conda.anaconda.org/conda-forge"
MAIN = "https://repo.anaconda.com/pkgs/main"
R = "https://repo.anaconda.com/pkgs/r"
MSYS2 = "https://repo.anaconda.com/pkgs/msys2"

# One variant of each recipe era (eras.toml) and of the releases after 2.5, with the channels of its solve:
# the official build's `-c pytorch` then the image's defaults, `-c nvidia` for pytorch-cuda, conda-forge where
# the official scripts added it, and conda-forge's CUDA packages for 2.6+.
ERAS = {
    "1.8": (("1.8.1", "11.1", "3.9", "linux-64"), (PYTORCH, FORGE, MAIN, R)),
    "1.9": (("1.10.2", "11.3", "3.9", "linux-64"), (PYTORCH, MAIN, R)),
    "1.11": (("1.12.1", "11.6", "3.10", "linux-64"), (PYTORCH, FORGE, MAIN, R)),
    "2.0": (("2.1.2", "12.1", "3.11", "linux-64"), (PYTORCH, NVIDIA, MAIN, R)),
    "2.4": (("2.5.1", "12.4", "3.12", "linux-64"), (PYTORCH, NVIDIA, MAIN, R)),
    "2.4-cpu-win": (("2.5.1", "cpu", "3.12", "win-64"), (PYTORCH, MAIN, R, MSYS2)),
    "2.6+-pytorch-cuda": (("2.6.0", "11.8", "3.12", "linux-64"), (FORGE, PYTORCH, NVIDIA)),
    "2.6+-split-cuda": (("2.9.0", "12.8", "3.12", "linux-64"), (FORGE, PYTORCH)),
    "2.6+-cpu": (("2.9.0", "cpu", "3.12", "linux-64"), (FORGE, PYTORCH)),
}


def selection(pytorch: str, accel: str, python: str, platform: str = "linux-64") -> Selection:
    return Selection.from_flags(pytorch, accel, python, platform, Options())


def dry_run_lines(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = main(["build", "--dry-run", *args])
    err = capsys.readouterr().err
    # Leading NAME=value words are the command's environment (the compile cache's CCACHE_CONFIGPATH and launchers).
    lines = [re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S+ )+", "", line.removeprefix("[dry-run] "))
             for line in err.splitlines() if line.startswith("[dry-run]")]
    return code, lines, err


def channel_flags(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


@pytest.mark.parametrize("era", list(ERAS))
def test_plan_channels_per_era(tmp_path: Path, era: str) -> None:
    (pytorch, accel, python, platform), expected = ERAS[era]
    steps = official_steps(plan(selection(pytorch, accel, python, platform)), CondaBuildEngine(),
                       BuildSettings(out=tmp_path))
    by_kind = {step.kind: step for step in steps}
    assert by_kind["pytorch"].channels == expected
    if "magma" in by_kind:  # magma-cudaXYZ has no requirements: nothing to solve, no channel
        assert by_kind["magma"].channels == ()


@pytest.mark.parametrize("era", list(ERAS))
def test_dry_run_commands_of_both_engines_carry_the_channels(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             era: str) -> None:
    (pytorch, accel, python, platform), expected = ERAS[era]
    out = tmp_path / "out"
    request = ["--pytorch", pytorch, "--flavour", "official", "--cuda", accel, "--py", python, "--platform", platform, "--out", str(out),
               "-c", "file:///srv/extra"]
    if platform != "linux-64":  # a dry run refuses a platform this host cannot build, unless preflight is skipped
        request.append("--skip-preflight")
    code, lines, err = dry_run_lines(capsys, "--engine", "conda-build", *request)
    assert code == 0
    argv = shlex.split(lines[-1])
    assert argv[:2] == ["conda", "build"]
    # the output channel first, then --channel, then the era's channels; nothing from a .condarc
    assert channel_flags(argv, "-c") == [f"file://{out.resolve()}", "file:///srv/extra", *expected]
    assert "--override-channels" in argv
    for url in expected:
        assert url in err  # the plan table shows them
    code, lines, _ = dry_run_lines(capsys, "--engine", "rattler-build", *request)
    assert code == 0
    argv = shlex.split(lines[-1])
    assert argv[1:3] == ["-m", "torchforge.engines.rattler_worker"]
    assert channel_flags(argv, "--channel") == [f"file://{out.resolve()}", "file:///srv/extra", *expected]
    assert not out.exists()


def test_site_config_replaces_or_mirrors_the_channels(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    request = ["--engine", "conda-build", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--out", str(out)]
    config = tmp_path / "site.toml"
    config.write_text('[channels]\nreplace = ["https://mirror.example/main", "file:///srv/pytorch"]\n')
    code, lines, _ = dry_run_lines(capsys, *request, "--config", str(config))
    assert code == 0
    assert channel_flags(shlex.split(lines[-1]), "-c") == [
        f"file://{out.resolve()}", "https://mirror.example/main", "file:///srv/pytorch"]
    # ./torchforge.toml is read without --config; mirrors rewrite URL prefixes (the longest prefix wins)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "torchforge.toml").write_text(
        '[channels.mirrors]\n"https://conda.anaconda.org/" = "https://mirror.example/conda/"\n'
        '"https://conda.anaconda.org/nvidia" = "file:///srv/nvidia"\n'
        '"https://repo.anaconda.com/pkgs/" = "https://mirror.example/anaconda/"\n')
    code, lines, err = dry_run_lines(capsys, *request)
    assert code == 0
    assert f"from {tmp_path / 'torchforge.toml'}" in err
    assert channel_flags(shlex.split(lines[-1]), "-c") == [
        f"file://{out.resolve()}", "https://mirror.example/conda/pytorch", "file:///srv/nvidia",
        "https://mirror.example/anaconda/main", "https://mirror.example/anaconda/r"]


@pytest.mark.parametrize(("text", "message"), [
    ('[channels]\nreplce = ["https://x/y"]\n', "unknown key"),
    ('[channels]\nreplace = ["relative/folder"]\n', "neither a URL nor an absolute path"),
    ('[channels\n', "not valid TOML"),
])
def test_a_bad_site_config_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                            message: str) -> None:
    config = tmp_path / "torchforge.toml"
    config.write_text(text)
    code = main(["build", "--dry-run", "--cuda", "cpu", "--py", "3.12", "--config", str(config),
                 "--out", str(tmp_path / "out")])
    assert code == ExitCode.USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_data_rejects_unknown_channels_and_cuda_versions() -> None:
    text = ('[meta]\nsource = "x"\n[channels.a]\nurl = "https://a"\n'
            '[[rules]]\nchannels = ["b"]\nsource = "x"\n')
    with pytest.raises(DataError, match="unknown channel 'b'"):
        parse_table(text)
    assert data_channels("magma", "2.5.1", None, "12.4", "linux-64") == ()
    images = ('[meta]\nsource = "x"\n[derive]\nrepository = "r"\nprefix = "/p"\ninstaller_url = "https://i/m.sh"\n'
              'checksum_url = "https://i/m.sh.sha256"\nconda_build = "1"\nchannel = "c"\nsource = "s"\n'
              '[cudnn_wheels]\nprefix = "/w"\npackages = { "12" = "nvidia-cudnn-cu12" }\nsource = "s"\n'
              f'[cudnn_wheels.sha256]\n"nvidia-cudnn-cu12==9.10.2.21" = ["{"a" * 64}"]\n'
              '[images."99.9"]\nimage = "a"\ncuda_home = "/c"\nprovides = "p"\nconda_build = true\nsource = "s"\n')
    with pytest.raises(DataError, match="CUDA 99.9 is missing from cuda.toml"):
        containers.parse_table(images)
    with pytest.raises(DataError, match="cuda_home .c. is not an absolute path"):
        containers.parse_table(images.replace("99.9", "12.4").replace('"/c"', '"c"'))
    with pytest.raises(DataError, match="exactly one of image .* and base"):
        containers.parse_table(images.replace("99.9", "12.4").replace('image = "a"', 'image = "a"\nbase = "b"'))
    with pytest.raises(DataError, match="exactly one of image .* and base"):
        containers.parse_table(images.replace("99.9", "12.4").replace('image = "a"\n', ''))
    with pytest.raises(DataError, match="glibc '2' is not a version"):
        containers.parse_table(images.replace("99.9", "12.4").replace('image = "a"', 'image = "a"\nglibc = "2"'))
    valid = images.replace("99.9", "12.4")
    assert containers.parse_table(valid.replace('image = "a"', 'image = "a"\ncudnn = "9.1.0.70"')).images["12.4"].cudnn
    # cuDNN: the full version (the build string's three parts are not enough to name a wheel or an image)
    with pytest.raises(DataError, match="cudnn '9.1.0' is not a full cuDNN version"):
        containers.parse_table(valid.replace('image = "a"', 'image = "a"\ncudnn = "9.1.0"'))
    with pytest.raises(DataError, match="is not <a package of cudnn_wheels.packages>==<X.Y.Z.B>"):
        containers.parse_table(valid.replace('"nvidia-cudnn-cu12==9.10.2.21"', '"nvidia-cudnn-cu11==9.10.2.21"'))
    with pytest.raises(DataError, match="keys are CUDA major versions"):
        containers.parse_table(valid.replace('{ "12" = ', '{ "12.8" = '))
    with pytest.raises(DataError, match="give the sha256"):
        containers.parse_table(valid.replace("a" * 64, "a" * 63))


# ---- --container ---------------------------------------------------------------------------------------------


def executable(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def docker_run(line: str) -> tuple[list[str], dict[str, str], list[str], str, list[str]]:
    """(options, --env values, --volume values, image, command inside) of one printed `docker run` line."""
    argv = shlex.split(line)
    assert argv[1:3] == ["run", "--rm"], argv
    env: dict[str, str] = {}
    volumes: list[str] = []
    i = 3
    while argv[i].startswith("--"):
        if argv[i] == "--env":
            name, _, value = argv[i + 1].partition("=")
            env[name] = value
        elif argv[i] == "--volume":
            volumes.append(argv[i + 1])
        i += 2
    return argv[:i], env, volumes, argv[i], argv[i + 1:]


def test_container_dry_run_for_a_cuda_and_a_cpu_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(containers.TOOL_VARIABLE, raising=False)
    tools = tmp_path / "bin"
    docker = executable(tools, "docker")
    launcher = executable(tools, "sccache")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", "/host/cuda-13.0")  # the host's toolkit must not leak into the image
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CMAKE_CXX_COMPILER_LAUNCHER", "sccache")
    source = tmp_path / "pytorch-src"
    source.mkdir()
    (source / "setup.py").write_text("")  # a dry run checks that --source is a source tree
    out = tmp_path / "out"
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", "2.5.1", "--cuda", "12.4,cpu", "--py", "3.12",
                                     "--source", str(source), "--out", str(out))
    assert code == 0, err
    assert "conda-build inside the build image" in err
    # the companions (pytorch-mutex cuda, pytorch-cuda 12.4, pytorch-mutex cpu, cpuonly), then magma-cuda124,
    # pytorch cu124, pytorch cpu
    assert len(lines) == 7
    lines = lines[4:]
    user = f"{os.getuid()}:{os.getgid()}"
    for line, image, cuda_home in ((lines[1], "pytorch/conda-builder:cuda12.4", "/usr/local/cuda-12.4"),
                                   (lines[2], "pytorch/conda-builder:cpu", None)):
        options, env, volumes, got_image, inner = docker_run(line)
        assert options[0] == str(docker)
        assert options[options.index("--user") + 1] == user
        assert got_image == image
        assert env.get("CUDA_HOME") == cuda_home and env["HOME"] == "/tmp"
        assert env["SCCACHE_DIR"] == str(tmp_path / "cache") and env["CMAKE_CXX_COMPILER_LAUNCHER"] == "sccache"
        # same paths inside: the output channel and the cache writable, the source read-only, the launcher as a tool
        assert volumes == [f"{out.resolve()}:{out.resolve()}", f"{tmp_path / 'cache'}:{tmp_path / 'cache'}",
                           f"{launcher}:/usr/local/bin/sccache:ro", f"{source}:{source}:ro"]
        assert inner[:2] == ["conda", "build"] and inner[2] == str(out / "recipes" / line.split("recipes/")[1].split()[0])
        assert "--override-channels" in inner
    assert "/host/cuda-13.0" not in "\n".join(lines)
    assert docker_run(lines[0])[3] == "pytorch/conda-builder:cuda12.4"  # magma builds in the same image
    assert not out.exists()


def test_container_commands_go_through_the_runner(tmp_path: Path) -> None:
    settings = BuildSettings(out=tmp_path / "out", container=containers.ContainerSettings("/usr/bin/podman", uid=1000, gid=1000))
    render_plan = plan(selection("2.5.1", "cpu", "3.11"))
    steps = official_steps(render_plan, CondaBuildEngine(), settings)
    runner = Runner(dry_run=True)
    results = Pipeline(CondaBuildEngine(), runner, settings).run(steps)
    assert [r.step.kind for r in results] == ["companion", "companion", "pytorch"]  # pytorch-mutex cpu, cpuonly
    assert all(r.ok for r in results)
    command = runner.history[-1]
    assert command.argv[:7] == ("/usr/bin/podman", "run", "--rm", "--user", "1000:1000", "--userns", "keep-id")
    assert "pytorch/conda-builder:cpu" in command.argv and command.env == {}
    # keep-id only for rootless podman: rootful podman refuses it, docker has no such mode
    for tool, uid in (("/usr/bin/podman", 0), ("/usr/bin/docker", 1000)):
        wrapped = containers.wrap(Command(("conda", "build", "r")), accel="cpu", writable=[tmp_path / "out"],
                                  settings=containers.ContainerSettings(tool, uid=uid, gid=uid))
        assert wrapped.argv[:5] == (tool, "run", "--rm", "--user", f"{uid}:{uid}") and "--userns" not in wrapped.argv


def test_container_tool_probe_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(containers.TOOL_VARIABLE, raising=False)
    only_podman = tmp_path / "podman-only"
    podman = executable(only_podman, "podman")
    monkeypatch.setenv("PATH", str(only_podman))
    assert containers.find_tool() == str(podman)
    # both on PATH: docker first, unless TORCHFORGE_CONTAINER_TOOL picks (a docker client without a daemon)
    docker = executable(tmp_path / "docker-too", "docker")
    monkeypatch.setenv("PATH", f"{docker.parent}{os.pathsep}{only_podman}")
    assert containers.find_tool() == str(docker)
    monkeypatch.setenv(containers.TOOL_VARIABLE, "podman")
    assert containers.find_tool() == str(podman)
    monkeypatch.setenv(containers.TOOL_VARIABLE, "nerdctl")
    with pytest.raises(ToolMissingError, match="TORCHFORGE_CONTAINER_TOOL=nerdctl names no docker or podman program"):
        containers.find_tool()
    # another program on PATH is not a container client, and a dry run does not fall back to printing `docker`
    executable(only_podman, "ls")
    site = offline_site(tmp_path / "site", [])  # doctor's channels: a local one, not the data channels
    for chosen in ("ls", str(only_podman / "ls"), "nerdctl"):
        monkeypatch.setenv(containers.TOOL_VARIABLE, chosen)
        assert containers.probe_tool() is None
        assert main(["build", "--dry-run", "--container", "--cuda", "cpu", "--py", "3.12",
                     "--out", str(tmp_path / "refused")]) == ExitCode.TOOL_MISSING
        assert f"{containers.TOOL_VARIABLE}={chosen} names no docker or podman" in capsys.readouterr().err
        # doctor's row says the same, not "neither was found"
        assert main(["doctor", "--container", "--cuda", "cpu", "--py", "3.12", "--json", "--config", str(site),
                     "--out", str(tmp_path / "refused")]) == ExitCode.PREFLIGHT_FAILED
        row = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "container tool")
        assert row["status"] == "fail" and f"{containers.TOOL_VARIABLE}={chosen} names no docker" in row["detail"]
    assert not (tmp_path / "refused").exists()
    monkeypatch.delenv(containers.TOOL_VARIABLE)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ToolMissingError, match="docker or podman"):
        containers.find_tool()
    # a dry run needs no client: it prints the `docker run` line; a real build stops (exit 5)
    out = str(tmp_path / "out")
    assert main(["build", "--dry-run", "--container", "--cuda", "cpu", "--py", "3.12", "--out", out]) == 0
    assert "[dry-run] docker run --rm" in capsys.readouterr().err
    assert main(["build", "--container", "--cuda", "cpu", "--py", "3.12", "--out", out]) == ExitCode.TOOL_MISSING
    assert "neither was found" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(only_podman))
    request = ["--dry-run", "--container", "--py", "3.12", "--out", str(tmp_path / "out")]
    # CUDA 13.2 (2.12+) has no image with a source: refused before anything runs, naming the fix
    assert main(["build", *request, "--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "no build image is known for CUDA 13.2" in err and '[images."13.2"]' in err and "[dry-run]" not in err
    # a site image without conda-build is refused; named as a base, it is derived instead
    config = tmp_path / "no-conda.toml"
    config.write_text('[images."12.8"]\nimage = "registry.example/cuda:12.8"\ncuda_home = "/usr/local/cuda-12.8"\n'
                      'conda_build = false\n')
    assert main(["build", *request, "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--config", str(config)]) == ExitCode.TOOL_MISSING
    assert "has no conda-build" in capsys.readouterr().err
    assert main(["build", *request, "--cuda", "cpu", "--engine", "rattler-build"]) == ExitCode.USAGE
    assert "--container runs conda-build" in capsys.readouterr().err
    assert main(["build", *request, "--cuda", "cpu", "--platform", "win-64"]) == ExitCode.USAGE
    assert "not win-64" in capsys.readouterr().err
    # a site names its own image for a CUDA version the data has none for
    config = tmp_path / "site.toml"
    config.write_text('[images."13.2"]\nimage = "registry.example/builder:cuda13.2"\ncuda_home = "/usr/local/cuda-13.2"\n')
    code = main(["build", *request, "--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2", "--config", str(config)])
    assert code == 0
    assert "registry.example/builder:cuda13.2 conda build" in capsys.readouterr().err


# ---- CI -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ["1.8", "2.4", "2.6+-pytorch-cuda", "2.6+-cpu"])
def test_ci_jobs_use_the_cuda_image_and_the_same_channels(tmp_path: Path, era: str) -> None:
    (pytorch, accel, python, _), expected = ERAS[era]
    image = containers.image_for(accel)
    assert image is not None
    args = ["--pytorch", pytorch, "--flavour", "official", "--cuda", accel, "--py", python, "-c", "file:///srv/extra",
            "--out", str(tmp_path), "--wheel", str(self_wheel())]
    assert main(["ci", "github", *args]) == 0
    assert main(["ci", "gitlab", *args]) == 0
    github_text = (tmp_path / Provider.GITHUB.path).read_text()
    github = YAML(typ="safe").load(github_text)
    gitlab_text = (tmp_path / Provider.GITLAB.path).read_text()
    gitlab = YAML(typ="safe").load(gitlab_text)
    (variant,) = plan(selection(pytorch, accel, python)).variants
    job = next(body for body in github["jobs"].values() if body.get("name") == variant.id)
    (build,) = [s["run"] for s in job["steps"] if s.get("run", "").startswith("torchforge build")]
    argv = shlex.split(build)
    # GitHub: the runner's docker runs the build in the image; GitLab: the job runs in it
    assert argv[-1] == "--container" and channel_flags(argv, "--channel") == ["file:///srv/extra"]
    assert gitlab[variant.id]["image"] == image.image
    assert gitlab[variant.id].get("variables", {}).get("CUDA_HOME", "") == image.cuda_home
    assert "--channel file:///srv/extra" in " ".join(gitlab[variant.id]["script"])
    # each job's channels are named above it: the list the build's plan uses
    for text in (github_text, gitlab_text):
        assert f"# channels: {' '.join(expected)}\n" in text and f"# image: {image.image}\n" in text


def test_doctor_checks_the_images_instead_of_this_machines_toolkit(tmp_path: Path) -> None:
    report = official_report("2.12.0", "12.6,13.2", "3.12", out=tmp_path, container=containers.ContainerSettings(""))
    statuses = {c.name: c.status.value for c in report.checks}
    details = {c.name: c.detail for c in report.checks}
    assert statuses["container tool"] == "fail"
    assert statuses["image (CUDA 12.6)"] == "ok" and statuses["image (CUDA 13.2)"] == "fail"
    # the derived image and its base are named
    assert "torchforge/builder:cuda12.6-" in details["image (CUDA 12.6)"]
    assert "pytorch/manylinux2_28-builder:cuda12.6" in details["image (CUDA 12.6)"]
    # nvcc and the host compiler are the image's: not checked on this machine
    assert not any(name.startswith(("nvcc", "host compiler")) for name in statuses)
    assert report.engine == "conda-build"


def test_doctor_contacts_the_container_engine_a_client_without_its_daemon_fails(tmp_path: Path) -> None:
    docker = tmp_path / "bin" / "docker"  # what a docker client prints, and its status, when no daemon answers
    docker.parent.mkdir()
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                      "Is the docker daemon running?' >&2\nexit 1\n")
    docker.chmod(0o755)
    report = official_report("2.5.1", "cpu", "3.10", out=tmp_path, container=containers.ContainerSettings(str(docker)))
    row = next(c for c in report.checks if c.name == "container tool")
    assert row.status.value == "fail" and "`docker info` fails: Cannot connect to the Docker daemon" in row.detail
    assert row.fix is not None and "TORCHFORGE_CONTAINER_TOOL=podman" in row.fix


def test_ci_takes_a_site_image_and_passes_the_config_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("site.toml").write_text('[images."13.2"]\nimage = "registry.example/builder:cuda13.2"\n'
                                 'cuda_home = "/usr/local/cuda-13.2"\n')
    args = ["--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2", "--py", "3.12", "--out", ".",
            "--wheel", str(self_wheel())]
    assert main(["ci", "gitlab", *args]) == ExitCode.USAGE  # no image with a source for 13.2
    assert main(["ci", "gitlab", *args, "--config", "site.toml"]) == 0
    doc = YAML(typ="safe").load(Path(".gitlab-ci.yml").read_text())
    job = doc["pytorch-2.12.0-cu132-py312-linux_64"]
    assert job["image"] == "registry.example/builder:cuda13.2"
    assert job["variables"]["CUDA_HOME"] == "/usr/local/cuda-13.2"
    build = next(line for line in job["script"] if "torchforge build" in line)
    assert shlex.split(build)[-4:] == ["--config", "site.toml", "--out", "forge-channel"]


def test_doctor_reads_an_http_channel_and_names_one_that_does_not_answer(tmp_path: Path) -> None:
    """A channel served over HTTP (a stand-in for a mirror) answers and solves; a closed port does not answer."""
    import functools
    import http.server
    import socket
    import threading

    from tests.stubchannel import make_stub_channel
    from torchforge.channels import SiteChannels
    from torchforge.config import SiteConfig
    from torchforge.flavours.official.recipe import pytorch_context

    selection_ = selection("2.9.0", "cpu", "3.11")
    (variant,) = plan(selection_).variants
    context = pytorch_context(variant)
    make_stub_channel(tmp_path / "mirror", [*context.build_requirements, *context.host_requirements], runnable=False)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "mirror"))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/conda"
    try:
        served = f"http://127.0.0.1:{server.server_address[1]}"
        for urls, want in (((served,), "ok"), ((served, closed), "warn")):
            site = SiteConfig(SiteChannels(replace=urls))
            report = official_report("2.9.0", "cpu", "3.11", out=tmp_path / "out", site=site, check_channels=True)
            statuses = {c.name: (c.status.value, c.detail) for c in report.checks}
            assert statuses[f"channel {served}"][0] == "ok"
            assert statuses[f"requirements ({variant.id})"][0] == want, statuses
        status, detail = statuses[f"channel {closed}"]
        assert status == "fail" and detail.startswith("does not answer")
    finally:
        server.shutdown()
        server.server_close()


def test_a_channel_argument_names_a_local_folder_only_when_written_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchforge.localchannel import folder_of

    (tmp_path / "local").mkdir()
    monkeypatch.chdir(tmp_path)
    assert folder_of("file:///srv/chan") == Path("/srv/chan")
    assert folder_of("https://conda.anaconda.org/pytorch") is None
    assert folder_of("conda-forge") is None and folder_of("pytorch/label/nightly") is None  # names, not folders
    assert folder_of("local") == Path("local")  # an existing folder, as conda reads it
    assert folder_of("/srv/missing") == Path("/srv/missing")  # reported as a missing folder, not a name
    assert folder_of("./missing") == Path("./missing")


# ---- derived images (a `base` entry: conda-build added by torchforge) ----------------------------------------


def test_the_derived_dockerfile_of_cuda_12_8_comes_from_the_data() -> None:
    table = containers.load_table()
    image = table.images["12.8"]
    derive = table.derive
    derived = containers.derivation("12.8", image)
    dockerfile = derived.files["Dockerfile"].splitlines()
    assert dockerfile[1:] == [f"FROM {image.base}", "COPY derive.sh /tmp/torchforge-derive.sh",
                              "RUN sh /tmp/torchforge-derive.sh && rm -f /tmp/torchforge-derive.sh",
                              f"ENV PATH={derive.prefix}/bin:$PATH"]
    assert image.base == "pytorch/manylinux2_28-builder:cuda12.8" and image.cuda_home == "/usr/local/cuda-12.8"
    installer = "Miniforge3-26.3.2-3-Linux-x86_64.sh"
    script = derived.script.splitlines()
    assert f"curl -fsSL --retry 3 -o {installer} {derive.installer_url}" in script
    assert f"sha256sum -c {installer}.sha256" in script
    assert f"bash {installer} -b -p /opt/torchforge-conda" in script
    assert ("/opt/torchforge-conda/bin/conda install --yes --name base --override-channels --channel conda-forge "
            "conda-build=26.7.1") in script
    # content-addressed: the tag names the CUDA version and the hash of both files; another base, another tag
    assert re.fullmatch(r"torchforge/builder:cuda12\.8-[0-9a-f]{12}", derived.tag)
    assert containers.derivation("12.8", image).tag == derived.tag
    assert containers.derivation("12.9", table.images["12.9"]).tag.split("-")[-1] != derived.tag.split("-")[-1]


def test_container_dry_run_builds_the_derived_image_before_running_in_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # a dry run needs no client
    out = tmp_path / "out"
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--py", "3.12",
                                     "--out", str(out), "--no-cache")
    assert code == 0, err
    image = containers.load_table().images["12.8"]
    commands = [shlex.split(line) for line in lines]
    # magma-cuda128 in the image with conda-build only, pytorch in the one that adds its cuDNN 9.10.2.21 (the
    # base's cuDNN is not known: its tag moves): each probed and built once, before the first build in it
    for tag, cudnn in ((containers.derivation("12.8", image).tag, ""),
                       (containers.derivation("12.8", image, "9.10.2.21").tag, "9.10.2.21")):
        folder = out / "images" / tag.split(":")[1]
        probe = commands.index(["docker", "image", "inspect", tag])
        build = commands.index(["docker", "build", "--tag", tag, "--file", str(folder / "Dockerfile"), str(folder)])
        (run,) = [i for i, argv in enumerate(commands) if argv[:2] == ["docker", "run"] and tag in argv]
        assert probe + 1 == build < run
        env = docker_run(lines[run])[1]
        assert env["CUDA_HOME"] == "/usr/local/cuda-12.8"
        assert env.get("CUDNN_LIB_DIR") == (f"/opt/torchforge-cudnn/{cudnn}/lib" if cudnn else None)
    assert sum(argv[:2] == ["docker", "build"] for argv in commands) == 2
    assert not out.exists()  # nothing written by a dry run


def test_a_site_image_entry_skips_the_derivation(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    config = tmp_path / "site.toml"
    config.write_text('[images."12.8"]\nimage = "registry.example/torchforge/builder:cuda12.8"\n'
                      'cuda_home = "/usr/local/cuda-12.8"\nglibc = "2.28"\n')
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--py", "3.12",
                                     "--out", str(tmp_path / "out"), "--config", str(config))
    assert code == 0, err
    assert not any(line.startswith(("docker build", "docker image")) for line in lines)
    assert "registry.example/torchforge/builder:cuda12.8 conda build" in lines[-1]
    # a site `base` is derived like the data's
    config.write_text('[images."13.2"]\nbase = "registry.example/cuda:13.2"\ncuda_home = "/usr/local/cuda-13.2"\n')
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2", "--py", "3.12",
                                     "--out", str(tmp_path / "out"), "--config", str(config))
    assert code == 0, err
    assert any(line.startswith("docker build --tag torchforge/builder:cuda13.2-") for line in lines)
    config.write_text('[images."13.2"]\nimage = "a"\nbase = "b"\ncuda_home = "/usr/local/cuda-13.2"\n')
    assert main(["build", "--dry-run", "--container", "--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2", "--py", "3.12",
                 "--out", str(tmp_path / "out"), "--config", str(config)]) == ExitCode.USAGE
    assert "exactly one of image" in capsys.readouterr().err
    # keys and cuda_home are checked as the data's are: a CUDA torchforge does not know, a relative toolkit path,
    # a cpu image with a toolkit; each refused with what was wrong, before anything is planned
    for entry, words in (('[images."99.9"]\nimage = "a"\n', "CUDA 99.9 is missing from cuda.toml"),
                         ('[images."13.2"]\nimage = "a"\ncuda_home = "cuda"\n', "cuda_home 'cuda' is not an absolute"),
                         ('[images.cpu]\nimage = "a"\ncuda_home = "/usr/local/cuda"\n', "a cpu image has no cuda_home")):
        config.write_text(entry)
        assert main(["build", "--dry-run", "--container", "--pytorch", "2.12.0", "--flavour", "official", "--cuda", "13.2", "--py", "3.12",
                     "--out", str(tmp_path / "refused"), "--config", str(config)]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert words in err and "key is cpu or a CUDA X.Y" in err and not (tmp_path / "refused").exists()


def test_the_derived_image_is_built_only_when_the_tool_lacks_its_tag(tmp_path: Path) -> None:
    """A stand-in container client (a real executable run by the real runner) that records its argv and
    knows the tags it was asked to build."""
    tool = tmp_path / "bin" / "docker"
    tool.parent.mkdir()
    calls = tmp_path / "calls"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    f'if [ "$1" = image ]; then grep -qx "build --tag $3 .*" {calls}; exit $?; fi\n'
                    '[ "$1" = build ] && test -s "$5" && test -s "$(dirname "$5")/derive.sh"\n')
    tool.chmod(0o755)
    settings = containers.ContainerSettings(str(tool))
    out = tmp_path / "out"
    first = containers.ensure_derived("12.8", settings, Runner(), out)
    assert first is not None
    folder = containers.derived_folder(out, first)
    assert (folder / "Dockerfile").read_text() == first.files["Dockerfile"]
    assert (folder / "derive.sh").read_text() == first.script
    again = containers.ensure_derived("12.8", settings, Runner(), out)
    assert again == first
    verbs = [line.split()[0] for line in calls.read_text().splitlines()]
    assert verbs == ["image", "build", "image"]  # probed twice, built once
    assert containers.ensure_derived("11.8", settings, Runner(), out) is None  # an image used as it is
    assert not list(out.rglob(".torchforge-tmp-*"))


def test_ci_runs_a_2_28_base_as_the_job_container_and_derives_conda_build_in_it(tmp_path: Path) -> None:
    (pytorch, accel, python, _), expected = ERAS["2.6+-split-cuda"]  # 2.9.0, CUDA 12.8
    image = containers.load_table().images[accel]
    (variant,) = plan(selection(pytorch, accel, python)).variants
    derived = containers.derivation(accel, image, variant.cudnn or "")  # the same as `torchforge build --container`
    assert derived.cudnn == "9.10.2.21"
    args = ["--pytorch", pytorch, "--flavour", "official", "--cuda", accel, "--py", python, "--out", str(tmp_path),
            "--wheel", str(self_wheel())]
    assert main(["ci", "github", *args]) == 0 and main(["ci", "gitlab", *args]) == 0
    github = YAML(typ="safe").load((tmp_path / Provider.GITHUB.path).read_text())
    gitlab = YAML(typ="safe").load((tmp_path / Provider.GITLAB.path).read_text())
    job = next(body for body in github["jobs"].values() if body.get("name") == variant.id)
    # GitHub: the whole job in the AlmaLinux 8 base (glibc 2.28 runs node20), conda-build and cuDNN added first
    assert job["container"] == {"image": "pytorch/manylinux2_28-builder:cuda12.8"}
    cudnn_env = {"CUDNN_INCLUDE_DIR": "/opt/torchforge-cudnn/9.10.2.21/include",
                 "CUDNN_LIB_DIR": "/opt/torchforge-cudnn/9.10.2.21/lib"}
    assert job["env"] == {"CUDA_HOME": "/usr/local/cuda-12.8", **cudnn_env}
    names = [step["name"] for step in job["steps"]]
    assert names[:3] == ["Check out", "Add conda-build and cuDNN 9.10.2.21 to the image (torchforge's derivation)",
                         "Install torchforge"]
    assert "Set up Python for torchforge" not in names
    assert job["steps"][1]["run"].startswith(derived.script)  # the same script the derived Dockerfile runs
    (build,) = [s["run"] for s in job["steps"] if s.get("run", "").startswith("torchforge build")]
    assert "--container" not in shlex.split(build)  # already inside the image
    # GitLab: `image:` is the base; the script derives first (in a subshell), then builds with that conda on PATH
    body = gitlab[variant.id]
    assert body["image"] == "pytorch/manylinux2_28-builder:cuda12.8"
    assert body["variables"] == {"CUDA_HOME": "/usr/local/cuda-12.8", **cudnn_env}
    assert body["script"][0] == f"(\n{derived.script})\n"
    assert body["script"][1] == 'export PATH="/opt/torchforge-conda/bin:$PATH"'
    assert "--container" not in body["script"][-1]


def test_doctor_names_the_base_and_derived_image_a_machine_without_the_toolkit_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no nvcc here
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    report = official_report("2.9.0", "12.8,13.2", "3.12", out=tmp_path)
    checks = {c.name: c for c in report.checks}
    assert checks["nvcc (CUDA 12.8)"].status.value == "fail"
    found = checks["image (CUDA 12.8)"]
    tag = containers.derivation("12.8", containers.load_table().images["12.8"]).tag
    assert found.status.value == "ok"
    assert found.detail.startswith(f"{tag} (derived from pytorch/manylinux2_28-builder:cuda12.8: conda-build added)")
    assert "--container" in (found.fix or "")
    assert checks["image (CUDA 13.2)"].status.value == "warn"
