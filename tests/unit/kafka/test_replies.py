from __future__ import annotations

import pytest

from stream.config import default_reply_topic
from stream.kafka.replies import ANY_PARTITION, Reply, ReplyAddress, ReplyRouter, parse_reply


def test_an_address_is_topic_partition_and_an_id_that_may_hold_colons() -> None:
    address = ReplyAddress("in.replies", 3, "abc:def")
    assert address.encode() == b"in.replies:3:abc:def"
    assert ReplyAddress.parse(address.encode()) == address
    for bad in (b"", b"topic", b"topic:x:id", b"topic:1:", b":1:id", b"t\xff:1:id", b"topic:-1:id"):
        with pytest.raises(ValueError, match="reply address"):
            ReplyAddress.parse(bad)
    assert default_reply_topic("events") == "events.replies"


def own(address: bytes) -> tuple[bytes | None, ...]:
    return (address, None, None, None)


def test_spring_kafka_headers_ask_for_a_reply_that_carries_the_correlation_id_back_byte_for_byte() -> None:
    correlation = bytes(range(16))  # ReplyingKafkaTemplate's default: a UUID's 16 bytes
    assert parse_reply((None, b"in.replies", b"\x00\x00\x00\x02", correlation)) == Reply(
        "in.replies", 2, (("kafka_correlationId", correlation),))
    assert parse_reply((None, b"in.replies", None, correlation)).partition == ANY_PARTITION  # type: ignore[union-attr]
    assert parse_reply((None, b"in.replies", None, None)) == Reply("in.replies", ANY_PARTITION, ())
    assert parse_reply((None, None, None, correlation)) is None, "a correlation id alone asks for nothing"
    assert parse_reply((b"in.replies:1:x", b"other", None, correlation)) == Reply(
        "in.replies", 1, (("stream.reply", b"in.replies:1:x"),)), "both styles: this project's"
    for partition in (b"\x00\x02", b"\xff\xff\xff\xff", b"12345"):
        with pytest.raises(ValueError, match="kafka_replyPartition"):
            parse_reply((None, b"in.replies", partition, correlation))
    for topic in (b"", b"\xff"):
        with pytest.raises(ValueError, match="kafka_replyTopic"):
            parse_reply((None, topic, None, correlation))


def test_the_router_answers_only_its_topics_partitions_that_exist_and_asks_for_them_once_a_while() -> None:
    asked: list[str] = []
    refused: list[int] = []
    now = [0.0]
    partitions = {"in.replies": 2}

    def partitions_of(topic: str) -> int | None:
        asked.append(topic)
        return partitions.get(topic)

    router = ReplyRouter(frozenset({"in.replies", "other.replies"}), partitions_of, refused.append,
                         clock=lambda: now[0], refresh_s=30.0)
    routed = router.route({0: own(b"in.replies:1:a"), 1: own(b"in.replies:2:b"), 2: own(b"elsewhere:0:c"),
                           3: own(b"junk"), 4: own(b"other.replies:0:d"), 5: own(b"in.replies:0:e")})
    assert {row: r.headers for row, r in routed.items()} == {
        0: (("stream.reply", b"in.replies:1:a"),), 5: (("stream.reply", b"in.replies:0:e"),)}
    assert routed[0].partition == 1
    assert refused == [4] and asked == ["in.replies", "other.replies"]
    partitions["in.replies"] = 3  # grown: seen once the refresh interval has passed
    assert list(router.route({0: own(b"in.replies:2:b")})) == []
    now[0] = 31.0
    assert list(router.route({0: own(b"in.replies:2:b")})) == [0]
    assert asked == ["in.replies", "other.replies", "in.replies"]


def test_past_a_thousand_kinds_of_refused_address_one_warning_a_minute_still_names_what_it_met(
        caplog: pytest.LogCaptureFixture) -> None:
    """A producer writing a new reply topic into every record used to fill the kinds logged once (1,000), after
    which nothing was logged: a gateway misconfigured later went unnamed."""
    now = [0.0]
    refused: list[int] = []
    router = ReplyRouter(frozenset({"in.replies"}), lambda _topic: 1, refused.append, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="stream.kafka.replies"):
        router.route({i: own(b"flood-%d:0:x" % i) for i in range(1_000)})
        assert len(caplog.records) == 1_000
        caplog.clear()
        router.route({i: own(b"flood-%d:0:x" % i) for i in range(1_000, 1_500)})  # past the cap: one line
        now[0] = 30.0
        router.route({0: own(b"flood-0:0:x"), 1: own(b"gateway.replies:0:y")})  # within the minute: none
        now[0] = 61.0
        router.route({0: own(b"gateway.replies:0:z")})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "'flood-1000'" in lines[0] and "(0 refused reply address(es) not logged" in lines[0]
    assert "'gateway.replies'" in lines[1] and "(500 refused reply address(es) not logged" in lines[1]
    assert sum(refused) == 1_000 + 500 + 2 + 1
