"""What a build asks for beyond its Request (engine, format, output, checks, cache), and a build ready to run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torchforge.channels import SiteChannels
from torchforge.engines import Engine
from torchforge.flavours.base import JOBS_VARIABLE, Request
from torchforge.pipeline import BuildSettings, Step
from torchforge.remotecache import remote_cache

if TYPE_CHECKING:
    from torchforge.binaries.plan import PackagePlan


@dataclass(frozen=True)
class BuildOptions:
    """How `build` builds a request: engine, format, output, checks and cache (the flags beyond the Request)."""

    engine: str = "auto"
    fmt: str = "conda"  # conda (packages in a channel) or wheel
    channels: tuple[str, ...] = ()
    out: Path = Path("forge-channel")
    jobs: int | None = None
    force: bool = False
    keep_going: bool = False
    dry_run: bool = False
    test: bool = True
    skip_preflight: bool = False
    container: bool = False
    config: Path | None = None
    cache_root: Path | None = None
    use_cache: bool = True
    keep_work: bool = False
    cache_url: str | None = None  # --cache-url (or the stack file's): ccache's remote storage, beside the local cache
    cache_read_only: bool = False  # --cache-read-only: the remote's hits are used, nothing is written to it

    def settings(self, request: Request, site_channels: SiteChannels, **more: object) -> BuildSettings:
        """The pipeline's settings of a build of `request` with these options (`more`: the flavour's own)."""
        env_flags = dict(request.flavour_flags).get("--env") or ()
        env_jobs = any(str(item).split("=", 1)[0] == JOBS_VARIABLE for item in env_flags)  # type: ignore[union-attr]
        return BuildSettings(out=self.out, channels=self.channels, force=self.force, keep_going=self.keep_going,
                             test=self.test, patches=request.patches, site_channels=site_channels,
                             use_cache=self.use_cache, cache_root=self.cache_root, keep_work=self.keep_work,
                             size_jobs=self.jobs is None and not env_jobs,
                             remote_cache=remote_cache(self.cache_url, read_only=self.cache_read_only),
                             **more)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PreparedBuild:
    """A build ready to run: its steps in order, the engine that runs them and the settings they run with."""

    steps: tuple[Step, ...]
    engine: Engine
    settings: BuildSettings
    brought_along: tuple[PackagePlan, ...] = ()  # repacked into the output channel before the steps run


@dataclass(frozen=True)
class Rendered:
    """`render`'s outcome: the recipe folders written (all or none), the plan's warnings, the closing line."""

    written: tuple[Path, ...]
    warnings: tuple[str, ...]
    summary: str
