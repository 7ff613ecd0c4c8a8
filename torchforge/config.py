"""A site's torchforge.toml: the channels and build images of this site (mirrors, air-gapped installs).

Found as `--config PATH`, else `./torchforge.toml` in the current folder; none means the data's defaults.

    [channels]
    replace = ["https://mirror.example/conda/main", "file:///srv/conda/pytorch"]   # instead of every data channel
    mirrors = { "https://conda.anaconda.org/" = "https://mirror.example/conda/" }  # URL prefix -> mirror prefix

    [images."11.8"]
    image = "registry.example/pytorch/conda-builder:cuda11.8"   # used as it is (a pushed derived image too)
    cuda_home = "/usr/local/cuda-11.8"
    conda_build = true
    glibc = "2.17"                                               # < 2.28: GitHub jobs run it with --container
    cudnn = "8.7.0.84"                                           # the cuDNN it carries: variants bundling another are refused

    [images."12.8"]
    base = "registry.example/cuda:12.8"                          # torchforge derives conda-build into it
    cuda_home = "/usr/local/cuda-12.8"

    [ci]
    gpu_runner = "self-hosted+gpu"                               # labels of `torchforge ci`'s CUDA test jobs
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from torchforge.channels import SiteChannels
from torchforge import data as tables
from torchforge.containers import Image, check_keyed_entry
from torchforge.errors import DataError, UsageError
from torchforge.fileops import read_utf8

FILE_NAME = "torchforge.toml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Channels(_Strict):
    replace: tuple[str, ...] | None = None
    mirrors: dict[str, str] = {}


class _Image(_Strict):
    image: str = ""
    base: str = ""
    cuda_home: str = ""
    provides: str = "named in torchforge.toml"
    cudnn: str = ""  # the image's cuDNN (X.Y.Z.B); "" = not known
    conda_build: bool = True
    glibc: str = ""


class _Ci(_Strict):
    gpu_runner: str | None = None  # runner labels of the CUDA test jobs of `torchforge ci`, joined with '+'


class _File(_Strict):
    channels: _Channels = _Channels()
    images: dict[str, _Image] = {}
    ci: _Ci = _Ci()


@dataclass(frozen=True)
class SiteConfig:
    channels: SiteChannels = field(default_factory=SiteChannels)
    images: dict[str, Image] = field(default_factory=dict)
    path: Path | None = None
    gpu_runner: str | None = None  # [ci] gpu_runner


def _check_url(url: str, where: str) -> str:
    if "://" in url or Path(url).is_absolute():
        return url
    raise UsageError(f"{where}: {url!r} is neither a URL nor an absolute path",
                     "write https://host/channel, file:///abs/path or /abs/path")


def load(path: Path | None = None, cwd: Path | None = None) -> SiteConfig:
    """The site config of `--config PATH`, else ./torchforge.toml, else the data's defaults."""
    if path is None:
        candidate = (cwd or Path.cwd()) / FILE_NAME
        if not candidate.is_file():
            return SiteConfig()
        path = candidate
    try:
        raw = tomllib.loads(read_utf8(path))
    except OSError as exc:
        raise UsageError(f"cannot read the config file {path}: {exc.strerror}", "pass an existing file to --config") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", "fix the file; the message gives the position") from exc
    try:
        spec = _File.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: " + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        raise UsageError(f"{path} is not a valid torchforge config: {problems}",
                         "allowed: [channels] replace, mirrors; [images.\"X.Y\"] image or base, cuda_home, provides, "
                         "cudnn, conda_build, glibc; [ci] gpu_runner") from exc
    where = str(path)
    replace = tuple(_check_url(u, f"{where} [channels] replace") for u in spec.channels.replace) \
        if spec.channels.replace is not None else None
    mirrors = {prefix: _check_url(target, f"{where} [channels] mirrors") for prefix, target in spec.channels.mirrors.items()}
    images = {key: Image(image=i.image, base=i.base, cuda_home=i.cuda_home, provides=i.provides,
                         cudnn=i.cudnn, conda_build=i.conda_build, glibc=i.glibc, source=where) for key, i in spec.images.items()}
    for key, image in images.items():
        try:
            check_keyed_entry(key, image, f"{where} [images.\"{key}\"]", tables.load().cuda.toolkits,
                              cuda_home_required=False)
        except DataError as exc:
            raise UsageError(exc.message, "an [images.\"X.Y\"] key is cpu or a CUDA X.Y (\"12.8\"); write "
                                          "image = \"registry/name:tag\" or base = \"registry/name:tag\", cuda_home "
                                          "= \"/usr/local/cuda-12.8\" (absolute; default /usr/local/cuda), "
                                          "cudnn = \"9.10.2.21\" (the full version)") from exc
    return SiteConfig(SiteChannels(replace, mirrors, where), images, path, spec.ci.gpu_runner)
