"""What a local Kafka node runs with: its cluster id, heap, request threads and ``server.properties``. Pure
functions of the machine and the cluster's shape; `stream.local.broker` starts the processes."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stream.errors import BrokerError
from stream.local.kafka_security import LocalSecurity


def kraft_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random cluster id for ``kafka-storage format``: 16 bytes in URL-safe base64, never starting with "-"
    (the tool would take it for an option; Kafka's own Uuid.randomUuid() skips those too)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(random_bytes()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def request_threads(cores: int | None = None) -> tuple[int, int]:
    """Kafka's network and I/O (request handler) thread counts for a local broker on ``cores`` cores (default:
    those this process may run on). Kafka's defaults, 3 and 8, are for a server of its own; on a 2-core machine
    that the broker shares with its clients, 1 and 2 took 0.47 / 0.47 of a core against 0.56 / 0.60 with the
    defaults for the same load (175,000 events/s in and out, `/proc` over 6 s, JIT warm). From 6 and 8 cores
    up they are Kafka's defaults again."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min(3, cores // 2)), max(2, min(8, cores))


@dataclass(frozen=True)
class KafkaHeap:
    """The local Kafka broker's Java heap: a fixed size; optionally a fixed young generation, and every page
    touched at start-up.

    The default is kafka-server-start.sh's: 1 GiB, G1 sizing its young generation to its 20 ms pause goal
    (young collections on a growing 256 MiB heap paused ~8 ms each, the tail of every latency figure)."""

    heap_mib: int = 1024
    young_mib: int | None = None  # None: G1 sizes it for its pause goal
    pretouch: bool = False
    region_mib: int | None = None  # G1 region size; None: the JVM's choice (heap / 2048)

    def __post_init__(self) -> None:
        if self.heap_mib < 256:
            raise BrokerError(f"the Kafka broker's heap must be at least 256 MiB, got {self.heap_mib}")
        if self.young_mib is not None and not 0 < self.young_mib < self.heap_mib:
            raise BrokerError(f"the young generation ({self.young_mib} MiB) must be smaller than the heap "
                              f"({self.heap_mib} MiB)")
        if self.region_mib is not None and (self.region_mib not in (1, 2, 4, 8, 16, 32)):
            raise BrokerError(f"a G1 region is 1, 2, 4, 8, 16 or 32 MiB, got {self.region_mib}")

    @classmethod
    def for_benchmark(cls, mem_total_mib: int | None = None) -> KafkaHeap:
        """The benchmark's broker: Kafka's documented production heap (6 GiB, G1 with 16 MiB regions) on a
        machine with 20 GiB or more (MemTotal, or the cgroup's memory limit where smaller), a quarter of that
        below; half of it a fixed young generation; every page touched at start (6 GiB: ~7 s here).

        With the default heap G1 kept its young generation near 300 MiB for its pause goal, so at 142,000
        events/s in and out the broker stopped for a 8-28 ms young collection every 2.7 s, and each pause put
        ~5,000 records into the latency tail (the 1 % of a 13 s step is ~14,000). A 3 GiB young generation
        fills in ~100 s at that rate. Touching the pages at start keeps the kernel's page zeroing (0.25-0.5 of
        a core in the broker's system time) out of the first steps."""
        if mem_total_mib is None:
            mem_total_mib = _mem_total_mib()
        if not mem_total_mib:
            heap = 1024
        elif mem_total_mib >= 20 * 1024:
            heap = 6144
        else:
            heap = max(512, mem_total_mib // 4 // 256 * 256)
        return cls(heap_mib=heap, young_mib=heap // 2, pretouch=True, region_mib=16 if heap >= 4096 else None)

    def jvm_args(self) -> list[str]:
        args = [f"-Xms{self.heap_mib}m", f"-Xmx{self.heap_mib}m"]
        if self.young_mib is not None:
            args.append(f"-Xmn{self.young_mib}m")
        if self.region_mib is not None:
            args.append(f"-XX:G1HeapRegionSize={self.region_mib}m")
        if self.pretouch:
            args.append("-XX:+AlwaysPreTouch")
        return args


def _mem_total_mib(meminfo: Path = Path("/proc/meminfo"), proc_cgroup: Path = Path("/proc/self/cgroup"),
                   cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this process may use, MiB: MemTotal, or its cgroup's limit where that is smaller (in a
    container /proc/meminfo shows the host's memory, and a pre-touched heap sized from it would be killed)."""
    total: int | None = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) // 1024
                break
    except (OSError, ValueError):
        total = None
    limit = _cgroup_memory_limit_mib(proc_cgroup, cgroup_root)
    if limit is None:
        return total
    return limit if total is None else min(total, limit)


def _cgroup_memory_limit_mib(proc_cgroup: Path, cgroup_root: Path) -> int | None:
    """The smallest memory limit set on this process's cgroup (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``, the cgroup's own and the namespace root's), MiB; None where none is set."""
    candidates = [cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"]
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "":
                candidates.append(cgroup_root / rel / "memory.max")
            elif "memory" in controllers.split(","):
                candidates.append(cgroup_root / "memory" / rel / "memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    limits = []
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": none; v1 writes a huge number for none, larger than any MemTotal
            limits.append(int(text) // (1024 * 1024))
    return min(limits) if limits else None


def server_properties(node_id: int, port: int, controller_port: int, voters: str, data: Path, nodes: int,
                      security: LocalSecurity | None = None) -> str:
    """A KRaft node's server.properties: combined broker and controller on 127.0.0.1. With 3 or more nodes the
    cluster keeps 3 replicas of everything (internal topics too) and needs 2 in sync to acknowledge a write;
    unclean leader election stays off. ``security``: SASL_SSL and the StandardAuthorizer (`kafka_security`)."""
    replicas = min(3, nodes)
    min_isr = 2 if replicas >= 3 else 1
    network_threads, io_threads = request_threads()
    listeners = security.properties(port, controller_port) if security is not None else [
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    ]
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={voters}",
        *listeners,
        f"log.dirs={data}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        "unclean.leader.election.enable=false",
        # A follower that stops fetching leaves the in-sync replicas after 10 s (Kafka's default is 30 s): the
        # chaos suite's paused broker drops out, and the run stays short.
        "replica.lag.time.max.ms=10000",
        f"offsets.topic.replication.factor={replicas}",
        "offsets.topic.num.partitions=8",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        "transaction.state.log.num.partitions=8",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        # Test brokers: no reason to delay a new group's first rebalance.
        "group.initial.rebalance.delay.ms=0",
        "log.flush.interval.messages=9223372036854775807",
        f"num.network.threads={network_threads}",
        f"num.io.threads={io_threads}",
        "",
    ])
