"""The chaos suite's broker-fault tools without a broker: recovery read from append times, the active controller
read from the nodes' quorum state, and the network cut (a namespace of its own, where the machine allows it)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from producers.events import generate_events
from producers.load import produce_events
from stream.local.broker import free_port
from tests.chaos.broker_faults import Fault, active_controller, measure_recovery, recovery_table
from tests.chaos.netcut import Bridge, isolated, netns_available

T0 = 1_800_000_000.0  # a fault's wall-clock start


def _appends(rates: list[tuple[float, float, float]]) -> list[int]:
    """Append times (ms) at ``rate`` per second over [start, end) seconds relative to T0, evenly spaced."""
    out: list[int] = []
    for start, end, rate in rates:
        n = int((end - start) * rate)
        out += [int((T0 + start + i / rate) * 1000) for i in range(n)]
    return out


def test_recovery_is_the_time_to_three_seconds_back_at_ninety_percent_of_the_rate_before() -> None:
    # 1,000/s for 20 s, nothing for 4 s after the fault, 500/s (half: not recovered) for 3 s, then 1,500/s
    # (catching up) for 2 s and 1,000/s after: the first sliding 1 s window at 900 or more starts at 6.5 s (half
    # of it at 500/s, half at 1,500/s), and the two after it hold.
    times = _appends([(-20, 0, 1000), (4, 7, 500), (7, 9, 1500), (9, 30, 1000)])
    fault = Fault("leader-kill", "node 1", T0)
    measure_recovery([fault], times)
    assert fault.baseline_rate == pytest.approx(1000, rel=0.01)
    assert fault.recovery_s == 6.5


def test_a_fault_that_never_dents_the_rate_recovers_at_once_and_one_never_back_is_none() -> None:
    steady = Fault("rolling-restart", "node 1 (1/3)", T0)
    measure_recovery([steady], _appends([(-20, 30, 1000)]))
    assert steady.recovery_s == 0.0
    stuck = Fault("broker-pause", "node 2", T0)
    measure_recovery([stuck], _appends([(-20, 0, 1000), (0, 30, 850)]))  # 85 %: never back above 90 %
    assert stuck.recovery_s is None
    idle = Fault("leader-kill", "node 3", T0)  # no load before it: no baseline, no figure
    measure_recovery([idle], _appends([(0, 30, 1000)]))
    assert idle.baseline_rate == 0 and idle.recovery_s is None


def test_recovery_table_counts_per_kind_and_keeps_the_unrecovered_out_of_the_times() -> None:
    faults = [Fault("leader-kill", "node 1", T0, recovery_s=4.0), Fault("leader-kill", "node 2", T0, recovery_s=8.0),
              Fault("leader-kill", "node 3", T0, recovery_s=12.0), Fault("broker-pause", "node 1", T0)]
    table = recovery_table(faults)
    assert table["leader-kill"] == {"faults": 3, "recovered": 3, "median_s": 8.0, "max_s": 12.0}
    assert table["broker-pause"] == {"faults": 1, "recovered": 0, "median_s": None, "max_s": None}


def test_the_active_controller_is_the_newest_epochs_leader_among_live_nodes(tmp_path: Path) -> None:
    def node(node_id: int, alive: bool, state: dict[str, int] | None) -> SimpleNamespace:
        workdir = tmp_path / f"node-{node_id}"
        meta = workdir / "data" / "__cluster_metadata-0"
        meta.mkdir(parents=True)
        if state is not None:
            (meta / "quorum-state").write_text(json.dumps(state))
        return SimpleNamespace(node_id=node_id, workdir=workdir, alive=lambda: alive)

    nodes = [node(1, True, {"leaderId": 1, "leaderEpoch": 3}),  # stale: it has not heard of epoch 4 yet
             node(2, True, {"leaderId": 3, "leaderEpoch": 4}),
             node(3, False, {"leaderId": 2, "leaderEpoch": 9})]  # dead: its file is not evidence
    assert active_controller(SimpleNamespace(nodes=nodes)) == 3  # type: ignore[arg-type]
    nobody = [node(4, True, {"leaderId": -1, "leaderEpoch": 5}), node(5, True, None)]
    with pytest.raises(RuntimeError, match="no live node knows"):
        active_controller(SimpleNamespace(nodes=nobody))  # type: ignore[arg-type]


def test_a_load_generator_names_the_events_it_could_not_deliver() -> None:
    port = free_port()  # nothing listens there
    summary = produce_events(f"127.0.0.1:{port}", "nowhere", 40, seed=3,
                             config={"message.timeout.ms": 1000, "log_level": 0}, timeout_s=10)
    assert summary.delivered == 0 and summary.failed == 40
    assert sorted(summary.failed_ids) == sorted(generate_events(40, seed=3).event_ids)


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def echo(conn: socket.socket) -> None:
        with conn:  # closed when the client goes (left to the collector, its ResourceWarning failed a later test)
            for data in iter(lambda: conn.recv(100), b""):
                conn.sendall(data)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


CLIENT = """
import socket, sys, time
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port), timeout=5)
for i in range(int(sys.argv[2])):
    started = time.monotonic()
    s.sendall(b"ping%d" % i)
    print(s.recv(100).decode(), round(time.monotonic() - started, 2), flush=True)
    time.sleep(0.3)
"""


def test_a_cut_process_reaches_the_host_only_through_the_bridge_which_holds_bytes_while_cut(tmp_path: Path) -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    server, port = _echo_server()
    bridge = Bridge(tmp_path / "bridge.sock")
    try:
        proc = subprocess.Popen(isolated([sys.executable, "-c", CLIENT, str(port), "6"], bridge.path, [port]),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[0] == "ping0"
        bridge.cut()
        time.sleep(2.0)  # the next ping waits in the bridge
        bridge.heal()
        out, _ = proc.communicate(timeout=30)
        proc.stdout.close()
        lines = [first, *(line.split() for line in out.splitlines())]
        assert [w[0] for w in lines] == [f"ping{i}" for i in range(6)]
        assert max(float(w[1]) for w in lines) > 1.0, "a reply came through while the bridge was cut"
        # Without the bridge the namespace reaches nothing: the port is the relay's, not the host's.
        direct = subprocess.run(["unshare", "-n", sys.executable, "-c", CLIENT, str(port), "1"],
                                capture_output=True, text=True, timeout=30)
        assert direct.returncode != 0
    finally:
        bridge.close()
        server.close()


def test_the_relay_dies_with_the_command_it_serves(tmp_path: Path) -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    bridge = Bridge(tmp_path / "bridge.sock")
    try:
        script = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
        proc = subprocess.Popen(isolated([sys.executable, "-c", script], bridge.path, [free_port()]),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) == proc.pid, "the command runs in the PID that was started"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1  # the relay
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{children[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{children[0]}").exists(), "the relay outlived its command"
    finally:
        bridge.close()
