"""Run a command where only some folders are writable; started by `unshare --user --map-root-user --net --mount`
(torchforge/isolation.py), so it is already in its own user, network and mount namespaces.

Standard library only, and no torchforge import: an extension's build script runs this same file with the build's
own Python (the recipe carries a copy). In the new mount namespace, before the command starts:

- /run and /dev/shm become empty private tmpfs (a daemon's socket there, such as a container runtime's or the
  system bus, cannot be reached); writable folders below them are bound back in;
- /dev becomes a tmpfs with only null, zero, full, random, urandom and tty bound from the host (no disk device);
- every other mount is remounted read-only, except the writable folders (each bound onto itself first).

The network namespace has only a loopback interface, down: no address, local or remote, can be reached; with
TORCHFORGE_CACHE_RELAY="HOST PORT SOCKET" (torchforge/cacherelay.py) the loopback comes up, HOST names it, and a
child of this process forwards HOST:PORT to SOCKET, the compile cache server's relay outside: that alone.
Usage: python isolation_child.py WRITABLE... -- ARGV...
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import signal
import socket
import struct
import sys
import threading

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 18, 1 << 21, 1 << 24
# per-mount flags a user namespace may not drop on remount (the kernel locks them): kept as they are
LOCKED = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
          "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PRIVATE_TMPFS = ("/run", "/dev/shm")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
RELAY_VARIABLE = "TORCHFORGE_CACHE_RELAY"  # torchforge/cacherelay.py's
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, IFF_UP, PR_SET_PDEATHSIG = 0x8913, 0x8914, 0x8916, 0x1, 1
EXIT_SETUP = 125  # the isolation could not be set up; the command did not run

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} {target}: {os.strerror(err)}")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts() -> list[tuple[str, list[str]]]:
    """(mount point, per-mount options) of every mount of this namespace, in mount order."""
    with open("/proc/self/mountinfo") as handle:
        return [(_unescape(f[4]), f[5].split(",")) for f in (line.split() for line in handle)]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _rebind(writable: list[str], holders: dict[str, int]) -> None:
    """Bind each writable folder onto its own path (from the fd opened before its parent was covered)."""
    for path in writable:
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{holders[path]}", path, None, MS_BIND | MS_REC)


def _cover(writable: list[str]) -> None:
    for path in writable:  # a compile cache's first build: its folder is made here, while it still can be
        os.makedirs(path, exist_ok=True)
    holders = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in writable}
    dev_devices = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m")
    for name, fd in dev_devices.items():
        open(f"/dev/{name}", "w").close()
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    for top in PRIVATE_TMPFS:
        if os.path.isdir(top) and not os.path.islink(top):
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _rebind([p for p in writable if any(_under(p, top) for top in ("/dev", *PRIVATE_TMPFS))], holders)
    _rebind([p for p in writable if not any(_under(p, top) for top in ("/dev", *PRIVATE_TMPFS))], holders)
    for fd in (*holders.values(), *dev_devices.values()):
        os.close(fd)


def _read_only(writable: list[str]) -> None:
    """Every mount read-only but the writable binds and the private tmpfs (the kernel keeps locked flags)."""
    keep = {*writable, *PRIVATE_TMPFS}
    for point, options in reversed(_mounts()):
        if point in keep or "ro" in options or not os.path.exists(point):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= LOCKED.get(option, 0)
        _mount(None, point, None, flags)


def _loopback_up(address: str | None) -> None:
    """The loopback up (as `ip link set lo up`), with `address` added to it where given (an IPv4 literal)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(handle, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(handle, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
        if address is not None:
            fcntl.ioctl(handle, SIOCSIFADDR,
                        struct.pack("16sHH4s16x", b"lo:1", socket.AF_INET, 0, socket.inet_aton(address)))


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy one direction until its end, then pass the end on (the other direction goes on)."""
    try:
        while data := source.recv(1 << 16):
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def join(one: socket.socket, other: socket.socket) -> None:
    """Both directions of two connected sockets, until both ends are done (torchforge/cacherelay.py's too)."""
    back = threading.Thread(target=pump, args=(other, one), daemon=True)
    back.start()
    pump(one, other)
    back.join()


def _forward(caller: socket.socket, path: str) -> None:
    with caller, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as outside:
        try:
            outside.connect(path)
        except OSError:
            return
        join(caller, outside)


def _serve(listener: socket.socket, path: str, parent: int) -> None:
    """The forwarder's process: gone with the command (the parent-death signal), its output nowhere."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        caller, _ = listener.accept()
        threading.Thread(target=_forward, args=(caller, path), daemon=True).start()


def _relay(value: str, scratch: str) -> None:
    """HOST:PORT inside forwarded to the relay's SOCKET outside (a forked child serves it)."""
    host, port, path = value.split(" ", 2)
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and literal.version == 6:
        raise OSError(0, f"the cache server {host} is an IPv6 address, which the isolated build cannot relay: "
                         "name it by a host name")
    _loopback_up(host if literal is not None and not literal.is_loopback else None)
    address = host if literal is not None else "127.0.0.1"
    if literal is None:  # the name points at the loopback, where the forwarder listens
        hosts = os.path.join(scratch, "hosts")
        with open(hosts, "w") as handle:
            handle.write(f"127.0.0.1 localhost {host}\n::1 localhost ip6-localhost\n")
        _mount(hosts, "/etc/hosts", None, MS_BIND)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, int(port)))
    listener.listen(64)
    parent = os.getpid()
    if os.fork() == 0:
        _serve(listener, path, parent)
        os._exit(0)
    listener.close()


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: isolation_child.py WRITABLE... -- ARGV...", file=sys.stderr)
        return EXIT_SETUP
    split = argv.index("--")
    writable = [os.path.realpath(p) for p in argv[:split]]
    command = argv[split + 1:]
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _cover(writable)
        _read_only(writable)
    except OSError as exc:
        print(f"torchforge isolation: cannot make the filesystem read-only outside {', '.join(writable)}: {exc}",
              file=sys.stderr)
        return EXIT_SETUP
    scratch = os.path.join(writable[0], ".tmp") if writable else "/tmp"
    os.makedirs(scratch, exist_ok=True)
    os.environ.update(TMPDIR=scratch, TMP=scratch, TEMP=scratch, PIP_NO_CACHE_DIR="1")
    relay = os.environ.pop(RELAY_VARIABLE, "")
    if relay:
        try:
            _relay(relay, scratch)
        except OSError as exc:  # the build goes on without the remote cache (ccache counts the errors)
            print(f"torchforge isolation: no route to the compile cache's server: {exc}", file=sys.stderr)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"torchforge isolation: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_SETUP
    return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
