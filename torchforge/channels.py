"""Which channels a recipe's requirements come from: torchforge/data/channels.toml, then a site's torchforge.toml.

`for_pytorch` / `for_magma` give the data's channels of one package (after the output channel and the
--channel ones, which the pipeline puts first). A site config (`SiteConfig`, read by torchforge/config.py)
replaces them or rewrites URL prefixes to mirrors, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import field_validator

from torchforge import localchannel, versions
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import DataError


class Channel(FrozenModel):
    url: str
    platforms: tuple[str, ...] | None = None


class Rule(FrozenModel):
    package: Literal["pytorch", "magma"] = "pytorch"
    pytorch: str | None = None
    python: str | None = None
    cuda: str | None = None
    accel: Literal["cuda", "cpu"] | None = None
    platforms: tuple[str, ...] | None = None
    channels: tuple[str, ...]
    source: str

    @field_validator("pytorch", "python", "cuda")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        return versions.checked_specifier(value)


class ChannelsTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    channels: dict[str, Channel]
    rules: tuple[Rule, ...]


def parse_table(text: str, where: str = "torchforge/data/channels.toml") -> ChannelsTable:
    table = parse_table_as(ChannelsTable, text, where)
    for number, rule in enumerate(table.rules, 1):
        for name in rule.channels:
            if name not in table.channels:
                raise DataError(f"{where} rule {number} names unknown channel {name!r}",
                                f"known channels: {', '.join(table.channels)}")
    return table


@cache
def load_table() -> ChannelsTable:
    return parse_table(data_text("channels"))


@dataclass(frozen=True)
class SiteChannels:
    """The [channels] of a torchforge.toml: `replace` stands for every data channel; `mirrors` rewrites URL prefixes."""

    replace: tuple[str, ...] | None = None
    mirrors: Mapping[str, str] = field(default_factory=dict)
    where: str = ""

    def apply(self, urls: tuple[str, ...]) -> tuple[str, ...]:
        chosen = self.replace if self.replace is not None else urls
        return tuple(self._mirror(url) for url in chosen)

    def _mirror(self, url: str) -> str:
        # The longest matching prefix wins, so a mirror of one channel can override a mirror of its host.
        for prefix in sorted(self.mirrors, key=len, reverse=True):
            if url.startswith(prefix):
                return self.mirrors[prefix] + url[len(prefix):]
        return url


def _matches(rule: Rule, package: str, pytorch: str, python: str | None, accel: str, platform: str) -> bool:
    if rule.package != package:
        return False
    if rule.platforms is not None and platform not in rule.platforms:
        return False
    if rule.accel is not None and (rule.accel == "cuda") != (accel != "cpu"):
        return False
    if rule.pytorch is not None and not versions.matches(pytorch, rule.pytorch):
        return False
    if rule.python is not None and (python is None or not versions.matches(python, rule.python)):
        return False
    if rule.cuda is not None and (accel == "cpu" or not versions.matches(accel, rule.cuda)):
        return False
    return True


def data_channels(package: str, pytorch: str, python: str | None, accel: str, platform: str,
                  table: ChannelsTable | None = None) -> tuple[str, ...]:
    """The data's channel URLs of one package, in rule order, each once."""
    table = table or load_table()
    urls: list[str] = []
    for rule in table.rules:
        if not _matches(rule, package, pytorch, python, accel, platform):
            continue
        for name in rule.channels:
            channel = table.channels[name]
            if channel.platforms is not None and platform not in channel.platforms:
                continue
            if channel.url not in urls:
                urls.append(channel.url)
    return tuple(urls)


def for_pytorch(pytorch: str, python: str, accel: str, platform: str,
                site: SiteChannels | None = None) -> tuple[str, ...]:
    """The channels of a pytorch package of that release, Python, accel (cpu or X.Y) and platform."""
    urls = data_channels("pytorch", pytorch, python, accel, platform)
    return (site or SiteChannels()).apply(urls)


def for_magma(cuda: str, pytorch: str, site: SiteChannels | None = None) -> tuple[str, ...]:
    """The channels of the magma-cudaXYZ package of CUDA `cuda` that PyTorch `pytorch` builds against."""
    urls = data_channels("magma", pytorch, None, cuda, "linux-64")
    return (site or SiteChannels()).apply(urls)


def build_channels(out: Path, extra: tuple[str, ...], data: tuple[str, ...]) -> tuple[str, ...]:
    """Every channel of one build, in priority order: the output channel, --channel ones, the package's own."""
    ordered = [f"file://{out.resolve()}", *map(engine_channel, extra), *data]
    return tuple(dict.fromkeys(ordered))


def engine_channel(channel: str) -> str:
    """A --channel as the engines get it: a local folder (`torch-channel` where that folder is, ./x, /x, ~/x) as its
    absolute file:// URL, as --for and `install` read it (an engine takes a bare word for a channel name of
    anaconda.org); a URL, or a name that is no folder here (conda-forge), as given."""
    folder = localchannel.folder_of(channel)
    return channel if folder is None or channel.startswith("file://") else f"file://{folder.resolve()}"
