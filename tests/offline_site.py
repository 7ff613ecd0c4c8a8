"""A site that answers doctor's channel checks on this machine: a local channel holding stand-ins for the specs
the plan solves (tests.test_doctor's requirements), and the torchforge.toml whose `[channels] replace` makes it
every data channel, so no test asks conda.anaconda.org or repo.anaconda.com (issue 40, item 22)."""

from __future__ import annotations

from pathlib import Path

from tests.stubchannel import make_stub_channel


def offline_site(folder: Path, specs: list[str]) -> Path:
    """`folder`/channel with a stand-in per spec (python alone where `specs` is empty) and `folder`/torchforge.toml
    naming it; returns the config file."""
    make_stub_channel(folder / "channel", specs or ["python"], runnable=False)
    config = folder / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["{(folder / "channel").as_uri()}"]\n')
    return config
