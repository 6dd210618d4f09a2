"""Publishes demo events to Kafka at a target rate and reports delivery figures."""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from producers.events import generate_events
from stream.codec import EVENT_SCHEMA, EventFrames, SchemaRegistry, avro_long

BLOCK = 5_000
_BURST = 500  # events per timestamp: a burst is handed over in well under a millisecond


@dataclass(frozen=True)
class ProduceSummary:
    requested: int
    delivered: int
    failed: int
    seconds: float
    latency_p50_ms: float
    latency_p99_ms: float
    first_error: str | None

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (f"delivered={self.delivered}/{self.requested} failed={self.failed} "
                f"rate={self.rate:,.0f} rec/s delivery_p50={self.latency_p50_ms:.1f}ms "
                f"p99={self.latency_p99_ms:.1f}ms" + (f" first_error={self.first_error}" if self.first_error else ""))


class _Deliveries:
    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None
        self.latencies = array("f")

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = str(err)
            return
        self.delivered += 1
        latency = msg.latency()
        if latency is not None:
            self.latencies.append(latency)


def produce_events(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    seed: int = 0,
    start: int = 0,
    rate: float | None = None,
    config: dict[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    timeout_s: float = 120.0,
    stop: threading.Event | None = None,
) -> ProduceSummary:
    """Produce events ``start .. start+count-1`` of stream ``seed``; ``rate`` in events/s (None: as fast as possible).

    Each event's ``ts_ms`` is stamped when it is handed to the producer. Setting ``stop`` ends the run
    early: the summary then reports what was sent (events ``start .. start+requested-1``).
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0")
    schema = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                         "enable.idempotence": True, "acks": "all", **(config or {})})
    report = _Deliveries()
    produce, poll = producer.produce, producer.poll
    # Wake up about once a millisecond at most: waking per event (tens of us apart) cost more CPU than sending.
    min_burst = max(1, int(rate / 1000)) if rate is not None else 1
    started = time.monotonic()
    sent = 0
    ts_len = len(avro_long(int(time.time() * 1000)))
    while sent < count and not (stop is not None and stop.is_set()):
        block = generate_events(min(BLOCK, count - sent), seed=seed, start=start + sent)
        # The block's values are framed at once, each with a gap for ts_ms, stamped burst by burst.
        frames = EventFrames.build(schema, block.event_ids, block.keys, block.features, ts_len)
        keys = [k.encode() for k in block.keys]
        i = 0
        while i < len(block) and not (stop is not None and stop.is_set()):
            # Send in bursts: every event due by now (all of the block without a rate), then wait for the next.
            end = min(len(block), i + _BURST)
            if rate is not None:
                due = int((time.monotonic() - started) * rate) + 1 - sent
                wanted = min(min_burst, len(block) - i)
                if due < wanted:
                    time.sleep((wanted - due) / rate)
                    continue
                end = min(end, i + due)
            ts = avro_long(int(time.time() * 1000))  # stamped as the burst is handed over
            if len(ts) != frames.ts_len:  # the clock's varint grew a byte (or a test clock): frame again
                frames = EventFrames.build(schema, block.event_ids, block.keys, block.features, len(ts))
            for value, key in zip(frames.stamped(i, end, ts), keys[i:end], strict=True):
                while True:
                    try:
                        # Positional (topic, value, key, partition, callback, on_delivery, timestamp, headers):
                        # keyword parsing costs about a quarter of the call.
                        produce(topic, value, key, -1, report, None, 0, None)
                        break
                    except BufferError:
                        poll(0.01)
            poll(0)
            sent += end - i
            i = end
        if on_progress is not None:
            on_progress(sent)
    remaining = producer.flush(timeout_s)
    seconds = time.monotonic() - started
    lat = np.frombuffer(report.latencies, dtype=np.float32) * 1000.0 if len(report.latencies) else np.zeros(1)
    failed = report.failed + remaining
    return ProduceSummary(sent, report.delivered, failed, seconds, float(np.percentile(lat, 50)),
                          float(np.percentile(lat, 99)),
                          report.first_error or (f"{remaining} undelivered after flush" if remaining else None))
