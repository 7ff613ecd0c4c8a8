"""Doctor's channel checks: each channel of the plan answers (or is a local folder with an index), and the
build and host requirements of each recipe the plan names (flavours.base.RequirementSolve) solve from them (py-rattler, nothing is built).

When a solve fails, every requirement without a matching package in those channels is named, with the
channels it was looked for in; when each has candidates but they conflict, the solver's own message is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchforge import channels as channel_data
from torchforge import fileops, localchannel
from torchforge.aio import run_async
from torchforge.flavours.base import RequirementSolve

_MAX_SOLVER_TEXT = 400


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "ok", "warn" or "fail" (preflight.Level values)
    detail: str
    fix: str | None = None


def _problem(url: str, platform: str, gateway: object) -> str | None:
    """Why `url` cannot serve repodata for `platform` (None: it answers)."""
    import rattler
    from rattler.exceptions import FetchRepoDataError, GatewayError

    local = localchannel.folder_of(url)
    if local is not None:
        if not local.is_dir():
            return f"the folder {local} does not exist"
        if not (local / "noarch" / "repodata.json").is_file():
            return f"{local} has no noarch/repodata.json (not an indexed channel)"
        return None
    # One subdir after the other, the platform's first: both at once reported whichever failed first, so the URL
    # an unreachable channel is named by changed from run to run (noarch or linux-64).
    for subdir in (platform, "noarch"):
        try:
            run_async(gateway.query([rattler.Channel(url)], [subdir], ["python"], recursive=False))  # type: ignore[attr-defined]
        except (FetchRepoDataError, GatewayError, OSError) as exc:
            return f"does not answer: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def _missing(specs: Sequence[str], urls: Sequence[str], platform: str, gateway: object) -> list[str]:
    """The specs no record in `urls` matches."""
    import rattler

    missing: list[str] = []
    channels = [rattler.Channel(u) for u in urls]
    for spec in specs:
        match = rattler.MatchSpec(spec)
        found = run_async(gateway.query(channels, [platform, "noarch"], [match], recursive=False))  # type: ignore[attr-defined]
        if not any(match.matches(record) for records in found for record in records):
            missing.append(spec)
    return missing


def _solve(specs: Sequence[str], urls: Sequence[str], platform: str, gateway: object) -> str | None:
    import rattler
    from rattler.exceptions import SolverError

    try:
        run_async(rattler.solve([rattler.Channel(u) for u in urls], list(specs), gateway=gateway,  # type: ignore[arg-type]
                                  platforms=[platform, "noarch"], virtual_packages=rattler.VirtualPackage.detect()))
    except SolverError as exc:
        text = " ".join(str(exc).split())
        return text[:_MAX_SOLVER_TEXT] + ("..." if len(text) > _MAX_SOLVER_TEXT else "")
    return None


def check(solves: Sequence[RequirementSolve], *, out: Path, extra: tuple[str, ...], site: channel_data.SiteChannels,
          cache_dir: Path | None = None) -> list[Finding]:
    """One finding per channel of the recipes, then one per recipe's requirements. py-rattler runs in a child
    process (torchforge.rattlerchild)."""
    from torchforge.rattlerchild import call

    return call("torchforge.channelcheck:_check_here", list(solves), out, extra, site, cache_dir)  # type: ignore[no-any-return]


def _answering(wanted: Sequence[tuple[str, str]], out_url: str, gateway: object,
               findings: list[Finding]) -> dict[str, str | None]:
    """url -> why it does not answer (None: it does), for each (platform, url) once; a finding per URL."""
    answering: dict[str, str | None] = {}
    for platform, url in wanted:
        if url == out_url or url in answering:
            continue  # the output channel is created and indexed by the build itself
        problem = _problem(url, platform, gateway)
        answering[url] = problem
        if problem is None:
            findings.append(Finding(f"channel {url}", "ok", "answers"))
        else:
            findings.append(Finding(
                f"channel {url}", "fail", problem,
                "check the network or proxy, or name a reachable mirror in torchforge.toml [channels] "
                "(replace or mirrors); a local channel needs an index (`torchforge upload --to file://...` writes one)"))
    return answering


def check_answering(channels: Sequence[tuple[str, str]], *, out: Path, extra: tuple[str, ...],
                    site: channel_data.SiteChannels, cache_dir: Path | None = None) -> list[Finding]:
    """One finding per channel a plan reads ((platform, URL) pairs, before the site config), in a child process."""
    from torchforge.rattlerchild import call

    return call("torchforge.channelcheck:_answering_here", list(channels), out, extra, site, cache_dir)  # type: ignore[no-any-return]


def _answering_here(channels: Sequence[tuple[str, str]], out: Path, extra: tuple[str, ...],
                    site: channel_data.SiteChannels, cache_dir: Path | None) -> list[Finding]:
    from rattler import Gateway

    findings: list[Finding] = []
    wanted = [(platform, url) for platform, data in channels
              for url in channel_data.build_channels(out, extra, site.apply((data,)))]
    with fileops.private_scratch("repodata") as tmp:
        _answering(wanted, f"file://{out.resolve()}", Gateway(cache_dir=cache_dir or tmp), findings)
    return findings


def _check_here(solves: Sequence[RequirementSolve], out: Path, extra: tuple[str, ...],
                site: channel_data.SiteChannels, cache_dir: Path | None) -> list[Finding]:
    """`check`'s work, in this process."""
    from rattler import Gateway

    findings: list[Finding] = []
    with fileops.private_scratch("repodata") as tmp:
        gateway = Gateway(cache_dir=cache_dir or tmp)
        out_url = f"file://{out.resolve()}"
        plans = [(s, channel_data.build_channels(out, extra, site.apply(s.channels))) for s in solves]
        answering = _answering([(s.platform, url) for s, urls in plans for url in urls], out_url, gateway, findings)
        for solve, urls in plans:
            down = [u for u in urls if answering.get(u)]
            name = f"requirements ({solve.recipe})"
            if down:
                findings.append(Finding(name, "warn", f"not solved: {', '.join(down)} did not answer"))
                continue
            usable = [u for u in urls if u != out_url or (out / "noarch" / "repodata.json").is_file()]
            problems: list[str] = []
            for section, wanted in (("build", list(solve.build)), ("host", list(solve.host))):
                failure = _solve(wanted, usable, solve.platform, gateway)
                if failure is None:
                    continue
                missing = _missing(wanted, usable, solve.platform, gateway)
                if missing:
                    problems.append(f"{section}: no package for {', '.join(missing)} in {', '.join(usable)}")
                else:
                    problems.append(f"{section}: {failure}")
            if problems:
                findings.append(Finding(name, "fail", "; ".join(problems),
                                        "add a channel that has them (--channel, or torchforge.toml [channels])"))
            else:
                findings.append(Finding(name, "ok", f"build and host requirements solve from {len(usable)} channel(s)"))
    return findings
