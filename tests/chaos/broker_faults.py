"""Broker faults on the local three-node cluster, and how long the pipeline takes to recover from each.

Kinds (each ends with the cluster whole again: every partition's in-sync replicas back to all of its replicas):

- ``leader-kill``: SIGKILL of the node leading the most input and output partitions; restarted on its data
  after ``down_s``.
- ``controller-kill``: SIGKILL of the active controller (the KRaft quorum's leader, read from each node's
  ``quorum-state``); restarted after ``down_s``.
- ``rolling-restart``: each node in turn SIGTERMed (a controlled shutdown), started again, and the next one
  only once no partition is under-replicated.
- ``broker-pause``: SIGSTOP of the node leading the most partitions for ``pause_s``, longer than the cluster's
  ``replica.lag.time.max.ms`` and the brokers' and the workers' session timeouts, then SIGCONT.
- ``worker-netcut``: one worker cut off from every broker (`tests.chaos.netcut`) for ``cut_s``, longer than its
  session timeout, then reconnected.

Recovery is read afterwards from the output topic, whose records carry the time the broker appended them
(``message.timestamp.type=LogAppendTime``): the pre-fault rate is the median of the 1 s counts over the
``BASELINE_S`` before the fault; recovery is the time from the fault to the first of ``SUSTAIN`` consecutive
1 s windows at or above ``RECOVERED`` of that rate."""

from __future__ import annotations

import json
import signal
import statistics
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from stream.kafka.topics import admin
from stream.local.broker import LocalCluster

BROKER_KINDS = ("leader-kill", "controller-kill", "rolling-restart", "broker-pause")
KINDS = (*BROKER_KINDS, "worker-netcut")
BASELINE_S = 10
SUSTAIN = 3
RECOVERED = 0.9


@dataclass
class Fault:
    kind: str
    target: str  # "node 2", "replica 1"
    started: float  # wall-clock seconds
    ended: float = 0.0  # when the cluster (or the cut worker) was whole again
    recovery_s: float | None = None  # None: no baseline (no load before it) or never recovered in the run
    baseline_rate: float = 0.0


def partitions(bootstrap: str) -> dict[tuple[str, int], tuple[int, list[int], list[int]]]:
    """Every partition (internal topics too): leader, replicas, in-sync replicas."""
    md = admin(bootstrap).list_topics(timeout=10)
    return {(t, p): (m.leader, list(m.replicas), list(m.isrs))
            for t, tm in md.topics.items() for p, m in tm.partitions.items()}


def under_replicated(bootstrap: str) -> int:
    return sum(1 for _, replicas, isr in partitions(bootstrap).values() if len(isr) < len(replicas))


def wait_fully_replicated(bootstrap: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if under_replicated(bootstrap) == 0:
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions still under-replicated {timeout_s:.0f} s after the fault")
        time.sleep(0.5)


def busiest_leader(bootstrap: str, topics: list[str]) -> int:
    """The node leading the most partitions of ``topics``."""
    counts = Counter(leader for (t, _), (leader, _, _) in partitions(bootstrap).items() if t in topics and leader >= 0)
    return counts.most_common(1)[0][0]


def active_controller(cluster: LocalCluster) -> int:
    """The KRaft quorum's leader: the newest epoch's leader among the live nodes' ``quorum-state`` files."""
    best = (-1, -1)
    for node in cluster.nodes:
        if not node.alive():
            continue
        state = node.workdir / "data" / "__cluster_metadata-0" / "quorum-state"
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if data.get("leaderId", -1) >= 0:
            best = max(best, (int(data["leaderEpoch"]), int(data["leaderId"])))
    if best[1] < 0:
        raise RuntimeError("no live node knows the quorum's leader")
    return best[1]


@dataclass
class FaultPlan:
    down_s: float = 5.0  # a killed node stays down this long before its restart
    pause_s: float = 15.0  # > replica.lag.time.max.ms (10 s on the local cluster), session timeouts (6 s, 9 s)
    cut_s: float = 12.0  # > the chaos workers' 6 s session timeout
    settle_timeout_s: float = 180.0


def inject(kind: str, cluster: LocalCluster, topics: list[str], plan: FaultPlan,
           cut_worker: Callable[[float], str] | None = None, log: Callable[[str], None] = lambda _: None,
           ) -> list[Fault]:
    """Run one fault of ``kind`` to its end (the cluster whole again); returns its records: one, or for a rolling
    restart one per node (each restart's recovery is measured on its own)."""
    bootstrap = cluster.bootstrap
    if kind == "worker-netcut":
        if cut_worker is None:
            raise ValueError("worker-netcut needs a worker that runs in a namespace of its own")
        started = time.time()
        target = cut_worker(plan.cut_s)
        return [Fault(kind, target, started, time.time())]
    if kind == "rolling-restart":
        steps = []
        for i, n in enumerate(cluster.nodes):
            started = time.time()
            n.stop(60.0)
            cluster.restart(n.node_id)
            wait_fully_replicated(bootstrap, plan.settle_timeout_s)
            steps.append(Fault(kind, f"node {n.node_id} ({i + 1}/{len(cluster.nodes)})", started, time.time()))
            log(f"    node {n.node_id} restarted, fully replicated again")
        return steps
    if kind in ("leader-kill", "broker-pause"):
        node = busiest_leader(bootstrap, topics)
    elif kind == "controller-kill":
        node = active_controller(cluster)
    else:
        raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
    started = time.time()
    if kind == "broker-pause":
        cluster.node(node).signal(signal.SIGSTOP)
        try:
            time.sleep(plan.pause_s)
        finally:
            cluster.node(node).signal(signal.SIGCONT)
    else:
        cluster.node(node).signal(signal.SIGKILL)
        cluster.node(node).proc.wait(30)  # type: ignore[union-attr]
        time.sleep(plan.down_s)
        cluster.restart(node)
    wait_fully_replicated(bootstrap, plan.settle_timeout_s)
    return [Fault(kind, f"node {node}", started, time.time())]


def measure_recovery(faults: list[Fault], append_times_ms: list[int], step_s: float = 0.25) -> None:
    """Fill each fault's ``baseline_rate`` and ``recovery_s`` from the output records' append times: 1 s windows
    slide from the fault's start in ``step_s`` steps."""
    times = sorted(append_times_ms)
    if not times:
        return
    last_s = times[-1] / 1000.0

    def count(lo_s: float) -> int:  # records appended in [lo_s, lo_s + 1)
        return bisect_left(times, int((lo_s + 1) * 1000)) - bisect_left(times, int(lo_s * 1000))

    for fault in faults:
        fault.baseline_rate = float(statistics.median(count(fault.started - k) for k in range(1, BASELINE_S + 1)))
        if fault.baseline_rate <= 0:
            continue
        threshold = RECOVERED * fault.baseline_rate
        at = fault.started
        while at + SUSTAIN <= last_s:
            if all(count(at + j) >= threshold for j in range(SUSTAIN)):
                fault.recovery_s = round(at - fault.started, 2)
                break
            at += step_s


def recovery_table(faults: list[Fault]) -> dict[str, dict[str, float | int | None]]:
    """Per kind: how many, how many recovered, median and worst recovery (s)."""
    table: dict[str, dict[str, float | int | None]] = {}
    for kind in dict.fromkeys(f.kind for f in faults):
        times = [f.recovery_s for f in faults if f.kind == kind and f.recovery_s is not None]
        table[kind] = {"faults": sum(1 for f in faults if f.kind == kind), "recovered": len(times),
                       "median_s": statistics.median(times) if times else None,
                       "max_s": max(times) if times else None}
    return table
