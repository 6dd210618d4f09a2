"""The load generator's pacing, with a stand-in sender (no broker): a paced run waits for its first burst to be
acknowledged before the schedule starts, so a producer that takes a while to become ready (connection,
metadata, idempotent producer id) does not turn its start-up into one lump of events."""

from __future__ import annotations

import time
from typing import Any

import pytest

from producers import load

SETTLE_S = 0.3


class SlowStartSender:
    """Accepts every burst at once; its first acknowledgement takes SETTLE_S (a producer not yet ready)."""

    calls: list[tuple[str, float, int]]

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.report = load._Deliveries()
        self.sent = 0
        SlowStartSender.calls = []

    def send(self, frames: Any, start: int, stop: int, ts: bytes, keys: list[bytes | None]) -> bool:
        self.sent += stop - start
        self.calls.append(("send", time.monotonic(), stop - start))
        return True

    def settle(self, timeout_s: float) -> bool:
        time.sleep(SETTLE_S)
        self.calls.append(("settle", time.monotonic(), 0))
        return True

    def flush(self, timeout_s: float) -> int:
        self.report.delivered = self.sent
        return 0


@pytest.mark.parametrize("rate", [10_000.0, 40_000.0])
def test_a_paced_run_starts_its_schedule_once_the_first_burst_is_acknowledged(
        monkeypatch: pytest.MonkeyPatch, rate: float) -> None:
    monkeypatch.setattr(load, "_ClientSender", SlowStartSender)
    count = int(rate * 0.25)
    summary = load.produce_events("127.0.0.1:1", "t", count, rate=rate, native=False)
    calls = SlowStartSender.calls
    assert summary.delivered == count and sum(n for kind, _, n in calls if kind == "send") == count

    kinds = [kind for kind, _, _ in calls]
    assert kinds[0] == "send" and kinds[1] == "settle" and kinds.count("settle") == 1  # once, after burst one
    first_burst = calls[0][2]
    assert first_burst < rate * 0.05  # what was due when the first block was ready
    settled_at = calls[1][1]
    # After it the events go out at the rate, as if the schedule had started then: never the lump of
    # rate x SETTLE_S events that a schedule counted from before the wait would owe at once.
    sent, slack = first_burst, 2 * max(1, int(rate / 1000)) + 50
    for _, at, n in calls[2:]:
        sent += n
        assert sent <= first_burst + rate * (at - settled_at) + slack, (sent, at - settled_at)
    # and the run's seconds (hence its reported rate) count from the acknowledgement
    assert summary.seconds == pytest.approx(count / rate, abs=0.1)


def test_an_unpaced_run_never_waits_for_acknowledgements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "_ClientSender", SlowStartSender)
    summary = load.produce_events("127.0.0.1:1", "t", 3_000, native=False)
    assert summary.delivered == 3_000
    assert [kind for kind, _, _ in SlowStartSender.calls] == ["send"] * 6  # bursts of _BURST, no settle


def test_the_wait_for_the_first_acknowledgement_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    class NeverReady(SlowStartSender):
        def settle(self, timeout_s: float) -> bool:
            waits.append(timeout_s)
            return False  # nothing acknowledged: the run goes on, its failures show in the summary

    monkeypatch.setattr(load, "_ClientSender", NeverReady)
    summary = load.produce_events("127.0.0.1:1", "t", 500, rate=10_000.0, native=False, timeout_s=120.0)
    assert summary.requested == 500 and waits == [load._START_WAIT_S] and load._START_WAIT_S < 120.0
