from __future__ import annotations

import pytest

from stream.config import default_reply_topic
from stream.kafka.replies import ReplyAddress, ReplyRouter


def test_an_address_is_topic_partition_and_an_id_that_may_hold_colons() -> None:
    address = ReplyAddress("in.replies", 3, "abc:def")
    assert address.encode() == b"in.replies:3:abc:def"
    assert ReplyAddress.parse(address.encode()) == address
    for bad in (b"", b"topic", b"topic:x:id", b"topic:1:", b":1:id", b"t\xff:1:id", b"topic:-1:id"):
        with pytest.raises(ValueError, match="reply address"):
            ReplyAddress.parse(bad)
    assert default_reply_topic("events") == "events.replies"


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
    routed = router.route({0: b"in.replies:1:a", 1: b"in.replies:2:b", 2: b"elsewhere:0:c", 3: b"junk",
                           4: b"other.replies:0:d", 5: b"in.replies:0:e"})
    assert {row: a.correlation_id for row, (a, _raw) in routed.items()} == {0: "a", 5: "e"}
    assert routed[0][1] == b"in.replies:1:a"
    assert refused == [4] and asked == ["in.replies", "other.replies"]
    partitions["in.replies"] = 3  # grown: seen once the refresh interval has passed
    assert list(router.route({0: b"in.replies:2:b"})) == []
    now[0] = 31.0
    assert list(router.route({0: b"in.replies:2:b"})) == [0]
    assert asked == ["in.replies", "other.replies", "in.replies"]
