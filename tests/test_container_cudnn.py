"""The cuDNN of a container build: the image must carry exactly the cuDNN the variant's build string names
and its package bundles. A derived image adds it from NVIDIA's pinned pip wheel (one image per CUDA and
cuDNN, CUDNN_LIB_DIR/CUDNN_INCLUDE_DIR pointed at it); an image entry with another cuDNN fails preflight."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shlex
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_channels import docker_run, dry_run_lines, selection
from torchforge import containers
from torchforge.cli import main
from torchforge.config import load as load_site
from torchforge.errors import ExitCode
from tests.official_report import official_report
from torchforge.proc import Command, Runner
from torchforge.flavours.official.render import plan

CUDNN_ENV = ("CUDNN_INCLUDE_DIR", "CUDNN_LIB_DIR")


def pytorch_run(lines: list[str], pytorch: str, cuda: str) -> tuple[dict[str, str], str]:
    """(--env values, image) of the dry run's `docker run` of the pytorch build."""
    (variant,) = plan(selection(pytorch, cuda, "3.12")).variants
    (line,) = [line for line in lines if line.startswith("docker run") and f"/recipes/{variant.id} " in line]
    _, env, _, image, _ = docker_run(line)
    return env, image


@pytest.mark.parametrize(("pytorch", "cudnn"), [("2.11.0", "9.19.0.56"), ("2.9.0", "9.13.0.50")])
def test_each_cu130_release_derives_an_image_with_its_own_cudnn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        pytorch: str, cudnn: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # a dry run needs no container client
    out = tmp_path / "out"
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", pytorch, "--flavour", "official", "--cuda", "13.0", "--py", "3.12",
                                     "--out", str(out), "--no-cache")
    assert code == 0, err
    (variant,) = plan(selection(pytorch, "13.0", "3.12")).variants
    assert variant.cudnn == cudnn and f"_cudnn{cudnn.rsplit('.', 1)[0]}_" in variant.build_string
    env, tag = pytorch_run(lines, pytorch, "13.0")
    # one image per (CUDA, cuDNN): its tag names both, and it is built before the build runs in it
    assert tag.startswith(f"torchforge/builder:cuda13.0-cudnn{cudnn}-")
    folder = out / "images" / tag.split(":")[1]
    commands = [shlex.split(line) for line in lines]
    build = commands.index(["docker", "build", "--tag", tag, "--file", str(folder / "Dockerfile"), str(folder)])
    assert build < next(i for i, line in enumerate(lines) if line.startswith("docker run") and tag in line)
    assert f"+ cuDNN {cudnn} in /opt/torchforge-cudnn/{cudnn} (" in err
    # the build finds that cuDNN (CMake's FindCUDNN, and build.sh's bundling step) and no other
    assert {name: env[name] for name in CUDNN_ENV} == {"CUDNN_INCLUDE_DIR": f"/opt/torchforge-cudnn/{cudnn}/include",
                                                     "CUDNN_LIB_DIR": f"/opt/torchforge-cudnn/{cudnn}/lib"}
    # the rendered files: the wheel of the build string's cuDNN for CUDA 13, pinned by the data's sha256
    derived = containers.derivation("13.0", containers.load_table().images["13.0"], cudnn)
    assert derived.tag == tag
    pins = containers.load_table().cudnn_wheels.sha256[f"nvidia-cudnn-cu13=={cudnn}"]
    line = f"nvidia-cudnn-cu13=={cudnn} " + " ".join(f"--hash=sha256:{h}" for h in pins)
    assert f"printf '%s\\n' '{line}' >" in derived.files["cudnn.sh"]
    assert "--require-hashes" in derived.files["cudnn.sh"] and "--no-deps" in derived.files["cudnn.sh"]
    assert "COPY cudnn.sh /tmp/torchforge-cudnn.sh" in derived.files["Dockerfile"].splitlines()
    # magma needs no cuDNN: it runs in the image with conda-build only
    magma = [argv for argv in commands if argv[:2] == ["docker", "run"] and any("/recipes/magma-" in a for a in argv)]
    assert magma and not any(f"cudnn{cudnn}" in word for word in magma[0])
    assert not out.exists()


def test_the_two_cu130_releases_get_different_images() -> None:
    image = containers.load_table().images["13.0"]
    tags = {containers.derivation("13.0", image, cudnn).tag for cudnn in ("9.19.0.56", "9.13.0.50", "")}
    assert len(tags) == 3


def _wheel(folder: Path, version: str) -> Path:
    """A wheel laid out as NVIDIA's nvidia-cudnn-cu13 (nvidia/cudnn/{include,lib}), small enough to build here."""
    name = f"nvidia_cudnn_cu13-{version}"
    files = {
        "nvidia/cudnn/include/cudnn.h": b'#include "cudnn_version.h"\n',
        "nvidia/cudnn/include/cudnn_version.h": b"#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 19\n#define CUDNN_PATCHLEVEL 0\n",
        "nvidia/cudnn/lib/libcudnn.so.9": b"\x7fELF stand-in\n",
        "nvidia/cudnn/lib/libcudnn_graph.so.9": b"\x7fELF stand-in\n",
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: nvidia-cudnn-cu13\nVersion: {version}\n".encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()]
    files[f"{name}.dist-info/RECORD"] = ("\n".join([*record, f"{name}.dist-info/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    folder.mkdir(parents=True)
    wheel = folder / f"{name}-py3-none-any.whl"
    wheel.write_bytes(buffer.getvalue())
    return wheel


def test_the_cudnn_step_installs_the_pinned_wheel_and_removes_the_bases_cudnn(tmp_path: Path) -> None:
    """The rendered step run for real with this machine's pip, against a local wheel of the same layout as
    NVIDIA's: the files land in the versioned folder with the unversioned links, the base's cuDNN goes, and
    a wheel whose sha256 is not the pinned one is refused."""
    version = "9.19.0.56"
    wheel = _wheel(tmp_path / "wheels", version)
    cuda = tmp_path / "cuda-13.0"
    for path in ("include/cudnn.h", "include/cudnn_version.h", "lib64/libcudnn.so.9", "lib64/libcublas.so.13"):
        (cuda / path).parent.mkdir(parents=True, exist_ok=True)
        (cuda / path).write_text("base image\n")
    python = str(Path(sys.executable))  # a python with pip, as the derived conda's
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheel.parent), "PATH": os.environ["PATH"]}

    def run(digest: str, target: Path) -> int:
        pinned = containers.CudnnWheel("nvidia-cudnn-cu13", version, (digest,))
        script = tmp_path / "cudnn.sh"
        script.write_text(containers.cudnn_step(pinned, python=python, cudnn_dir=str(target), cuda_home=str(cuda),
                                                base="registry.example/cuda:13.0"))
        return Runner().run(Command(("sh", str(script)), env=env), check=False).returncode

    assert run("0" * 64, tmp_path / "refused") != 0  # another wheel than the pinned one
    assert not (tmp_path / "refused").exists() and (cuda / "include" / "cudnn.h").exists()
    target = tmp_path / "opt" / version
    assert run(hashlib.sha256(wheel.read_bytes()).hexdigest(), target) == 0
    assert "CUDNN_MINOR 19" in (target / "include" / "cudnn_version.h").read_text()
    for name in ("libcudnn", "libcudnn_graph"):  # CMake's find_library(cudnn) needs the unversioned name
        assert os.readlink(target / "lib" / f"{name}.so") == f"{name}.so.9"
    assert sorted(p.name for p in cuda.rglob("*") if p.is_file()) == ["libcublas.so.13"]  # the base's cuDNN is gone


def _site(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "site.toml"
    # a local channel instead of the data's: preflight's channel checks stay on this machine
    (tmp_path / "channel").mkdir(exist_ok=True)
    config.write_text(f'[channels]\nreplace = ["file://{tmp_path / "channel"}"]\n{text}')
    return config


def test_a_site_image_with_another_cudnn_fails_preflight_before_anything_is_built(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = _site(tmp_path, '[images."12.8"]\nimage = "registry.example/builder:cuda12.8"\n'
                             'cuda_home = "/usr/local/cuda-12.8"\ncudnn = "9.19.0.56"\n')
    request = ["--container", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--py", "3.12", "--config", str(config)]
    out = tmp_path / "out"
    assert main(["doctor", *request, "--out", str(out), "--json"]) == ExitCode.PREFLIGHT_FAILED
    report = capsys.readouterr().out
    # this machine's cuDNN is not looked at: the image's is what the build bundles
    assert '"name": "image (CUDA 12.8)"' in report and '"name": "bundled libcudnn' not in report
    for words in ("registry.example/builder:cuda12.8 carries cuDNN 9.19.0.56", "bundle cuDNN 9.10.2.21",
                  'cudnn = \\"9.10.2.21\\"', "or a base there"):
        assert words in report
    # the build stops at the same check (podman or docker on this machine; a stand-in where neither is)
    tools = tmp_path / "bin"
    tools.mkdir()
    if containers.probe_tool() is None:
        (tools / "docker").write_text("#!/bin/sh\nexit 1\n")
        (tools / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:{tools}")
    # (at plan time, before the machine checks: the cuDNN is the plan's and the image's, not this machine's)
    assert main(["build", *request, "--out", str(out)]) == ExitCode.PREFLIGHT_FAILED
    err = capsys.readouterr().err
    assert "carries cuDNN 9.19.0.56" in err and "bundle cuDNN 9.10.2.21" in " ".join(err.split())
    assert not out.exists()  # nothing built, nothing written
    # a dry run has no preflight, but stops at the same cuDNN check (it would print builds that cannot run)
    assert main(["build", "--dry-run", *request, "--out", str(out)]) == ExitCode.PREFLIGHT_FAILED
    err = capsys.readouterr().err
    assert "carries cuDNN 9.19.0.56" in err and "[dry-run]" not in err
    # --skip-preflight skips the machine's checks, not this one: the plan cannot build in that image
    assert main(["build", "--skip-preflight", *request, "--out", str(out)]) == ExitCode.PREFLIGHT_FAILED
    assert "carries cuDNN 9.19.0.56" in capsys.readouterr().err and not out.exists()
    # a CI file would run the same build in that image: refused as well, nothing written
    ci_out = tmp_path / "ci"  # the repository: the jobs read the site config from their checkout of it
    ci_out.mkdir()
    (ci_out / "site.toml").write_bytes(config.read_bytes())
    in_repo = [*request[1:request.index("--config")], "--config", "site.toml"]
    monkeypatch.chdir(ci_out)  # as a user runs it, from the repository's root
    assert main(["ci", "gitlab", *in_repo, "--out", str(ci_out)]) == ExitCode.USAGE
    assert "carries cuDNN 9.19.0.56" in capsys.readouterr().err and os.listdir(ci_out) == ["site.toml"]


def test_cudnn_checks_per_kind_of_image(tmp_path: Path) -> None:
    def row(text: str, pytorch: str, cuda: str, python: str = "3.10") -> tuple[str, str, str]:
        site = load_site(_site(tmp_path, text))
        report = official_report(pytorch, cuda, python, out=tmp_path, site=site,
                                 container=containers.ContainerSettings("docker", site.images))
        check = report.check(f"image ({'cpu' if cuda == 'cpu' else 'CUDA ' + cuda})")
        return check.status.value, check.detail, check.fix or ""

    image = '[images."12.8"]\nimage = "registry.example/b:12.8"\ncuda_home = "/usr/local/cuda-12.8"\n'
    # the same cuDNN: nothing to add, nothing to set
    status, detail, _ = row(image + 'cudnn = "9.10.2.21"\n', "2.9.0", "12.8")
    assert status == "ok" and "cuDNN 9.10.2.21" in detail
    # not known: a warning, not a failure
    status, detail, fix = row(image, "2.9.0", "12.8")
    assert status == "warn" and "cuDNN of registry.example/b:12.8 is not known" in detail and "cudnn = " in fix
    # a base carrying the variant's cuDNN is derived without the cuDNN step
    status, detail, _ = row(image.replace("image =", "base =") + 'cudnn = "9.10.2.21"\n', "2.9.0", "12.8")
    assert status == "ok" and "and cuDNN" not in detail
    # cuDNN 8.3 has no pip wheel: a base cannot be given it
    status, detail, fix = row('[images."11.6"]\nbase = "registry.example/cuda:11.6"\ncuda_home = "/usr/local/cuda-11.6"\n',
                              "1.12.1", "11.6")
    assert status == "fail" and "no pip wheel of it for CUDA 11.6" in detail and 'cudnn = "8.3.2.44"' in fix
    # no bundled cuDNN (cpu; 1.10 links cuDNN statically): no cuDNN check at all
    assert row("", "2.9.0", "cpu")[0] == "ok"
    assert row("", "1.10.2", "11.3", "3.9")[0] == "ok"


def test_an_image_with_the_variants_cudnn_needs_no_extra_step(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    request = ["--container", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--py", "3.12", "--out", str(tmp_path / "out")]
    # an image used as it is: no derivation, no cuDNN folder to point at
    config = _site(tmp_path, '[images."12.8"]\nimage = "registry.example/b:12.8"\ncuda_home = "/usr/local/cuda-12.8"\n'
                             'cudnn = "9.10.2.21"\n')
    code, lines, err = dry_run_lines(capsys, *request, "--config", str(config))
    assert code == 0, err
    env, image = pytorch_run(lines, "2.9.0", "12.8")
    assert image == "registry.example/b:12.8" and not set(CUDNN_ENV) & set(env)
    assert not any(line.startswith(("docker build", "docker image")) for line in lines)
    # a base that carries it: the image with conda-build only, the same one magma builds in
    config = _site(tmp_path, '[images."12.8"]\nbase = "registry.example/cuda:12.8"\ncuda_home = "/usr/local/cuda-12.8"\n'
                             'cudnn = "9.10.2.21"\n')
    code, lines, err = dry_run_lines(capsys, *request, "--config", str(config))
    assert code == 0, err
    env, image = pytorch_run(lines, "2.9.0", "12.8")
    site_image = load_site(config).images["12.8"]
    assert image == containers.derivation("12.8", site_image).tag == containers.derivation("12.8", site_image, "9.10.2.21").tag
    assert "cuda12.8-cudnn" not in image and not set(CUDNN_ENV) & set(env)
    assert sum(line.startswith("docker build") for line in lines) == 1


def test_every_cudnn_of_a_release_built_in_a_base_image_has_a_pinned_wheel() -> None:
    """Each cuDNN pytorch.toml names for a CUDA version whose data image is a base can be added to it."""
    from torchforge import data as tables

    images = containers.load_table().images
    for release, facts in tables.load().pytorch.releases.items():
        for cuda, build in facts.cuda.items():
            image = images.get(cuda)
            if image is None or not image.derived:
                continue
            for cudnn in {build.cudnn, *(p.cudnn[cuda] for p in facts.patch.values() if cuda in p.cudnn)} - {None}:
                wheel = containers.cudnn_wheel(cuda, str(cudnn))
                assert wheel is not None, (release, cuda, cudnn)
                assert wheel.package == f"nvidia-cudnn-cu{cuda.split('.')[0]}"
