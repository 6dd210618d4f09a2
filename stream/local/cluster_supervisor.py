"""The local cluster in the foreground (``python -m stream broker --kind kafka --nodes N``) and the command that acts
on one of its nodes while it runs (``python -m stream broker-node``).

The supervisor keeps the cluster running while a quorum of its nodes (every node is a voter of the one KRaft
controller quorum: a majority of them) has a live process: it logs each node's end once (id, pid, how it ended) and
each node's return, restarts an ended node on its own data after a delay when asked to (``--restart-dead-nodes``),
and stops every node it started when the quorum is lost (exit 1) or on SIGTERM/SIGINT (exit 0).

What it knows is written to ``cluster.json`` in the cluster's folder at every change (node id, pid, ports, data
folder, state), so a script finds node 2's process without parsing logs. ``broker-node stop|start|restart ID``
asks the supervisor through request files in the folder's ``control/`` (the supervisor owns the node processes:
they die with it, and it alone starts them), and waits for its answer."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from stream.errors import BrokerError, ConfigError
from stream.local.broker import listening
from stream.local.children import StopSignals

log = logging.getLogger(__name__)
STATUS_FILE = "cluster.json"
CONTROL_DIR = "control"
ACTIONS = ("stop", "start", "restart")


class Node(Protocol):
    """What the supervisor uses of `stream.local.broker.KafkaNode`."""

    node_id: int
    port: int
    controller_port: int
    workdir: Path

    @property
    def pid(self) -> int | None: ...

    def alive(self) -> bool: ...

    def returncode(self) -> int | None: ...

    def launch(self) -> None: ...

    def stop(self, timeout_s: float = 20.0) -> None: ...


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words: ``killed by SIGKILL``, ``exited with code 1``."""
    if returncode is None:
        return "ended"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclasses.dataclass
class NodeState:
    """``running`` (listening), ``starting`` (launched, not listening yet), ``ended`` (its process ended without
    being asked to) or ``stopped`` (stopped on request; never restarted but by ``broker-node start``)."""

    state: str = "running"
    ended: str = ""  # how its last process ended
    ended_at: float = 0.0
    restarts: int = 0
    failed_starts: int = 0  # ends while starting, in a row: each doubles the restart delay (up to a minute)
    pid: int | None = None  # the last process's, kept after it ended


class Supervisor:
    """One `step()` at a time (the foreground loop calls it every 0.2 s): notices ends and returns, restarts,
    serves ``broker-node`` requests and writes the status file. `step()` returns why the cluster must stop (its
    quorum lost), or None."""

    def __init__(self, nodes: Sequence[Node], root: Path, bootstrap: str, *, restart_dead: bool = False,
                 restart_delay_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 is_listening: Callable[[int], bool] = lambda port: listening(port, 0.1)) -> None:
        if restart_delay_s < 0:
            raise ConfigError(f"--restart-delay-s must be 0 or more, not {restart_delay_s}")
        self.nodes = {n.node_id: n for n in nodes}
        self.root = root
        self.bootstrap = bootstrap
        self.restart_dead = restart_dead
        self.restart_delay_s = restart_delay_s
        self.quorum = len(nodes) // 2 + 1
        self._clock = clock
        self._listening = is_listening
        self.states = {n.node_id: NodeState(pid=n.pid) for n in nodes}
        self._replies: dict[int, list[Path]] = {}  # node id -> answers due once it listens (or ends)
        self.status_path = root / STATUS_FILE
        self.control = root / CONTROL_DIR
        self.control.mkdir(parents=True, exist_ok=True)
        self.write_status()

    def live(self) -> int:
        return sum(n.alive() for n in self.nodes.values())

    def step(self) -> str | None:
        changed = False
        now = self._clock()
        for node_id, node in self.nodes.items():
            st = self.states[node_id]
            if st.state in ("running", "starting") and not node.alive():
                st.failed_starts = st.failed_starts + 1 if st.state == "starting" else 0
                st.state, st.ended, st.ended_at = "ended", how_it_ended(node.returncode()), now
                then = f"; restarting it in {self._delay(st):g} s" if self.restart_dead else ""
                log.warning("node %d (pid %s) ended: %s%s", node_id, st.pid, st.ended, then)
                self._answer(node_id, False, f"node {node_id} (pid {st.pid}) {st.ended} while starting")
                changed = True
            elif st.state == "starting" and self._listening(node.port):
                st.state, st.failed_starts = "running", 0
                log.info("node %d back (pid %s), listening on 127.0.0.1:%d", node_id, st.pid, node.port)
                self._answer(node_id, True, f"node {node_id} running (pid {st.pid}) on 127.0.0.1:{node.port}")
                changed = True
            elif st.state == "ended" and self.restart_dead and now - st.ended_at >= self._delay(st):
                log.info("restarting node %d on its data (%s), %g s after it %s", node_id, node.workdir / "data",
                         self._delay(st), st.ended)
                self._launch(node_id)
                changed = True
        changed = self._serve_requests() or changed
        if changed:
            self.write_status()
        live = self.live()
        if live < self.quorum:
            return (f"quorum lost: {live} of {len(self.nodes)} nodes running, {self.quorum} needed "
                    f"(ended: {', '.join(f'node {i} {s.ended}' for i, s in self.states.items() if s.ended)})")
        return None

    def _delay(self, st: NodeState) -> float:
        return float(min(self.restart_delay_s * 2 ** st.failed_starts, max(self.restart_delay_s, 60.0)))

    def _launch(self, node_id: int) -> None:
        node, st = self.nodes[node_id], self.states[node_id]
        node.launch()
        st.state, st.pid, st.restarts = "starting", node.pid, st.restarts + 1

    def _answer(self, node_id: int, ok: bool, message: str) -> None:
        for path in self._replies.pop(node_id, []):
            _write_json(path, {"ok": ok, "message": message})

    def _serve_requests(self) -> bool:
        changed = False
        for request in sorted(self.control.glob("*.request")):
            try:
                body = json.loads(request.read_text())
                action, node_id, reply = body["action"], int(body["node"]), self.control / body["reply"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # half written (the client renames a whole file in) or not ours: left for the next step
            request.unlink(missing_ok=True)
            ok, message, wait = self._act(action, node_id)
            if wait:
                self._replies.setdefault(node_id, []).append(reply)
            else:
                _write_json(reply, {"ok": ok, "message": message})
            changed = True
        return changed

    def _act(self, action: str, node_id: int) -> tuple[bool, str, bool]:
        """(ok, message, answer later: once the node listens or ends)."""
        if node_id not in self.nodes:
            return False, f"no node {node_id} in this cluster (nodes {sorted(self.nodes)})", False
        node, st = self.nodes[node_id], self.states[node_id]
        if action not in ACTIONS:
            return False, f"unknown action {action!r} (one of {', '.join(ACTIONS)})", False
        if action == "start" and node.alive():
            return False, f"node {node_id} is running already (pid {node.pid})", False
        if action in ("stop", "restart") and node.alive() and self.live() - 1 < self.quorum:
            verb = "stopping" if action == "stop" else "restarting"
            return False, (f"{verb} node {node_id} would leave {self.live() - 1} of {len(self.nodes)} nodes "
                           f"running, fewer than the quorum of {self.quorum}"), False
        if action in ("stop", "restart") and node.alive():
            log.info("node %d (pid %s): %s on request", node_id, node.pid, "stopping" if action == "stop"
                     else "restarting")
            node.stop()
            st.state, st.ended, st.ended_at = "stopped", f"stopped on request ({how_it_ended(node.returncode())})", \
                self._clock()
            self._answer(node_id, False, f"node {node_id} stopped on request before it listened")
        if action == "stop":
            if st.state != "stopped":  # it had ended already: keep it down
                st.state = "stopped"
            return True, f"node {node_id} stopped", False
        self._launch(node_id)
        log.info("node %d started on request (pid %s)", node_id, node.pid)
        return True, "", True

    def status(self) -> dict[str, Any]:
        return {"supervisor_pid": os.getpid(), "bootstrap": self.bootstrap, "quorum": self.quorum,
                "restart_dead_nodes": self.restart_dead, "restart_delay_s": self.restart_delay_s,
                "nodes": [{"id": i, "pid": self.nodes[i].pid if self.nodes[i].alive() else None,
                           "last_pid": s.pid, "state": s.state, "ended": s.ended, "restarts": s.restarts,
                           "port": self.nodes[i].port, "controller_port": self.nodes[i].controller_port,
                           "data": str(self.nodes[i].workdir / "data"), "folder": str(self.nodes[i].workdir)}
                          for i, s in sorted(self.states.items())]}

    def write_status(self) -> None:
        _write_json(self.status_path, self.status())


def _write_json(path: Path, body: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


def run_foreground(cluster: Any, started: str, signals: StopSignals, *, restart_dead: bool,
                   restart_delay_s: float) -> int:
    """Print ``started`` and the status file's path, then supervise until SIGTERM/SIGINT (``signals``, handled
    since before the cluster started: exit 0) or until the quorum is lost (exit 1); every node is stopped by PID
    either way, and the cluster's folder removed."""
    signals.started()
    stopping = signals.received
    try:
        sup = Supervisor(cluster.nodes, cluster.root, cluster.bootstrap, restart_dead=restart_dead,
                         restart_delay_s=restart_delay_s)
        print(started, flush=True)
        print(f"status: {sup.status_path} (python -m stream broker-node status|stop|start|restart; "
              f"{'ended nodes restart' if restart_dead else 'ended nodes stay down'}; the cluster runs while "
              f"{sup.quorum} of {len(cluster.nodes)} nodes do)", flush=True)
        while not stopping:
            lost = sup.step()
            if lost is not None:
                log.error("%s: stopping the other nodes", lost)
                return 1
            time.sleep(0.2)
        log.info("%s: stopping the cluster's nodes", signal.Signals(stopping[0]).name)
        return 0
    finally:
        cluster.stop()


# -- the client side: python -m stream broker-node


def find_cluster(given: Path | None) -> Path:
    """The status file of the cluster to act on: ``given`` (the file or its folder), else the one local cluster
    running from this machine's temp folder."""
    if given is not None:
        path = given / STATUS_FILE if given.is_dir() else given
        if not path.is_file():
            raise ConfigError(f"--cluster {given}: no {STATUS_FILE} there (the broker command prints its path "
                              "at start)")
        return path
    running = [p for p in sorted(Path(tempfile.gettempdir()).glob(f"stream-kafka-cluster-*/{STATUS_FILE}"))
               if _supervisor_alive(p)]
    if not running:
        raise ConfigError(f"no local cluster running (no live {STATUS_FILE} under {tempfile.gettempdir()}); "
                          "start one with `python -m stream broker --kind kafka --nodes 3`, or give --cluster")
    if len(running) > 1:
        raise ConfigError("several local clusters run; name one with --cluster: " + ", ".join(map(str, running)))
    return running[0]


def _supervisor_alive(status_path: Path) -> bool:
    try:
        pid = int(json.loads(status_path.read_text())["supervisor_pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def format_status(status: dict[str, Any]) -> str:
    rows = [("node", "pid", "state", "port", "restarts", "data", "last end")]
    rows += [(str(n["id"]), str(n["pid"] or "-"), n["state"], str(n["port"]), str(n["restarts"]), n["data"],
              n["ended"] or "-") for n in status["nodes"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([f"bootstrap={status['bootstrap']} supervisor pid={status['supervisor_pid']} "
                      f"quorum={status['quorum']}", *lines])


def request(status_path: Path, action: str, node_id: int, timeout_s: float) -> tuple[bool, str]:
    """Ask the cluster's supervisor to stop, start or restart node ``node_id``; its answer (start and restart
    answer once the node listens). BrokerError when the supervisor is gone or does not answer in time."""
    if not _supervisor_alive(status_path):
        raise BrokerError(f"the cluster of {status_path} is not running")
    control = status_path.parent / CONTROL_DIR
    name = uuid.uuid4().hex
    reply = control / f"{name}.reply"
    _write_json(control / f"{name}.request", {"action": action, "node": node_id, "reply": reply.name})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if reply.exists():
                body = json.loads(reply.read_text())
                return bool(body["ok"]), str(body["message"])
            if not _supervisor_alive(status_path):
                raise BrokerError("the cluster's supervisor ended before it answered")
            time.sleep(0.1)
    finally:
        with contextlib.suppress(OSError):
            reply.unlink()
        with contextlib.suppress(OSError):
            (control / f"{name}.request").unlink()
    raise BrokerError(f"no answer from the cluster's supervisor within {timeout_s:g} s")
