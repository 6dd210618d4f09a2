"""The Publisher without a broker: records to an unreachable address time out in librdkafka and come back as
failed delivery reports, which is enough to check who serves them and what a full local queue does."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.errors import PublishError, StreamError, TransactionError
from stream.kafka import publish
from stream.kafka.delivery import SpanDelivery
from stream.kafka.guarded import GuardedCalls
from stream.kafka.offsets import OffsetTracker
from stream.kafka.publish import Publisher

UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 200, "log_level": 0,
               "queue.buffering.max.messages": 4}


def spans(publisher: Publisher, n: int) -> list[SpanDelivery]:
    tracker = OffsetTracker()
    tracker.assign([("in", 0)])
    return [SpanDelivery(publisher, tracker.dispatch(("in", 0), 0, n - 1, n))] * n


def test_a_full_local_queue_is_freed_by_serving_delivery_reports_on_the_producing_thread() -> None:
    """10 records through a queue of 4: produce_many serves reports (here, timeouts) until each one fits; the
    callbacks run on the calling thread, and every failure is recorded, none acknowledged."""
    done: list[SpanDelivery] = []
    publisher = Publisher(UNREACHABLE, on_span_done=done.append)
    threads: set[str] = set()
    original = publisher.record_failure

    def record(error: PublishError, msg: object) -> None:
        threads.add(threading.current_thread().name)
        original(error, msg)  # type: ignore[arg-type]

    publisher.record_failure = record  # type: ignore[method-assign]
    callbacks = spans(publisher, 10)
    started = time.monotonic()
    publisher.produce_many("out", [b"v"] * 10, [None] * 10, [None] * 10, callbacks)
    assert time.monotonic() - started >= 0.2  # the sixth record waited for the first ones to time out
    assert publisher.close(5.0) == 0  # serves the last reports, on this thread too
    assert threads == {threading.current_thread().name}
    assert isinstance(publisher.failure(), PublishError)
    assert callbacks[0].span.outstanding == 10 and done == []


def test_closing_from_another_thread_stops_a_producer_waiting_for_queue_space() -> None:
    """Shutdown closes the publisher when the processor did not stop in time: a processor blocked on a full
    queue gives up, and close reports what is still undelivered."""
    publisher = Publisher({**UNREACHABLE, "message.timeout.ms": 60_000}, on_span_done=lambda d: None)
    publisher.produce_many("out", [b"v"] * 4, [None] * 4, [None] * 4, spans(publisher, 4))  # fills the queue
    undelivered: list[int] = []
    closer = threading.Timer(0.2, lambda: undelivered.append(publisher.close(0.2)))
    closer.start()
    with pytest.raises(PublishError, match="closed while the local queue was full"):
        publisher.produce_many("out", [b"v"], [None], [None], spans(publisher, 1))
    closer.join()
    assert undelivered == [4]


def test_a_guarded_call_returns_raises_or_is_abandoned_when_it_blocks_past_its_bound() -> None:
    guard = GuardedCalls()
    ran: list[str] = []
    assert guard.run(lambda: ran.append(threading.current_thread().name), 5.0)
    assert ran == ["txn-guard"]
    def fail() -> None:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        guard.run(fail, 5.0)
    release = threading.Event()
    started = time.monotonic()
    assert not guard.run(lambda: (release.wait(30), None)[1], 0.2)
    assert 0.2 <= time.monotonic() - started < 5
    stuck = guard.abandon()
    assert stuck.is_alive()
    assert guard.run(lambda: ran.append("after"), 5.0), "the next call runs on a fresh thread"
    release.set()
    stuck.join(5)
    assert not stuck.is_alive(), "the abandoned thread ends once its call returns"


class FakeTxnProducer:
    """A transactional producer whose first instance blocks in send_offsets_to_transaction (librdkafka#5456)."""

    instances: ClassVar[list[FakeTxnProducer]] = []

    def __init__(self, config: dict[str, object]) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        self.stuck = not FakeTxnProducer.instances
        FakeTxnProducer.instances.append(self)

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets: object, metadata: object, timeout: float) -> None:
        self.calls.append("send_offsets")
        if self.stuck:
            self.release.wait(30)  # past its timeout: the bug

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def flush(self, timeout: float = 0) -> int:
        return 0

    def poll(self, timeout: float = 0) -> int:
        return 0


def test_a_stuck_send_offsets_hands_the_transaction_to_a_fresh_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeTxnProducer.instances = []
    monkeypatch.setattr(publish, "Producer", FakeTxnProducer)
    monkeypatch.setattr(publish, "SEND_OFFSETS_TIMEOUT_S", 0.2)
    monkeypatch.setattr(publish, "SEND_OFFSETS_GRACE_S", 0.2)
    publisher = Publisher({"transactional.id": "t"}, on_span_done=lambda d: None)
    publisher.init_transactions(5.0)
    publisher.begin_transaction()
    started = time.monotonic()
    with pytest.raises(TransactionError) as raised:
        publisher.commit_transaction([TopicPartition("in", 0, 5)], object(), 60.0)
    assert time.monotonic() - started < 5, "bounded by the send-offsets timeout and its grace, not 60 s"
    assert raised.value.producer_replaced and raised.value.requires_abort
    stuck, fresh = FakeTxnProducer.instances
    assert stuck.calls == ["init", "begin", "send_offsets"]
    assert fresh.calls == ["init"], "the fresh producer's init fences the stuck one"
    publisher.abort_transaction(5.0)  # nothing open on the fresh producer: nothing to abort
    assert fresh.calls == ["init"]
    publisher.begin_transaction()
    publisher.commit_transaction([TopicPartition("in", 0, 9)], object(), 60.0)
    assert fresh.calls == ["init", "begin", "send_offsets", "commit"]
    stuck.release.set()


def test_too_many_stuck_producers_at_once_stop_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeTxnProducer.instances = []
    monkeypatch.setattr(publish, "Producer", FakeTxnProducer)
    original = FakeTxnProducer.__init__

    def always_stuck(self: FakeTxnProducer, config: dict[str, object]) -> None:
        original(self, config)
        self.stuck = True

    monkeypatch.setattr(FakeTxnProducer, "__init__", always_stuck)
    monkeypatch.setattr(publish, "SEND_OFFSETS_TIMEOUT_S", 0.05)
    monkeypatch.setattr(publish, "SEND_OFFSETS_GRACE_S", 0.05)
    publisher = Publisher({"transactional.id": "t"}, on_span_done=lambda d: None)
    for _ in range(publish.MAX_STUCK_PRODUCERS):
        publisher.begin_transaction()
        with pytest.raises(TransactionError):
            publisher.commit_transaction([], object(), 60.0)
    publisher.begin_transaction()
    with pytest.raises(StreamError, match="stuck in send_offsets_to_transaction"):
        publisher.commit_transaction([], object(), 60.0)
    for producer in FakeTxnProducer.instances:
        producer.release.set()


def fatal(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "as librdkafka raises it", fatal=True))


@pytest.mark.parametrize("code", [KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_TXN_STATE,
                                  KafkaError._FENCED])
def test_a_fatal_idempotence_error_hands_over_to_a_fresh_producer_but_fencing_stays_fatal(
        monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    class Broken(FakeTxnProducer):
        def send_offsets_to_transaction(self, offsets: object, metadata: object, timeout: float) -> None:
            self.calls.append("send_offsets")
            if self is FakeTxnProducer.instances[0]:
                raise fatal(code)

        def purge(self) -> None:
            self.calls.append("purge")

    FakeTxnProducer.instances = []
    monkeypatch.setattr(publish, "Producer", Broken)
    publisher = Publisher({"transactional.id": "t"}, on_span_done=lambda d: None)
    publisher.init_transactions(5.0)
    publisher.begin_transaction()
    with pytest.raises(TransactionError) as raised:
        publisher.commit_transaction([TopicPartition("in", 0, 5)], object(), 60.0)
    assert raised.value.fatal
    if code == KafkaError._FENCED:
        assert publisher.broken() is None, "a newer instance owns the transactional id: the worker stops"
        return
    assert publisher.broken() is not None and publisher.broken().code() == code  # type: ignore[union-attr]
    publisher.replace_broken_producer(5.0)
    old, fresh = FakeTxnProducer.instances
    assert old.calls == ["init", "begin", "send_offsets", "purge"]
    assert fresh.calls == ["init"], "the fresh producer's init fences the broken one and aborts its transaction"
    assert publisher.broken() is None
    publisher.abort_transaction(5.0)  # nothing open on the fresh producer
    publisher.begin_transaction()
    publisher.commit_transaction([TopicPartition("in", 0, 9)], object(), 60.0)
    assert fresh.calls == ["init", "begin", "send_offsets", "commit"]
    for _ in range(publish.MAX_REPLACEMENTS - 1):
        publisher._broken = KafkaError(code, "again", fatal=True)
        publisher.replace_broken_producer(5.0)
    publisher._broken = KafkaError(code, "again", fatal=True)
    with pytest.raises(StreamError, match="broke 4 times"):
        publisher.replace_broken_producer(5.0)


def test_a_fatal_idempotence_error_from_the_error_callback_is_not_a_worker_failure() -> None:
    publisher = Publisher({"transactional.id": "t", **UNREACHABLE}, on_span_done=lambda d: None)
    publisher._on_client_error(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True))
    assert publisher.failure() is None and publisher.broken() is not None
    publisher._on_client_error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    assert publisher.failure() is not None, "fencing fails the worker"
    plain = Publisher(UNREACHABLE, on_span_done=lambda d: None)
    plain._on_client_error(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True))
    assert plain.failure() is not None, "an idempotent (non-transactional) producer has nothing to rewind"


def test_an_abort_is_retried_in_slices_with_the_delivery_reports_served_between(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's abort times out while the transaction's delivery reports wait to be served."""
    FakeTxnProducer.instances = []
    monkeypatch.setattr(publish, "Producer", FakeTxnProducer)
    publisher = Publisher({"transactional.id": "t"}, on_span_done=lambda d: None)
    producer = FakeTxnProducer.instances[0]
    polls: list[str] = []
    timeouts = [2]

    def abort(timeout: float) -> None:
        producer.calls.append(f"abort({timeout:g})")
        if timeouts[0]:
            timeouts[0] -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the event queue must be polled"))

    monkeypatch.setattr(producer, "abort_transaction", abort)
    monkeypatch.setattr(producer, "poll", lambda timeout=0: polls.append("poll") or 0)
    publisher.begin_transaction()
    publisher.abort_transaction(60.0)
    assert producer.calls == ["begin", "abort(1)", "abort(1)", "abort(1)"]
    assert len(polls) == 3, "reports served before each slice"


def test_a_fatal_error_met_while_serving_is_a_typed_error_that_keeps_librdkafkas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transactional producer's poll raises its fatal error as a bare KafkaException; the idle finish thread
    may meet it before init_transactions does, and the worker names the ACL to grant from a KafkaClientError."""
    FakeTxnProducer.instances = []
    monkeypatch.setattr(publish, "Producer", FakeTxnProducer)
    publisher = Publisher({"transactional.id": "t"}, on_span_done=lambda d: None)
    refused = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "not allowed", fatal=True)

    def poll(timeout: float = 0) -> int:
        raise KafkaException(refused)

    monkeypatch.setattr(FakeTxnProducer.instances[0], "poll", poll)
    with pytest.raises(PublishError) as raised:
        publisher.serve()
    assert raised.value.kafka_error is refused and raised.value.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
