"""Taking input records through confluent-kafka's consume() (the C consumer is tested against a broker in
tests/integration/test_native.py): error events are not records; which errors stop the worker."""

from __future__ import annotations

import time
import weakref

import numpy as np
import pytest
from confluent_kafka import KafkaError

from stream.errors import KafkaClientError
from stream.kafka.intake import Intake, consume_error
from stream.kafka.records import MESSAGES_A_CONSUME, Records


class Msg:
    def __init__(self, partition: int, offset: int, err: KafkaError | None = None,
                 headers: list[tuple[str, bytes]] | None = None) -> None:
        self._p, self._o, self._err, self._headers = partition, offset, err, headers

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def error(self) -> KafkaError | None:
        return self._err

    def value(self) -> bytes:
        return b"v%d" % self._o

    def key(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def timestamp(self) -> tuple[int, int]:
        return 1, 1000 + self._o  # (TIMESTAMP_CREATE_TIME, ms)

    def offset(self) -> int:
        return self._o


class Consumer:
    def __init__(self, messages: list[Msg]) -> None:
        self.messages = messages
        self.asked: list[tuple[int, float]] = []

    def consume(self, n: int, timeout: float) -> list[Msg]:
        self.asked.append((n, timeout))
        return self.messages


def test_error_events_are_left_out_of_the_records() -> None:
    consumer = Consumer([Msg(0, 5), Msg(0, -1, KafkaError(KafkaError._PARTITION_EOF)), Msg(1, 7)])
    records = Intake(consumer, None, lambda: 0.0).take(10, 0.5)  # type: ignore[arg-type]
    assert records.partitions.tolist() == [0, 1] and records.offsets.tolist() == [5, 7]
    assert consumer.asked == [(10, 0.5)]
    assert len(Intake(Consumer([]), None, lambda: 0.0).take(1, 0.0)) == 0  # type: ignore[arg-type]


class Backlog:
    """A consumer with a backlog: consume(n, timeout) gives up to n of the records it still has."""

    def __init__(self, count: int) -> None:
        self.left = [Msg(0, i) for i in range(count)]
        self.asked: list[tuple[int, float]] = []

    def consume(self, n: int, timeout: float) -> list[Msg]:
        self.asked.append((n, timeout))
        taken, self.left = self.left[:n], self.left[n:]
        return taken


def test_a_first_take_waits_for_one_record_then_takes_what_is_there_in_one_piece() -> None:
    consumer = Backlog(10)
    intake = Intake(consumer, None, lambda: 0.0)  # type: ignore[arg-type]
    records = intake.take(4, 0.5, first=True)
    assert records.offsets.tolist() == [0, 1, 2, 3] and consumer.asked == [(1, 0.5), (3, 0)]
    assert intake.take(1, 0.5, first=True).offsets.tolist() == [4] and consumer.asked[2:] == [(1, 0.5)]
    empty = Backlog(0)
    assert len(Intake(empty, None, lambda: 0.0).take(4, 0.2, first=True)) == 0  # type: ignore[arg-type]
    assert empty.asked == [(1, 0.2)]  # nothing came within the wait: no second call


class Held(Backlog):
    """A backlog whose consume() records which of the Messages it gave earlier are still alive when it is called
    again (confluent-kafka's Message holds its record's parsed headers)."""

    def __init__(self, count: int, replies_at: set[int]) -> None:
        super().__init__(count)
        for m in self.left:
            if m._o in replies_at:
                m._headers = [("stream.reply", b"t:0:%d" % m._o)]
        self.given: list[weakref.ref[Msg]] = []
        self.alive_at_call: list[int] = []

    def consume(self, n: int, timeout: float) -> list[Msg]:
        self.alive_at_call.append(sum(ref() is not None for ref in self.given))
        taken = super().consume(n, timeout)
        self.given += [weakref.ref(m) for m in taken]
        return taken


def test_a_take_through_consume_asks_for_at_most_a_few_records_a_call_and_lets_each_call_s_go_before_the_next(
        ) -> None:
    """A take of 300 (a batch's worth) is several calls of at most MESSAGES_A_CONSUME, none holding the Messages of
    the one before it: a record's Message holds its headers parsed whole (up to 100,000 of them, some 6 MB), so 300
    at once could hold 2 GB."""
    k = MESSAGES_A_CONSUME
    assert 16 <= k <= 128
    consumer = Held(400, replies_at={3, k + 5, 299})
    records = Intake(consumer, None, lambda: 0.0).take(300, 0.5)  # type: ignore[arg-type]
    calls = -(-300 // k)
    assert consumer.asked == [(k, 0.5)] * (calls - 1) + [(300 - k * (calls - 1), 0.5)]
    assert consumer.alive_at_call == [0] * calls
    assert records.offsets.tolist() == list(range(300))
    assert records.replies is not None and sorted(records.replies) == [3, k + 5, 299]  # rows of the whole take
    assert records.replies[k + 5][0] == b"t:0:%d" % (k + 5) and records.replies[299][0] == b"t:0:299"
    # a first take: one record within the wait, then what is already there, as many calls
    first = Held(400, replies_at=set())
    records = Intake(first, None, lambda: 0.0).take(300, 0.5, first=True)  # type: ignore[arg-type]
    assert first.asked[0] == (1, 0.5) and first.asked[1] == (k, 0) and len(first.asked) == 1 + -(-299 // k)
    assert set(first.alive_at_call) == {0}
    assert records.offsets.tolist() == list(range(300))


def test_a_take_through_consume_waits_out_what_is_left_of_its_bound_and_stops_at_a_short_call() -> None:
    clock = iter([10.0, 10.2, 10.45])

    class Trickle(Backlog):
        """All that is asked for twice, then one record (the wait ran out)."""

        def consume(self, n: int, timeout: float) -> list[Msg]:
            self.asked.append((n, timeout))
            return [Msg(0, len(self.asked))] * (n if len(self.asked) < 3 else 1)

    consumer = Trickle(0)
    records = Intake(consumer, None, lambda: next(clock)).take(1000, 0.5)  # type: ignore[arg-type]
    # the bound is the take's, not each call's: 0.5 s from 10.0, then what is left of it
    k = MESSAGES_A_CONSUME
    assert [n for n, _ in consumer.asked] == [k, k, k]
    assert [round(t, 6) for _, t in consumer.asked] == [0.5, 0.3, 0.05]
    assert len(records) == 2 * k + 1  # the third call came back short: nothing more within the bound


def test_a_reply_address_is_kept_for_its_row_and_follows_it_through_select_split_and_concat() -> None:
    consumer = Consumer([Msg(0, 5, headers=[("other", b"x")]), Msg(0, -1, KafkaError(KafkaError._PARTITION_EOF)),
                         Msg(1, 7, headers=[("stream.reply", b"old"), ("stream.reply", b"t:3:abc")]), Msg(1, 8)])
    before = time.time_ns()
    records = Intake(consumer, None, lambda: 0.0).take(10, 0.5)  # type: ignore[arg-type]
    assert records.replies is not None and list(records.replies) == [1]  # at the row of its record
    address = records.replies[1]
    # the last such header; then the record's timestamp (ms) and when it was taken (ns), as the native consumer's
    assert address[:5] == (b"t:3:abc", None, None, None, 1007)
    assert before <= address[5] <= time.time_ns()  # type: ignore[operator]
    head, rest = records.split(2)
    assert head.replies == {1: address} and rest.replies is None
    head, rest = records.split(1)
    assert head.replies is None and rest.replies == {0: address}
    assert records.select(np.array([2, 1])).replies == {1: address}
    assert records.select(np.array([0, 2])).replies is None
    joined = Records.concat([records, records])
    assert joined.replies == {1: address, 4: address} and joined.offsets.tolist() == [5, 7, 8] * 2


def test_end_of_partition_and_retriable_errors_go_on_others_stop_the_worker() -> None:
    consume_error(KafkaError(KafkaError._PARTITION_EOF))
    consume_error(KafkaError(KafkaError._TRANSPORT, retriable=True))
    with pytest.raises(KafkaClientError):
        consume_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaClientError):
        consume_error(KafkaError(KafkaError._FATAL, fatal=True))


class Leaving:
    """A consumer's group side, as `leave_group` uses it: unsubscribed, then polled until nothing is assigned."""

    def __init__(self, assigned: int = 0) -> None:
        self.assigned = assigned
        self.calls: list[str] = []

    def unsubscribe(self) -> None:
        self.calls.append("unsubscribe")

    def assignment(self) -> list[int]:
        return list(range(self.assigned))

    def poll(self, timeout: float) -> None:
        self.calls.append("poll")
        self.assigned = max(self.assigned - 1, 0)  # the revoke served in the poll

    def close(self) -> None:
        self.calls.append("close")


def test_the_group_is_left_and_its_callbacks_served_before_the_close() -> None:
    from stream.kafka.intake import close_within

    consumer = Leaving(assigned=3)
    assert close_within(consumer, 5.0) is True  # type: ignore[arg-type]
    assert consumer.calls[0] == "unsubscribe" and consumer.calls[-1] == "close"
    assert consumer.calls.count("poll") >= 3 and consumer.assigned == 0


def test_a_close_that_hangs_holding_the_interpreter_still_ends_the_process() -> None:
    """librdkafka #4884: an assignment met inside the close makes it wait for ever in confluent-kafka's rebalance
    callback, which holds the GIL, so no Python thread runs again. Here the close is libc's sleep called holding
    the GIL (ctypes.PyDLL): the watchdog ends the process soon after the bound, with every thread's stack."""
    import subprocess
    import sys
    import time

    code = """if True:
        import ctypes, sys
        from stream.kafka import intake
        intake._HELD_GRACE_S = 1.0
        class Held:
            def unsubscribe(self): pass
            def assignment(self): return []
            def poll(self, timeout): pass
            def close(self): ctypes.PyDLL(None).sleep(60)
        intake.close_within(Held(), 1.0)
        print("close_within returned", flush=True)
    """
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    took = time.monotonic() - started
    assert out.returncode == 1 and "close_within returned" not in out.stdout, (out.returncode, out.stdout)
    assert "Timeout" in out.stderr and "in close" in out.stderr, out.stderr
    assert took < 30, took


def test_a_consumer_close_that_never_returns_is_left_behind_within_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    """The worker's shutdown leaves the group through `close_within`: a close that hangs costs the bound, not the
    process (the worker then ends without the client's destructor), and a close that raises is logged."""
    import threading
    import time

    from stream.kafka.intake import close_within

    release = threading.Event()

    class Stuck(Leaving):
        def close(self) -> None:
            release.wait(30)

    class Failing(Leaving):
        def close(self) -> None:
            raise RuntimeError("broker gone")

    started = time.monotonic()
    assert close_within(Stuck(), 0.3) is False  # type: ignore[arg-type]
    assert time.monotonic() - started < 2.0
    assert "the consumer's close did not return within" in caplog.text
    release.set()
    assert close_within(Failing(), 5.0) is True  # type: ignore[arg-type]
    assert "consumer close: broker gone" in caplog.text
