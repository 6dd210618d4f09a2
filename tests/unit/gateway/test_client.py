"""The gateway's side of the queue (`stream.gateway.client.PredictionClient`) and its view of the workers
(`stream.gateway.presence`), over stand-ins for librdkafka's clients (against Kafka:
tests/integration/test_gateway.py)."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from stream.codec import SchemaRegistry, encode
from stream.codec.registry import FolderRegistry
from stream.gateway import client as client_module
from stream.gateway.client import Prediction, PredictionClient
from stream.gateway.errors import (
    BadReply,
    DeadLetteredAtModel,
    NotSent,
    NoWorkers,
    Overloaded,
    Oversized,
    RequestTimeout,
)
from stream.gateway.presence import WorkerPresence
from stream.kafka.publish import DLQ_ERROR_MESSAGE, DLQ_ERROR_REASON, DLQ_STAGE, HEADER_OFFSET, HEADER_PARTITION
from stream.kafka.records import MESSAGES_A_CONSUME
from stream.kafka.replies import REPLY_HEADER

REGISTRY = SchemaRegistry.from_dir()
PREDICTION = REGISTRY.by_name("stream.demo.FraudPrediction")


class Message:
    def __init__(self, value: bytes | None, headers: list[tuple[str, bytes]], partition: int = 0, offset: int = 0,
                 error: KafkaError | None = None) -> None:
        self._value, self._headers, self._error = value, headers, error
        self._partition, self._offset = partition, offset

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error


class Broker:
    """What the stand-ins share: the records produced, the replies to hand out, what fails."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes, bytes | None, dict[str, bytes]]] = []
        self.reports: deque[tuple[Any, KafkaError | None, Message]] = deque()
        self.replies: deque[Message] = deque()
        self.refuse_at: int | None = None  # produce() raises BufferError at this record
        self.too_large = 10**9
        self.report_error: KafkaError | None = None
        self.members = True
        self.lock = threading.Lock()


BROKER = Broker()


class Producer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf

    def produce(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None,
                on_delivery: Any = None) -> None:
        if BROKER.refuse_at is not None and len(BROKER.produced) >= BROKER.refuse_at:
            raise BufferError("Local: Queue full")
        if len(value) > BROKER.too_large:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        with BROKER.lock:
            BROKER.produced.append((topic, value, key, dict(headers)))
            BROKER.reports.append((on_delivery, BROKER.report_error, Message(value, headers, 2, len(BROKER.produced))))

    def poll(self, timeout: float = 0) -> int:
        with BROKER.lock:
            due = list(BROKER.reports)
            BROKER.reports.clear()
        for callback, err, msg in due:
            callback(err, msg)
        return len(due)

    def list_topics(self, topic: str, timeout: float = 0) -> Any:
        return SimpleNamespace(topics={topic: None})

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


class Consumer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf

    def get_watermark_offsets(self, tp: Any, timeout: float = 0) -> tuple[int, int]:
        return 0, 0

    def assign(self, tps: Any) -> None:
        pass

    def poll(self, timeout: float) -> Message | None:
        with BROKER.lock:
            if BROKER.replies:
                return BROKER.replies.popleft()
        time.sleep(min(timeout, 0.005))
        return None

    def consume(self, n: int, timeout: float) -> list[Message]:
        with BROKER.lock:
            out = [BROKER.replies.popleft() for _ in range(min(n, len(BROKER.replies)))]
        return out

    def close(self) -> None:
        pass


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class AdminClient:
    """Apache Kafka's answers: a group that does not exist is dead; the workers' group holds the input topic."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf

    def describe_consumer_groups(self, groups: list[str], request_timeout: float = 0) -> dict[str, Future[Any]]:
        out = {}
        for g in groups:
            if g.startswith("gateway-probe-"):
                out[g] = _done(SimpleNamespace(state=SimpleNamespace(name="DEAD"), members=[]))
                continue
            members = [SimpleNamespace(assignment=SimpleNamespace(topic_partitions=[SimpleNamespace(topic="in")]))]
            out[g] = _done(SimpleNamespace(state=SimpleNamespace(name="STABLE" if BROKER.members else "EMPTY"),
                                           members=members if BROKER.members else []))
        return out

    def list_consumer_groups(self, request_timeout: float = 0) -> Future[Any]:
        return _done(SimpleNamespace(valid=[SimpleNamespace(group_id="workers")] if BROKER.members else []))


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    global BROKER
    BROKER = Broker()
    for name, fake in (("Producer", Producer), ("Consumer", Consumer), ("AdminClient", AdminClient)):
        monkeypatch.setattr(client_module, name, fake)
    made = PredictionClient(bootstrap_servers="b", input_topic="in", reply_topic="in.replies", reply_partition=1,
                            source=FolderRegistry.from_dir(None), timeout_s=0.5, max_pending=3)
    yield made
    made.close(0)


def reply(correlation: str, headers: list[tuple[str, bytes]] | None = None, value: bytes | None = None) -> Message:
    record = {"event_id": "e", "model_name": "m", "model_version": "1", "fraud_score": 0.5, "is_fraud": False,
              "event_ts_ms": 0, "predicted_ts_ms": 0, "batch_size": 1}
    return Message(encode(PREDICTION, record) if value is None else value,
                   [(REPLY_HEADER, f"in.replies:1:{correlation}".encode()), (HEADER_PARTITION, b"2"),
                    (HEADER_OFFSET, b"41"), *(headers or [])])


def correlations() -> list[str]:
    return [h[REPLY_HEADER].decode().split(":", 2)[2] for _, _, _, h in BROKER.produced]


def test_each_event_is_answered_by_its_own_reply_or_its_dead_letter(client: PredictionClient) -> None:
    futures = client.send([b"a", b"b", b"c"], [b"k1", None, b"k3"])
    assert [key for _, _, key, _ in BROKER.produced] == [b"k1", None, b"k3"]
    first, second, third = correlations()
    BROKER.replies.extend([reply(second), reply(first, [(DLQ_STAGE, b"model"), (DLQ_ERROR_REASON, b"model-error"),
                                                        (DLQ_ERROR_MESSAGE, b"boom")]),
                           reply(third, value=b"\x00garbage")])
    prediction = futures[1].result(5)
    assert isinstance(prediction, Prediction) and prediction.record["fraud_score"] == 0.5
    assert (prediction.partition, prediction.offset) == (2, 41)
    with pytest.raises(DeadLetteredAtModel, match="boom") as dead:
        futures[0].result(5)
    assert dead.value.offset == 41
    with pytest.raises(BadReply, match="could not be read"):
        futures[2].result(5)
    assert client.pending == 0 and client.replies_read == 3


def test_a_request_is_sent_whole_or_not_at_all(client: PredictionClient) -> None:
    client.send([b"a", b"b"])
    with pytest.raises(Overloaded, match="--max-pending 3"):
        client.send([b"c", b"d"])
    assert len(BROKER.produced) == 2 and client.pending == 2, "nothing of the refused request was sent"
    BROKER.replies.extend(reply(c) for c in correlations())
    deadline = time.monotonic() + 5
    while client.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    BROKER.members = False
    client.presence.check()
    client.presence._member_seen = client.presence._reply_seen = -1e9  # as if the grace had passed
    with pytest.raises(NoWorkers, match="no worker serves in"):
        client.send([b"e"])
    assert any("no worker serves in" in why for why in client.ready())
    assert len(BROKER.produced) == 2


def test_what_the_broker_s_client_refuses_is_named_without_its_internal_error(client: PredictionClient) -> None:
    BROKER.refuse_at = 1
    with pytest.raises(NotSent) as refused:
        client.send([b"a", b"b"])
    assert refused.value.index == 1 and refused.value.sent is True and "Queue full" not in str(refused.value)
    assert client.pending == 1, "the one sent still waits for its reply"
    BROKER.refuse_at = None
    BROKER.too_large = 10
    with pytest.raises(Oversized, match=r"message\.max\.bytes") as large:
        client.send([b"x" * 11])
    assert large.value.sent is False


def test_a_delivery_error_fails_its_event_and_a_late_one_times_out_saying_where_it_is(
        client: PredictionClient) -> None:
    BROKER.report_error = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    [big] = client.send([b"a"])
    with pytest.raises(Oversized, match=r"max\.message\.bytes"):
        big.result(5)
    BROKER.report_error = KafkaError(KafkaError._MSG_TIMED_OUT)
    [lost] = client.send([b"b"])
    with pytest.raises(NotSent) as not_sent:
        lost.result(5)
    assert "Message timed out" not in str(not_sent.value)
    BROKER.report_error = None
    [late] = client.send([b"c"])
    with pytest.raises(RequestTimeout) as timeout:
        late.result(5)
    assert timeout.value.partition == 2 and timeout.value.offset == 3 and "will still be predicted" in str(
        timeout.value)


def test_replies_are_read_a_few_at_a_time_each_call_s_let_go_before_the_next_and_expiries_served_between(
        client: PredictionClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of the reply topic may carry up to 100,000 headers (librdkafka parses them whole into its Message):
    the reply consumer asks for at most MESSAGES_A_CONSUME a call and holds no earlier call's Messages meanwhile;
    the calls past their deadline are expired at least every 512 replies, however fast they come."""
    given: list[weakref.ref[Message]] = []
    asked: list[tuple[int, int]] = []  # (n asked for, earlier Messages still alive)
    expired_at: list[int] = []
    consume, expire = client._consumer.consume, client._expire

    def consuming(n: int, timeout: float) -> list[Message]:
        asked.append((n, sum(ref() is not None for ref in given)))
        taken = consume(n, timeout)
        given.extend(weakref.ref(m) for m in taken)
        return taken

    def expiring(now: float) -> int:
        expired_at.append(client.replies_read)
        return expire(now)

    monkeypatch.setattr(client._consumer, "consume", consuming)
    monkeypatch.setattr(client, "_expire", expiring)
    with BROKER.lock:
        BROKER.replies.extend(reply(f"foreign-{i}") for i in range(1000))
    deadline = time.monotonic() + 10
    while client.replies_read < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.replies_read == 1000 and client.foreign_replies == 1000
    assert asked and max(n for n, _ in asked) == MESSAGES_A_CONSUME
    assert max(alive for _, alive in asked) <= 1  # at most the last Message read, still bound to the loop's name
    rounds = [b - a for a, b in itertools.pairwise([0, *sorted(set(expired_at))])]
    assert max(rounds) <= 512 + MESSAGES_A_CONSUME, rounds


def test_readiness_is_unknown_not_false_where_the_brokers_cannot_tell() -> None:
    class Tansu:
        """The embedded broker: a group that does not exist is 'empty', and no group is listed."""

        def describe_consumer_groups(self, groups: list[str], request_timeout: float = 0) -> dict[str, Any]:
            return {g: _done(SimpleNamespace(state=SimpleNamespace(name="EMPTY"), members=[])) for g in groups}

        def list_consumer_groups(self, request_timeout: float = 0) -> Future[Any]:
            return _done(SimpleNamespace(valid=[]))

    presence = WorkerPresence(Tansu(), "in", None)
    presence.check()
    assert presence.serving() and "one that does not exist is empty" in str(presence.unknown)

    class Denied(Tansu):
        def describe_consumer_groups(self, groups: list[str], request_timeout: float = 0) -> dict[str, Any]:
            future: Future[Any] = Future()
            future.set_exception(KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
            return {g: future for g in groups}

    presence = WorkerPresence(Denied(), "in", "workers")
    presence.check()
    assert presence.serving() and "grant Describe" in str(presence.unknown)
    now = [0.0]
    presence = WorkerPresence(AdminClient({}), "in", "workers", clock=lambda: now[0])
    BROKER.members = True
    presence.check()
    assert presence.serving()
    BROKER.members = False
    presence.check()
    now[0] += 5
    assert presence.serving(), "within the grace after the last member was seen"
    now[0] += 6
    assert not presence.serving()
    presence.replied()
    assert presence.serving(), "a reply is a worker too"


def test_close_waits_for_a_presence_check_in_flight(client: PredictionClient,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's admin requests are answered on librdkafka's background thread, which calls into Python: a
    gateway that ended while one was in flight died of SIGSEGV at exit. close() returns after the check has."""
    started, release = threading.Event(), threading.Event()

    def slow_check(timeout_s: float = 5.0) -> None:
        started.set()
        release.wait(5)

    monkeypatch.setattr(client.presence, "check", slow_check)
    client._reachable = True
    assert started.wait(5), "the broker thread never checked"
    closing = threading.Thread(target=client.close, args=(0,))
    closing.start()
    closing.join(0.3)
    assert closing.is_alive(), "close returned while the check was in flight"
    release.set()
    closing.join(5)
    assert not closing.is_alive() and not client._checker.is_alive()
