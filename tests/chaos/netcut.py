"""Cut one worker off from the brokers, and reconnect it: a network partition between one replica and the cluster.

The worker runs in a network namespace of its own (``unshare -n``): its loopback holds nothing but a relay that
listens on the brokers' ports (so the addresses the brokers advertise, 127.0.0.1:port, lead to the relay) and
carries every connection over a Unix socket (file-system sockets cross namespaces) to a `Bridge` in the
runner, which connects it to the real broker. `Bridge.cut` stops carrying bytes either way, as a partitioned
network does: open connections stay open and deliver nothing, a new connection reaches no broker; what was
sent meanwhile arrives after `Bridge.heal`, in order, unless the client gave up on the connection first.

Namespaces need CAP_SYS_ADMIN (root, or an unprivileged user namespace: ``unshare -rn``); `netns_available`
says whether this machine lets the test create them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

_CHUNK = 65536


def netns_available() -> str | None:
    """None when a network namespace can be created here (with a loopback brought up), else why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare(1) on this machine"
    flags = ["-n"] if os.geteuid() == 0 else ["-r", "-n"]
    try:
        done = subprocess.run([unshare, *flags, sys.executable, "-c",
                               "import tests.chaos.netcut as n; n.loopback_up()"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"cannot create a network namespace: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def isolated(command: list[str], bridge_socket: Path, ports: list[int]) -> list[str]:
    """``command`` run in a new network namespace whose 127.0.0.1:``ports`` lead to ``bridge_socket``. The
    process keeps one PID from start to exit (unshare and the relay's parent exec into ``command``), so it is
    signalled and reaped like any other; the relay dies with it."""
    flags = ["-n"] if os.geteuid() == 0 else ["-r", "-n"]
    return ["unshare", *flags, sys.executable, "-m", "tests.chaos.netcut", str(bridge_socket),
            *map(str, ports), "--", *command]


def loopback_up() -> None:
    """Bring ``lo`` up in this namespace (a new one starts with it down): SIOCSIFFLAGS with IFF_UP|IFF_RUNNING."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        import fcntl

        request = struct.pack("16sH14x", b"lo", 0x1 | 0x40)
        fcntl.ioctl(s.fileno(), 0x8914, request)  # SIOCSIFFLAGS


def _pump(src: socket.socket, dst: socket.socket, flowing: threading.Event | None) -> None:
    """Copy ``src`` to ``dst`` until either side closes; while ``flowing`` is clear, hold what was read."""
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            if flowing is not None:
                flowing.wait()
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _join(a: socket.socket, b: socket.socket, flowing: threading.Event | None) -> None:
    threading.Thread(target=_pump, args=(a, b, flowing), daemon=True).start()
    threading.Thread(target=_pump, args=(b, a, flowing), daemon=True).start()


class Bridge:
    """The runner's side: accepts the relay's connections on a Unix socket and joins each to 127.0.0.1:port."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.flowing = threading.Event()
        self.flowing.set()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(64)
        self._closed = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(conn,), daemon=True).start()

    def _connect(self, conn: socket.socket) -> None:
        try:
            (port,) = struct.unpack("!H", conn.recv(2, socket.MSG_WAITALL))
            self.flowing.wait()  # while cut, a new connection reaches no broker
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
            upstream.settimeout(None)
        except (OSError, struct.error):
            conn.close()
            return
        self._conns += [conn, upstream]
        _join(conn, upstream, self.flowing)

    def close(self) -> None:
        self._closed = True
        self.flowing.set()
        self._server.close()
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def _listen(ports: list[int]) -> list[socket.socket]:
    listeners = []
    for port in ports:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listeners.append(listener)
    return listeners


def _relay(bridge_socket: str, listeners: list[socket.socket]) -> None:
    """Inside the namespace: carry each connection accepted on 127.0.0.1:port to the bridge."""

    def serve(listener: socket.socket, port: int) -> None:
        while True:
            conn, _ = listener.accept()
            try:
                out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                out.connect(bridge_socket)
                out.sendall(struct.pack("!H", port))
            except OSError:
                conn.close()
                continue
            _join(conn, out, None)

    for listener in listeners:
        threading.Thread(target=serve, args=(listener, listener.getsockname()[1]), daemon=True).start()


def main(argv: list[str]) -> None:
    """``python -m tests.chaos.netcut SOCKET PORT... -- COMMAND...`` (inside a fresh network namespace)."""
    split = argv.index("--")
    bridge_socket, ports, command = argv[0], [int(p) for p in argv[1:split]], argv[split + 1:]
    loopback_up()
    listeners = _listen(ports)  # before the command starts: its first connection finds the relay there
    parent = os.getpid()
    if os.fork() == 0:  # the relay: a child that dies with the command (its parent, after the exec below)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(0)
        _relay(bridge_socket, listeners)
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(0)
    os.execvp(command[0], command)  # the listeners are not inherited (close-on-exec)


if __name__ == "__main__":
    main(sys.argv[1:])
