"""The gateway benchmark's readers (`stream.bench.gateway`): when each prediction became readable in the output
topic, in this process and in a second one, and a gateway's collector pauses from its ``/metrics``."""

from __future__ import annotations

import multiprocessing
import threading
import time
from contextlib import suppress
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream.codec import SchemaRegistry, decode
from stream.ops.gc_pauses import snapshot_from_samples
from stream.ops.top import scrape


class ArrivalClock:
    """Reads the output topic (``read_committed``) on a thread of its own: event id -> when its prediction became
    readable (wall-clock ms, taken as the record is handed over: each wait returns at the first record)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.arrived: dict[str, float] = {}
        self._registry = SchemaRegistry.from_dir()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"arrivals-{time.time_ns()}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed",
                                   "fetch.wait.max.ms": 10})
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._consumer.poll(0.05)
            if first is None:
                continue
            now = time.time() * 1000.0
            for msg in [first, *self._consumer.consume(1000, 0)]:
                if msg.error() is None:
                    event_id = str(decode(self._registry, msg.value())[1]["event_id"])
                    self.arrived.setdefault(event_id, now)

    def wait_for(self, ids: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not ids <= self.arrived.keys():
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _second_reader(bootstrap: str, topic: str, partitions: int, conn: Any) -> None:
    """A process of its own: an `ArrivalClock`; each message received (a list of event ids) is answered with
    their arrival times; None stops it."""
    clock = ArrivalClock(bootstrap, topic, partitions)
    try:
        while (ids := conn.recv()) is not None:
            clock.wait_for(set(ids), 10.0)
            conn.send({i: clock.arrived[i] for i in ids if i in clock.arrived})
    finally:
        clock.close()


class SecondReader:
    """`ArrivalClock` in a child process (spawned: no Kafka client crosses a fork)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_second_reader, args=(bootstrap, topic, partitions, child), daemon=True)
        self._proc.start()

    def arrivals(self, ids: list[str]) -> dict[str, float]:
        self._conn.send(ids)
        return dict(self._conn.recv())

    def close(self) -> None:
        with suppress(OSError):
            self._conn.send(None)
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


def gateway_gc(port: int) -> dict[str, dict[str, Any]]:
    """A gateway's collector pauses so far, from its ``/metrics``."""
    got = scrape(f"http://127.0.0.1:{port}")
    if got.error is not None:
        raise RuntimeError(f"the gateway on port {port}: {got.error}")
    return snapshot_from_samples(got.samples, "stream_gateway_gc_pause_seconds")
