"""py-rattler work runs in a child that ends with os._exit (py-rattler 0.28 crashes at interpreter teardown)."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.test_upload_helpers import ROOT, cli_env
from torchforge.errors import ToolFailedError, UploadFailedError
from torchforge.rattlerchild import call

# Each in-process py-rattler use, through the function torchforge's commands call; afterwards this process
# must not have loaded rattler (a process that did can crash at exit, after its work is done).
_USES = {
    "index": "from torchforge.localchannel import index\nindex(channel)\n",
    "upload-check": (
        "from torchforge.archives import inspect_archive\n"
        "from torchforge.uploaders.rattler_check import check_channel\n"
        "print(check_channel(channel.as_uri(), [inspect_archive(p) for p in channel.glob('*/*.conda')], work=work))\n"
    ),
    "solve": (  # doctor's and build's channel check: the channel answers, the requirements are solved
        "from torchforge.channelcheck import check\nfrom torchforge.channels import SiteChannels\n"
        "from torchforge.flavours.official.render import plan\nfrom torchforge.flavours.official.variant import Options, Selection\n"
        "from torchforge.flavours.official.preflight import official_needs\n"
        "(variant,) = plan(Selection.from_flags('2.9.0', 'cpu', '3.11', 'linux-64', Options())).variants\n"
        "findings = check(official_needs([variant]).solves, out=work / 'out', extra=(),\n"
        "                 site=SiteChannels(replace=(channel.as_uri(),)))\n"
        "assert findings[0].status == 'ok' and findings[-1].name.startswith('requirements'), findings\n"
    ),
    "install": (
        "from torchforge.errors import UsageError\nfrom torchforge.repack import install_from_channel\n"
        "try:\n    install_from_channel(channel, work / 'prefix', 'hello')\n"
        "except UsageError as exc:\n    assert 'no site-packages' in str(exc)\n"
        "assert (work / 'prefix' / 'share' / 'hello' / 'hello.txt').is_file()\n"
    ),
}


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torchforge.localchannel import index

    chan = tmp_path_factory.mktemp("rattlerchild") / "chan"
    make_package(chan / "linux-64", name="hello")
    index(chan)
    return chan


@pytest.mark.parametrize("use", sorted(_USES))
def test_a_process_that_used_py_rattler_through_torchforge_never_loaded_it(use: str, channel: Path,
                                                                          tmp_path: Path) -> None:
    script = ("import sys\nfrom pathlib import Path\nchannel = Path(sys.argv[1]); work = Path(sys.argv[2])\n"
              + _USES[use] + "print('rattler loaded:', 'rattler' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, str(channel), str(tmp_path)], env=cli_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rattler loaded: False" in done.stdout


def _note_and(record: str, then: str) -> str:
    """Child target: append a line to `record`, then end as `then` says."""
    with open(record, "a") as out:
        out.write("called\n")
    if then == "teardown-marker":
        atexit.register(lambda: Path(record + ".teardown").write_text("ran"))
        return "done"
    if then == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if then == "upload-error":
        raise UploadFailedError("the channel lists nothing", "check its index")
    if then == "os-error":
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/x")
    return then


def test_the_child_returns_its_result_and_skips_interpreter_teardown(tmp_path: Path) -> None:
    record = tmp_path / "record"
    assert call("tests.test_rattlerchild:_note_and", str(record), "teardown-marker") == "done"
    assert record.read_text() == "called\n"
    assert not Path(f"{record}.teardown").exists()  # atexit never ran: the child ended with os._exit


def test_a_crashed_child_is_reported_with_its_signal_and_not_retried(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with pytest.raises(ToolFailedError, match="signal SIGSEGV"):
        call("tests.test_rattlerchild:_note_and", str(record), "segv")
    assert record.read_text() == "called\n"  # once: a retry would hide the crash


def test_the_childs_errors_reach_the_caller_as_themselves(tmp_path: Path) -> None:
    record = str(tmp_path / "record")
    with pytest.raises(UploadFailedError) as raised:
        call("tests.test_rattlerchild:_note_and", record, "upload-error")
    assert (raised.value.message, raised.value.hint) == ("the channel lists nothing", "check its index")
    with pytest.raises(FileNotFoundError) as missing:
        call("tests.test_rattlerchild:_note_and", record, "os-error")
    assert missing.value.filename == "/nowhere/x"
