"""The chaos suite's independent verifier: reads the output and dead-letter topics from the beginning
(read_committed) knowing nothing of the workers, and checks the topics for hanging transactions."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.verify import decode_value, end_offsets, headers_of, partitions, source_of, writer_schemas


class Verifier:
    """Reads output and DLQ (read_committed) from the beginning; knows nothing of the workers."""

    def __init__(self, bootstrap: str, output_topic: str, dlq_topic: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in (output_topic, dlq_topic)
                              for p in partitions(bootstrap, t)])
        self.output_topic = output_topic
        # (topic, partition, input partition, input offset, event id, offset, timestamp) per record read
        self.outputs: list[tuple[str, int, int, int, str, int, int]] = []
        self._ids: dict[str, int] = defaultdict(int)
        self.violations: list[tuple[str, int, int, int, int, str]] = []
        self.append_ms: list[int] = []  # the output records' timestamps (append times on the chaos topics)
        self._schemas = writer_schemas()

    def _consume(self, timeout_s: float) -> int:
        schemas = self._schemas
        n = 0
        for m in self.consumer.consume(10_000, timeout_s):
            if m.error() is not None:
                continue
            headers = headers_of(m)
            if m.topic() == self.output_topic:
                record = decode_value(schemas, m.value())  # type: ignore[arg-type]
                event_id = str(record["event_id"])
                self.append_ms.append(m.timestamp()[1])
            else:
                record = {}
                event_id = f"dlq:{(m.key() or b'').decode()}"  # poison keys are unique
            src = source_of(record, headers)[1:]
            self._ids[event_id] += 1
            self.outputs.append((m.topic(), m.partition(), src[0], src[1], event_id, m.offset(), m.timestamp()[1]))
            n += 1
        return n

    def read_until(self, expected: set[str], deadline: float) -> None:
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            if self._consume(0.5):
                idle_since = time.monotonic()
            if all(e in self._ids for e in expected):
                return
            if time.monotonic() - idle_since > 120:
                return

    def read_more(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._consume(0.2)

    def id_counts(self) -> dict[str, int]:
        return {k: v for k, v in self._ids.items() if not k.startswith("dlq:")}

    def dead_letter_counts(self) -> dict[str, int]:
        return {k[4:]: v for k, v in self._ids.items() if k.startswith("dlq:")}

    def duplicate_details(self, limit: int = 20, dead_letters: bool = True) -> list[str]:
        """Where the first ``limit`` ids read more than once were written: each copy's topic, partition, offset and
        timestamp, and the input record it names (to tell a replayed batch from a record written twice).
        ``dead_letters``: dead-letter records' repeats too."""
        repeated = {k for k, v in self._ids.items() if v > 1 and (dead_letters or not k.startswith("dlq:"))}
        copies: dict[str, list[str]] = defaultdict(list)
        for topic, partition, src_p, src_off, event_id, offset, ts in self.outputs:
            if event_id in repeated and (event_id in copies or len(copies) < limit):
                copies[event_id].append(f"{topic}[{partition}]@{offset} ts={ts} from input[{src_p}]@{src_off}")
        return [f"{event_id}: " + "; ".join(where) for event_id, where in copies.items()]

    def duplicate_bursts(self, gap_ms: int = 500) -> list[tuple[int, int, int]]:
        return duplicate_bursts(self.outputs, self.output_topic, gap_ms)

    def peak_appended(self, window_ms: int) -> int:
        return peak_within(self.append_ms, window_ms)

    def upstream_repeats(self) -> int:
        """Output repeats that are not the workers': copies of one id that name different input records, so the
        input held the event more than once (a producer that sends again a record whose delivery failed though it
        was written: the load generator never does, so this stays 0 unless something upstream repeats).
        Exactly-once is one output per input record."""
        records: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for _, _, src_p, src_off, event_id, _, _ in self.outputs:
            records[event_id].add((src_p, src_off))
        return sum(len(r) - 1 for r in records.values() if len(r) > 1)

    def order_violations(self) -> int:
        """Per (output partition, input partition): input offsets must increase, repeats dropped."""
        last: dict[tuple[str, int, int], int] = {}
        seen: set[tuple[int, int]] = set()
        violations = 0
        for topic, partition, src_p, src_off, event_id, _, _ in self.outputs:
            if (src_p, src_off) in seen:
                continue  # a repeat (at-least-once replay)
            seen.add((src_p, src_off))
            key = (topic, partition, src_p)
            if key in last and src_off < last[key]:
                violations += 1
                self.violations.append((topic, partition, src_p, last[key], src_off, event_id))
            last[key] = src_off
        return violations

    def close(self) -> None:
        self.consumer.close()


def duplicate_bursts(outputs: list[tuple[str, int, int, int, str, int, int]], output_topic: str,
                     gap_ms: int = 500) -> list[tuple[int, int, int]]:
    """The output's repeats grouped by when their first copy was appended: (first, last append time in ms,
    repeats) per run of first copies no more than ``gap_ms`` apart. A replica killed, or a partition handed
    over, shows as one burst: what it had delivered and not yet committed. ``outputs``: `Verifier.outputs`."""
    first: dict[tuple[int, int], int] = {}
    copies: dict[tuple[int, int], int] = defaultdict(int)
    for topic, _, src_p, src_off, _, _, ts in outputs:
        if topic == output_topic:
            first.setdefault((src_p, src_off), ts)
            copies[(src_p, src_off)] += 1
    times = sorted(t for record, t in first.items() for _ in range(copies[record] - 1))
    bursts: list[tuple[int, int, int]] = []
    for t in times:
        if bursts and t - bursts[-1][1] <= gap_ms:
            bursts[-1] = (bursts[-1][0], t, bursts[-1][2] + 1)
        else:
            bursts.append((t, t, 1))
    return bursts


def peak_within(times_ms: list[int], window_ms: int) -> int:
    """The most of ``times_ms`` within any ``window_ms`` (both ends included): the fleet's fastest stretch."""
    times = sorted(times_ms)
    peak, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] < t - window_ms:
            lo += 1
        peak = max(peak, hi - lo + 1)
    return peak


def hanging_transactions(bootstrap: str, topics: list[str]) -> list[str]:
    """Partitions whose last stable offset (read_committed end) lags the high watermark: an open transaction."""
    client = AdminClient({"bootstrap.servers": bootstrap})
    problems = []
    for topic in topics:
        tps = [TopicPartition(topic, p) for p in partitions(bootstrap, topic)]
        committed = client.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                        isolation_level=IsolationLevel.READ_COMMITTED)
        uncommitted = client.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                          isolation_level=IsolationLevel.READ_UNCOMMITTED)
        for tp in tps:
            lso = next(f.result().offset for k, f in committed.items() if k.partition == tp.partition)
            hw = next(f.result().offset for k, f in uncommitted.items() if k.partition == tp.partition)
            if lso != hw:
                problems.append(f"{topic}[{tp.partition}]: last stable offset {lso} < high watermark {hw}")
    return problems


def uncommitted_extra(bootstrap: str, topic: str, committed_count: int) -> int:
    """Records in the topic beyond what read_committed returned (aborted transactions' records and markers)."""
    ends = end_offsets(bootstrap, topic)
    return sum(ends.values()) - committed_count
