"""The local cluster's supervisor (`stream.local.cluster_supervisor`) with nodes that are not processes: ends
logged once, the quorum, restarts after the delay, and the ``broker-node`` requests it serves."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path

import pytest

from stream.errors import BrokerError, ConfigError
from stream.local.cluster_supervisor import STATUS_FILE, Supervisor, find_cluster, format_status, how_it_ended, request


class FakeNode:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.port = 9000 + node_id
        self.controller_port = 9100 + node_id
        self.workdir = Path(f"/nowhere/node-{node_id}")
        self._pid: int | None = 100 + node_id
        self._rc: int | None = None
        self.launches = 0
        self.stops = 0

    @property
    def pid(self) -> int | None:
        return self._pid

    def alive(self) -> bool:
        return self._rc is None

    def returncode(self) -> int | None:
        return self._rc

    def die(self, rc: int) -> None:
        self._rc = rc

    def launch(self) -> None:
        assert not self.alive()
        self.launches += 1
        self._pid = 1000 * self.launches + self.node_id
        self._rc = None

    def stop(self, timeout_s: float = 20.0) -> None:
        self.stops += 1
        self._rc = -signal.SIGTERM


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _supervisor(tmp_path: Path, *, restart: bool = False, delay: float = 5.0, count: int = 3,
                up: set[int] | None = None) -> tuple[Supervisor, list[FakeNode], Clock]:
    nodes = [FakeNode(i + 1) for i in range(count)]
    clock = Clock()
    listening = up if up is not None else set()
    sup = Supervisor(nodes, tmp_path, "127.0.0.1:9001", restart_dead=restart, restart_delay_s=delay, clock=clock,
                     is_listening=lambda port: port in listening)
    return sup, nodes, clock


def _status(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((tmp_path / STATUS_FILE).read_text())


def test_how_a_process_ended_is_said_in_words() -> None:
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL"
    assert how_it_ended(1) == "exited with code 1"
    assert how_it_ended(-200) == "killed by signal 200"


def test_a_node_that_ends_is_logged_once_and_the_cluster_runs_on_while_a_quorum_lives(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup, nodes, _ = _supervisor(tmp_path)
    assert sup.quorum == 2
    caplog.set_level(logging.INFO, "stream.local.cluster_supervisor")
    nodes[1].die(-signal.SIGKILL)
    for _ in range(5):
        assert sup.step() is None
    ends = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    assert ends == ["node 2 (pid 102) ended: killed by SIGKILL"]
    status = _status(tmp_path)
    assert [n["state"] for n in status["nodes"]] == ["running", "ended", "running"]
    assert status["nodes"][1]["pid"] is None and status["nodes"][1]["last_pid"] == 102
    assert nodes[1].launches == 0  # not asked to restart it
    nodes[0].die(3)
    lost = sup.step()
    assert lost is not None and "quorum lost: 1 of 3 nodes running, 2 needed" in lost
    assert "node 1 exited with code 3" in lost and "node 2 killed by SIGKILL" in lost


def test_an_ended_node_restarts_after_the_delay_on_its_data_and_its_return_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    up: set[int] = set()
    sup, nodes, clock = _supervisor(tmp_path, restart=True, delay=5.0, up=up)
    caplog.set_level(logging.INFO, "stream.local.cluster_supervisor")
    nodes[2].die(-signal.SIGKILL)
    sup.step()
    clock.t = 4.9
    sup.step()
    assert nodes[2].launches == 0
    clock.t = 5.0
    sup.step()
    assert nodes[2].launches == 1 and nodes[2].alive()
    assert _status(tmp_path)["nodes"][2]["state"] == "starting"
    sup.step()  # not listening yet
    assert not any("back" in r.getMessage() for r in caplog.records)
    up.add(nodes[2].port)
    sup.step()
    sup.step()
    backs = [r.getMessage() for r in caplog.records if "back" in r.getMessage()]
    assert backs == ["node 3 back (pid 1003), listening on 127.0.0.1:9003"]
    node = _status(tmp_path)["nodes"][2]
    assert (node["state"], node["pid"], node["restarts"], node["ended"]) == ("running", 1003, 1, "killed by SIGKILL")
    assert any("restarting node 3 on its data (/nowhere/node-3/data)" in r.getMessage() for r in caplog.records)


def test_a_restart_that_dies_while_starting_is_tried_again_later_each_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    up: set[int] = set()
    sup, nodes, clock = _supervisor(tmp_path, restart=True, delay=1.0, up=up)
    caplog.set_level(logging.INFO, "stream.local.cluster_supervisor")
    nodes[0].die(1)
    sup.step()
    clock.t = 1.0
    sup.step()
    assert nodes[0].launches == 1
    nodes[0].die(1)  # its start-up failed: the next try waits twice as long
    clock.t = 1.5
    assert sup.step() is None
    assert nodes[0].launches == 1 and _status(tmp_path)["nodes"][0]["state"] == "ended"
    assert "node 1 (pid 1001) ended: exited with code 1; restarting it in 2 s" in caplog.text
    clock.t = 3.4
    sup.step()
    assert nodes[0].launches == 1
    clock.t = 3.5
    sup.step()
    assert nodes[0].launches == 2
    up.add(nodes[0].port)  # up at last: the delay is back to 1 s for its next end
    sup.step()
    nodes[0].die(-signal.SIGKILL)
    clock.t = 10.0
    sup.step()
    clock.t = 11.0
    sup.step()
    assert nodes[0].launches == 3


def _ask(sup: Supervisor, action: str, node: int) -> tuple[bool, str]:
    """A broker-node request answered by a supervisor stepping in another thread."""
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            sup.step()
            done.wait(0.02)

    server = threading.Thread(target=serve)
    server.start()
    try:
        return request(sup.status_path, action, node, timeout_s=10)
    finally:
        done.set()
        server.join()


def test_broker_node_stop_keeps_a_node_down_and_refuses_to_break_the_quorum(tmp_path: Path) -> None:
    sup, nodes, _ = _supervisor(tmp_path, restart=True, delay=0.0)
    assert _ask(sup, "stop", 2) == (True, "node 2 stopped")
    for _ in range(3):
        sup.step()
    assert nodes[1].stops == 1 and nodes[1].launches == 0  # stopped on request: not restarted
    node = _status(tmp_path)["nodes"][1]
    assert node["state"] == "stopped" and node["ended"] == "stopped on request (killed by SIGTERM)"
    ok, message = _ask(sup, "stop", 1)
    assert not ok and message == "stopping node 1 would leave 1 of 3 nodes running, fewer than the quorum of 2"
    assert nodes[0].alive()
    ok, message = _ask(sup, "start", 3)
    assert not ok and message == "node 3 is running already (pid 103)"
    ok, message = _ask(sup, "restart", 7)
    assert not ok and message == "no node 7 in this cluster (nodes [1, 2, 3])"


def test_broker_node_start_and_restart_answer_once_the_node_listens(tmp_path: Path) -> None:
    up = {9001, 9002, 9003}
    sup, nodes, _ = _supervisor(tmp_path, up=up)
    assert _ask(sup, "stop", 2)[0]
    assert _ask(sup, "start", 2) == (True, "node 2 running (pid 1002) on 127.0.0.1:9002")
    ok, message = _ask(sup, "restart", 3)
    assert ok and message == "node 3 running (pid 1003) on 127.0.0.1:9003"
    assert nodes[2].stops == 1 and nodes[2].launches == 1
    assert [n["state"] for n in _status(tmp_path)["nodes"]] == ["running", "running", "running"]
    assert not list((tmp_path / "control").iterdir())  # requests and answers cleaned up


def test_broker_node_finds_the_one_running_cluster_or_says_what_to_give(tmp_path: Path) -> None:
    sup, _, _ = _supervisor(tmp_path)
    assert find_cluster(tmp_path) == sup.status_path
    assert find_cluster(sup.status_path) == sup.status_path
    with pytest.raises(ConfigError, match=r"no cluster\.json there"):
        find_cluster(tmp_path / "elsewhere")
    text = format_status(_status(tmp_path))
    assert text.splitlines()[1].split() == ["node", "pid", "state", "port", "restarts", "data", "last", "end"]
    assert text.splitlines()[2].split() == ["1", "101", "running", "9001", "0", "/nowhere/node-1/data", "-"]


def test_broker_node_says_when_the_cluster_is_gone(tmp_path: Path) -> None:
    sup, _, _ = _supervisor(tmp_path)
    status = _status(tmp_path)
    status["supervisor_pid"] = 2**22 + 12345  # no such process
    sup.status_path.write_text(json.dumps(status))
    with pytest.raises(BrokerError, match="is not running"):
        request(sup.status_path, "stop", 1, timeout_s=1)
