"""An unreachable channel is named by one URL whatever answers first: the platform's subdir is asked before noarch,
so doctor's row (and `make docs`' example of it) says the same on every run. A local HTTP server speaks for the
channel: every repodata request fails (HTTP 500), the platform's after a delay, noarch's at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from torchforge.channelcheck import check_answering
from torchforge.channels import SiteChannels


class _Failing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if "/linux-64/" in self.path:
            time.sleep(0.5)  # noarch fails first: asked together, noarch's URL was the one reported
        self.send_error(500, "broken on purpose")

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def failing_channel() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/chan"
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_channel_is_reported_by_its_platforms_url(failing_channel: str, tmp_path: Path) -> None:
    findings = check_answering([("linux-64", failing_channel)], out=tmp_path / "out", extra=(),
                               site=SiteChannels(), cache_dir=tmp_path / "cache")
    (row,) = [f for f in findings if f.name == f"channel {failing_channel}"]
    assert row.status == "fail" and f"{failing_channel}/linux-64/" in row.detail, row.detail
    assert "/noarch/" not in row.detail
