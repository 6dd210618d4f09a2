"""Admin helpers: create topics idempotently, read end offsets and a group's committed offsets, ask the brokers
until they answer (`ask_until_answered`). ``client_config``:
librdkafka settings every client they make gets besides the bootstrap servers (security: ``security.protocol``,
``sasl.*``, ``ssl.*``)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from stream.errors import KafkaClientError, StoppedAtStartUp, StreamError
from stream.kafka.client_logs import ConnectionWatch, client_logger
from stream.kafka.guarded import unless_stopped

RETRIABLE_ANSWERS = 10  # `ask_until_answered`: retriable errors from brokers that answered, before one is raised


def admin(bootstrap: str, **extra: Any) -> AdminClient:
    """An admin client whose librdkafka lines go to the ``stream.librdkafka.admin`` logger (repeats held back)."""
    return AdminClient({"bootstrap.servers": bootstrap, "logger": client_logger("admin"), **extra})  # type: ignore[dict-item]


def wait_ready(bootstrap: str, timeout_s: float = 60.0, brokers: int = 1,
               client_config: Mapping[str, Any] | None = None) -> None:
    """Block until the cluster answers a metadata request with at least ``brokers`` brokers."""
    client = admin(bootstrap, **(client_config or {}))
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if len(client.list_topics(timeout=2).brokers) >= brokers:
                return
        except KafkaException as exc:
            last = exc
        time.sleep(0.1)
    raise StreamError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f}s ({last})")


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int, *, replication_factor: int = -1,
                  config: dict[str, str] | None = None, timeout_s: float = 30.0,
                  client_config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Create topics; an existing topic is fine. Returns {topic: "created" | "exists"}. ``replication_factor``
    -1: the cluster's ``default.replication.factor`` (3 on the local three-node cluster, 1 on one node).

    Waits until every partition of every topic has a leader, so producers can use them at once.
    """
    names = list(dict.fromkeys(topics))
    if partitions < 1:
        raise StreamError(f"--partitions must be >= 1, got {partitions}")
    client = admin(bootstrap, **(client_config or {}))
    futures = client.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=replication_factor, config=config or {})
         for t in names], operation_timeout=timeout_s)
    status = {}
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            status[name] = "created"
        except concurrent.futures.TimeoutError:  # what the callers meet: no broker answered (retried, or said)
            raise KafkaClientError(f"create topic {name}", KafkaError(
                KafkaError._TIMED_OUT, f"no answer from the Kafka brokers at {bootstrap} within {timeout_s:.0f}s")
            ) from None
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaClientError(f"create topic {name}", err) from exc
            status[name] = "exists"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = client.list_topics(timeout=5)
        except KafkaException as exc:
            raise KafkaClientError(f"wait for the leaders of {', '.join(names)}", exc.args[0]) from exc
        ready = all(
            t in md.topics and md.topics[t].error is None and md.topics[t].partitions
            and all(p.leader >= 0 for p in md.topics[t].partitions.values())
            for t in names
        )
        if ready:
            return status
        if time.monotonic() > deadline:
            raise StreamError(f"topics {names} have no leaders after {timeout_s:.0f}s")
        time.sleep(0.1)


def partitions_of(bootstrap: str, topic: str, client_config: Mapping[str, Any] | None = None) -> list[int]:
    md = admin(bootstrap, **(client_config or {})).list_topics(topic, timeout=10)
    info = md.topics.get(topic)
    if info is None or info.error is not None:
        raise StreamError(f"topic {topic!r} not found ({info.error if info else 'no metadata'})")
    return sorted(info.partitions)


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 15.0,
                client_config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """High watermark per partition: the offset after the last record.

    Asked twice: by ListOffsets, and from the high watermark a fetch response carries (the largest wins).
    The embedded Tansu broker answers ListOffsets(latest) wrongly (we measured 1 on a 1,449-record
    partition) but its fetch responses are right; on Apache Kafka both agree.
    """
    consumer = Consumer({**(client_config or {}), "bootstrap.servers": bootstrap, "group.id": "stream-offsets-probe",
                         "enable.auto.commit": False, "max.partition.fetch.bytes": 1024})
    try:
        parts = partitions_of(bootstrap, topic, client_config)
        listed = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                  for p in parts}
        consumer.assign([TopicPartition(topic, p, max(listed[p][1], listed[p][0], 0)) for p in parts])
        fetched: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(fetched) < len(parts) and time.monotonic() < deadline:
            consumer.consume(100, 0.1)
            for p in parts:
                high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                if high >= 0:
                    fetched[p] = high
        if len(fetched) < len(parts):
            raise StreamError(f"no fetch response for {topic} partitions {sorted(set(parts) - set(fetched))}")
        return {p: max(listed[p][1], fetched[p]) for p in parts}
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group_id: str, topic: str,
                      client_config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """The group's committed position per partition (-1 where nothing is committed)."""
    consumer = Consumer({**(client_config or {}), "bootstrap.servers": bootstrap, "group.id": group_id,
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(bootstrap, topic, client_config)]
        return {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def watermarks(bootstrap: str, topic: str, partitions: Iterable[int],
               client_config: Mapping[str, Any] | None = None) -> dict[int, tuple[int, int]]:
    """(first offset still held, offset after the last record) per partition; the second as `end_offsets`."""
    highs = end_offsets(bootstrap, topic, client_config=client_config)
    consumer = Consumer({**(client_config or {}), "bootstrap.servers": bootstrap, "group.id": "stream-offsets-probe",
                         "enable.auto.commit": False})
    try:
        return {p: (max(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[0], 0),
                    highs[p]) for p in partitions}
    finally:
        consumer.close()


def ask_until_answered(call: Callable[[AdminClient], object], admin_config: Mapping[str, Any],
                       connection: ConnectionWatch, stop: threading.Event) -> None:
    """``call(client)`` with a fresh admin client until it returns or ``stop`` is set (the caller then sees it
    set); retried, with backoff, while the brokers cannot be reached (said once by ``connection``, with
    librdkafka's reason, and again when they answer) or do not answer in time; a few retriable errors from
    brokers that answered (a coordinator loading), then raised. ``admin_config``: the client's settings, its
    bootstrap servers among them."""
    delay_s = 0.5
    answers = 0  # retriable errors from brokers that answered (a coordinator loading): a few, then an error
    while not stop.is_set():
        client = admin(admin_config["bootstrap.servers"], **admin_config)  # kept: its futures fail once it is gone
        try:
            if _served(call, client, stop):
                connection.reachable()
            return
        except (KafkaException, KafkaClientError) as exc:
            err = exc.kafka_error if isinstance(exc, KafkaClientError) else exc.args[0] if exc.args else None
            if not isinstance(err, KafkaError):
                raise
            if err.code() == KafkaError._TIMED_OUT:  # no broker answered: what the watch calls unreachable
                err = KafkaError(KafkaError._TRANSPORT, f"no answer to an admin request ({err.str()})")
            if not connection.error("admin", err):
                answers += 1
                if not err.retriable() or answers > RETRIABLE_ANSWERS:
                    raise
            stop.wait(delay_s)
            delay_s = min(delay_s * 2, 5.0)


def _served(call: Callable[[AdminClient], object], client: AdminClient, stop: threading.Event,
            slice_s: float = 0.1) -> bool:
    """``call(client)`` on a daemon thread of its own while this thread serves ``client``'s callbacks: True once it
    returned (its exception is raised here), False as soon as ``stop`` is set (it is left to end alone).

    - Served, the admin client's ``error_cb`` tells the connection watch at once that the brokers cannot be
      reached, and librdkafka's lines saying why (a refused connection, for example) reach the worker's log; an
      admin client nobody polls keeps both to itself, so a worker waiting at start-up said only "no answer"
      after each request's 10 s.
    - A call blocks in librdkafka up to that timeout, all of it while the brokers cannot be reached. Waited
      out, a worker told to stop at start-up took that long to begin stopping; where the call blocks in C (a
      metadata request), Python could not even run the signal's handler until it returned."""
    try:
        unless_stopped(lambda: call(client), stop.is_set, "an admin request", client.poll, slice_s)
    except StoppedAtStartUp:
        return False
    return True
