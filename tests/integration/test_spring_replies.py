"""Spring Kafka's request-reply against `python -m stream worker`: a Java caller using spring-kafka's
``ReplyingKafkaTemplate`` unmodified (`tests.spring_caller`) gets each request's prediction under both guarantees,
correlated by Spring's own headers, and its error checker reports a dead-lettered request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from producers.events import generate_events
from stream.codec import SchemaRegistry, decode, encode
from stream.kafka.topics import create_topics
from stream.models.demo import EVENT_SCHEMA
from tests.gateway_cli import expected_scores
from tests.integration.harness import Pipeline, wait_for_assignment
from tests.spring_caller import call

REGISTRY = SchemaRegistry.from_dir()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_replying_kafka_template_gets_each_prediction_and_its_error_checker_reports_a_dead_letter(
        pipeline: Pipeline, model_dir: Path, tmp_path: Path, unique_name: Callable[[str], str],
        guarantee: str) -> None:
    replies, dlq = unique_name("spring.replies"), unique_name("dlq")
    create_topics(pipeline.bootstrap, [replies, dlq], 2)
    worker = pipeline.worker("--dlq-topic", dlq, "--reply-topics", replies, "--guarantee", guarantee,
                             "--max-wait-ms", "20")
    wait_for_assignment(worker)
    schema = REGISTRY.by_name(EVENT_SCHEMA)
    records = generate_events(24, seed=73).records()
    requests: list[tuple[bytes | None, bytes]] = [(str(r["key"]).encode(), encode(schema, r)) for r in records]
    dead_at = 9
    requests.insert(dead_at, (b"broken", schema.header + b"\x02"))  # the schema's id, then a truncated record
    expected = expected_scores(model_dir, records)
    committed = ["--read-committed"] if guarantee == "exactly-once" else []
    # Spring's two ways of addressing: its reply container on one partition (it sends kafka_replyPartition),
    # or in a group on the whole reply topic (no partition: the reply goes where its key is partitioned).
    for mode, extra in (("partition", ["--partition", "1"]), ("group", [])):
        answers = call(pipeline.bootstrap, pipeline.input, replies, requests, tmp_path, *extra, *committed)
        assert len(answers) == len(requests)
        dead = answers.pop(dead_at)
        assert "dead-lettered at decode" in dead.get("error", ""), dead
        for answer, record in zip(answers, records, strict=True):
            assert "value" in answer, (mode, answer)
            assert answer["headers"]["kafka_correlationId"] == answer["sent_correlation"], "byte for byte"
            assert answer["sent_reply_partition"] is (mode == "partition")
            _, prediction = decode(REGISTRY, answer["value"])
            assert prediction["event_id"] == record["event_id"], (mode, prediction)
            assert prediction["fraud_score"] == pytest.approx(expected[str(record["event_id"])], abs=1e-5)
    assert worker.terminate() == 0
