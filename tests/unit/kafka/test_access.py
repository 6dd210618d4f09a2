"""Authorization errors in the worker's words: which ACL to grant (`stream.kafka.access.denied`); the start-up's
admin requests against brokers that cannot be reached."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError

from stream.config import WorkerSettings
from stream.errors import KafkaClientError
from stream.kafka.access import AccessDenied, check_access, denied, ensure_dlq_topic, required
from stream.kafka.client_logs import ConnectionWatch
from stream.kafka.topics import _served, admin, create_topics
from stream.local.broker import free_port

SETTINGS = WorkerSettings(bootstrap_servers="b:9092", input_topic="in", output_topic="out", group_id="g",
                          dlq_topic="dlq", guarantee="exactly-once", transactional_id="tid")


@pytest.mark.parametrize(("code", "where", "grant"), [
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, "consumer", "READ on topic 'in'"),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, "consumer", "READ on group 'g'"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, "producer", "WRITE on the topic it writes to ('out' or 'dlq')"),
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "producer", "WRITE on transactional id 'tid'"),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "producer", "IDEMPOTENT_WRITE on the cluster"),
])
def test_an_authorization_error_names_the_acl_to_grant(code: int, where: str, grant: str) -> None:
    error = denied(KafkaError(code, "refused"), SETTINGS, where)
    assert error is not None
    assert grant in str(error) and f"the brokers refused the {where}" in str(error)


def test_other_errors_are_not_authorization_errors() -> None:
    assert denied(KafkaError(KafkaError._TRANSPORT, "gone"), SETTINGS, "consumer") is None


def test_exactly_once_adds_the_transactional_id_and_no_dlq_drops_its_topic() -> None:
    assert ("transactional id", "tid", "WRITE") in required(SETTINGS)
    plain = WorkerSettings(bootstrap_servers="b:9092", input_topic="in", output_topic="out", group_id="g")
    assert required(plain) == [("topic", "in", "READ"), ("group", "g", "READ"), ("topic", "out", "WRITE")]


def _refused() -> dict[str, object]:
    """An admin config whose only broker refuses connections (a free port nothing listens on)."""
    return {"bootstrap.servers": f"127.0.0.1:{free_port()}"}


@pytest.mark.parametrize("ask", ["check_access", "ensure_dlq_topic"])
def test_a_stopped_worker_leaves_the_admin_request_under_way_and_heard_at_once_the_brokers_refuse(ask: str) -> None:
    """Against brokers that refuse connections each request blocks its full 10 s timeout (describe_topics'
    futures; ensure's list_topics in C). The connection watch hears of the refusal from the served client at once,
    and a stop returns at once instead of after the request."""
    connection, stop = ConnectionWatch(), threading.Event()
    config = {**_refused(), "error_cb": lambda err: connection.error("admin", err)}
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    (check_access if ask == "check_access" else ensure_dlq_topic)(SETTINGS, config, connection, stop)
    returned = time.monotonic()
    assert connection.unreachable, "the admin client's error_cb was never served"
    assert returned - started < 3.0, returned - started  # the stop at 1 s, against the request's 10 s


def test_the_request_s_own_error_is_raised_where_it_was_asked_for() -> None:
    client = admin(f"127.0.0.1:{free_port()}")

    def refuse(_client: object) -> None:
        raise AccessDenied("grant it")

    with pytest.raises(AccessDenied, match="grant it"):
        _served(refuse, client, threading.Event())
    assert _served(lambda _client: None, client, threading.Event()) is True


def test_a_topic_no_broker_answers_for_is_a_kafka_error_that_says_so() -> None:
    """Not a bare TimeoutError (a traceback from `stream topics create`, the gateway's exit 1): an error the
    commands print in one line and `ask_until_answered` retries as brokers that cannot be reached."""
    bootstrap = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaClientError, match=f"no answer from the Kafka brokers at {bootstrap} within 1s") as info:
        create_topics(bootstrap, ["t"], 1, timeout_s=1.0)
    assert info.value.code == KafkaError._TIMED_OUT
