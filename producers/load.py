"""Publishes demo events to Kafka at a target rate and reports delivery figures."""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from producers.events import generate_events
from producers.frames import EventFrames
from stream.codec import RegisteredSchema, SchemaRegistry, avro_long, decode
from stream.kafka.client_logs import client_logger
from stream.kafka.native import NativeProducer
from stream.kafka.native import unavailable as native_unavailable
from stream.models.demo_names import EVENT_SCHEMA

BLOCK = 5_000
_BURST = 500  # events per timestamp: a burst is handed over in well under a millisecond
_NATIVE_SLOTS = 4096  # bursts in flight through the native producer
_KEEP_FAILED = 1_000_000  # failed events whose ids a summary lists
_START_WAIT_S = 10.0  # longest wait for a paced run's first burst to be acknowledged before the schedule starts


@dataclass(frozen=True)
class ProduceSummary:
    requested: int
    delivered: int
    failed: int
    seconds: float
    latency_p50_ms: float
    latency_p99_ms: float
    first_error: str | None
    # Ids of the events whose delivery failed (through confluent-kafka only: the C producer reports counts).
    # A failed report can still mean written ("possibly persisted"): a verifier treats these as maybe-sent.
    failed_ids: tuple[str, ...] = ()

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
        self.failed_values: list[bytes] = []  # at most _KEEP_FAILED, decoded to ids at the end

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if len(self.failed_values) < _KEEP_FAILED:
                self.failed_values.append(msg.value() or b"")
            if self.first_error is None:
                self.first_error = str(err)
            return
        self.delivered += 1
        latency = msg.latency()
        if latency is not None:
            self.latencies.append(latency)


class _ClientSender:
    """Through confluent-kafka: one produce() call and one delivery callback per event."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self.report = _Deliveries()
        self._producer = Producer(config)

    def send(self, frames: EventFrames, start: int, stop: int, ts: bytes, keys: list[bytes | None]) -> bool:
        """Queue events ``start:stop``; False when it cannot (nothing of them was queued)."""
        produce, poll, report, topic = self._producer.produce, self._producer.poll, self.report, self.topic
        for value, key in zip(frames.stamped(start, stop, ts), keys, strict=True):
            while True:
                try:
                    # Positional (topic, value, key, partition, callback, on_delivery, timestamp, headers):
                    # keyword parsing costs about a quarter of the call.
                    produce(topic, value, key, -1, report, None, 0, None)
                    break
                except BufferError:
                    poll(0.01)
        poll(0)
        return True

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything sent so far to be acknowledged; True if it was."""
        return self._producer.flush(timeout_s) == 0

    def flush(self, timeout_s: float) -> int:
        return self._producer.flush(timeout_s)


class _NativeSender:
    """Through the C producer of `stream.kafka.native`: a burst is one ``rd_kafka_produce_batch()`` call and one
    delivery slot, so producing costs a fraction of the CPU a produce() call per event does (a load generator
    that shares the machine with the broker and the worker takes less from them). Delivery latency is timed
    per burst, from its hand-over to the report that completes it."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.report = _Deliveries()
        self._producer = NativeProducer(config, topic, slots=_NATIVE_SLOTS)
        self._free = list(range(_NATIVE_SLOTS))
        self._pending: dict[int, tuple[int, float]] = {}  # slot -> (events, handed over at)

    def send(self, frames: EventFrames, start: int, stop: int, ts: bytes, keys: list[bytes | None]) -> bool:
        while not self._free:
            if self.report.failed:  # bursts with failed events never complete: their slots never come back
                return False
            self._settle(self._producer.poll(0.01))
        slot = self._free.pop()
        values, ends = frames.stamped_joined(start, stop, ts)
        self._pending[slot] = (stop - start, time.monotonic())
        self._producer.produce(values, ends, keys, np.full(stop - start, slot, dtype=np.int32))
        self._settle(self._producer.poll(0))
        return True

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything sent so far to be acknowledged; True if it was."""
        self._settle(self._producer.flush(timeout_s))
        return not self._pending

    def flush(self, timeout_s: float) -> int:
        self._settle(self._producer.flush(timeout_s))
        self._producer.close(0.0)
        return sum(events for events, _ in self._pending.values())  # a burst with a failed event never completes

    def _settle(self, done: np.ndarray) -> None:
        now = time.monotonic()
        report = self.report
        for slot in done.tolist():
            events, sent_at = self._pending.pop(slot)
            self._free.append(slot)
            report.delivered += events
            report.latencies.append(now - sent_at)
        failed, total, fatal = self._producer.failures()
        report.failed += total
        if report.first_error is None and (failed or fatal):
            report.first_error = fatal or failed[0][2]


def _framed_blocks(schema: RegisteredSchema, count: int, seed: int, start: int,
                   ts_len: int) -> Iterator[tuple[int, EventFrames, list[bytes | None]]]:
    """Events ``start .. start+count-1`` in blocks: (index of the block's first event, its framed values, keys)."""
    key_bytes: dict[str, bytes] = {}  # a few thousand accounts: one bytes object each, shared by their events
    done = 0
    while done < count:
        block = generate_events(min(BLOCK, count - done), seed=seed, start=start + done)
        frames = EventFrames.build(schema, block.event_ids, block.keys, block.features, ts_len)
        keys: list[bytes | None] = [key_bytes.get(k) or key_bytes.setdefault(k, k.encode()) for k in block.keys]
        yield start + done, frames, keys
        done += len(block)


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
    native: bool = False,
    pregenerate: bool = False,
) -> ProduceSummary:
    """Produce events ``start .. start+count-1`` of stream ``seed``; ``rate`` in events/s (None: as fast as possible).
    A rate's schedule (and the summary's seconds) starts once the first burst is acknowledged, so that the
    producer's start-up (connection, metadata, idempotent producer id) does not turn into a burst.

    Each event's ``ts_ms`` is stamped when it is handed to the producer. Setting ``stop`` ends the run
    early: the summary then reports what was sent (events ``start .. start+requested-1``). ``native`` sends
    through the C producer of `stream.kafka.native` (RuntimeError where it is unavailable): delivery latency is then
    timed per burst of events rather than per event. ``pregenerate`` draws and frames every event before the
    first is sent (memory: about 200 bytes an event until it is sent), so that the paced run only stamps and
    sends: a load generator that shares the machine with what it measures then takes as little of it as it can.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0")
    schema = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
    config = {"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
              "enable.idempotence": True, "acks": "all", **(config or {})}
    if native and native_unavailable() is not None:
        raise RuntimeError(f"native producer requested but unavailable: {native_unavailable()}")
    ts_len = len(avro_long(int(time.time() * 1000)))
    blocks: Iterator[tuple[int, EventFrames, list[bytes | None]]] = _framed_blocks(schema, count, seed, start, ts_len)
    if pregenerate:  # sent blocks are dropped from the front as the run goes
        ready = deque(blocks)
        blocks = (ready.popleft() for _ in range(len(ready)))
    # librdkafka's own lines (a broker that went away, ...) through a logger, repeats held back, not on stderr.
    sender = (_NativeSender(config, topic) if native
              else _ClientSender({"logger": client_logger("load-generator"), **config}, topic))
    # Wake up about once a millisecond at most: waking per event (tens of us apart) cost more CPU than sending.
    min_burst = max(1, int(rate / 1000)) if rate is not None else 1
    started = time.monotonic()
    sent = 0
    paced = False  # a rate's schedule starts once the first burst is acknowledged
    stalled = False  # the native path ran out of delivery slots after failures: stop, report what was sent
    for first, frames, keys in blocks:
        if stop is not None and stop.is_set():
            break
        i = 0
        while i < len(frames) and not (stop is not None and stop.is_set()):
            # Send in bursts: every event due by now (all of the block without a rate), then wait for the next.
            end = min(len(frames), i + _BURST)
            if rate is not None:
                due = int((time.monotonic() - started) * rate) + 1 - sent
                wanted = min(min_burst, len(frames) - i)
                if due < wanted:
                    time.sleep((wanted - due) / rate)
                    continue
                end = min(end, i + due)
            ts = avro_long(int(time.time() * 1000))  # stamped as the burst is handed over
            if len(ts) != frames.ts_len:  # the clock's varint grew a byte (or a test clock): frame again
                block = generate_events(len(frames), seed=seed, start=first)
                frames = EventFrames.build(schema, block.event_ids, block.keys, block.features, len(ts))
            if not sender.send(frames, i, end, ts, keys[i:end]):
                stalled = True
                break
            sent += end - i
            i = end
            if rate is not None and not paced:
                # A fresh producer spends its first few hundred ms connecting, looking the topic up and
                # getting its idempotent producer id; events stamped meanwhile would reach the broker in one
                # lump, a burst of rate x that delay that the rate never asked for. So the schedule starts
                # once the first burst is acknowledged; that burst keeps its stamp. Bounded: a broker that is
                # not there fails the run in the final flush, and waiting here would only double that time.
                paced = True
                sender.settle(min(timeout_s, _START_WAIT_S))
                started = time.monotonic() - sent / rate
        if on_progress is not None:
            on_progress(sent)
        if stalled:
            break
    remaining = sender.flush(timeout_s)
    seconds = time.monotonic() - started
    report = sender.report
    lat = np.frombuffer(report.latencies, dtype=np.float32) * 1000.0 if len(report.latencies) else np.zeros(1)
    # Natively, what is not delivered is what `flush` found still pending; its failures are among those.
    failed = remaining if native else report.failed + remaining
    return ProduceSummary(sent, report.delivered, failed, seconds, float(np.percentile(lat, 50)),
                          float(np.percentile(lat, 99)),
                          report.first_error or (f"{remaining} undelivered after flush" if remaining else None),
                          _event_ids(report.failed_values))


def _event_ids(values: list[bytes]) -> tuple[str, ...]:
    registry = SchemaRegistry.from_dir()
    return tuple(str(decode(registry, v)[1]["event_id"]) for v in values)
