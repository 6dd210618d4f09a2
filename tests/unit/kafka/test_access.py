"""Authorization errors in the worker's words: which ACL to grant (`stream.kafka.access.denied`)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from stream.config import WorkerSettings
from stream.kafka.access import denied, required

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
