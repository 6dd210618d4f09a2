"""`producers.texts.produce_texts` paced and stopped (the text chaos run's load), against a stand-in producer;
the load generators' imports."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from producers import texts
from stream.codec import SchemaRegistry, decode


class FakeProducer:
    """Acknowledges every record at its next poll or flush, and keeps (time sent, value) of each."""

    def __init__(self, _config: dict[str, Any], clock: list[float]) -> None:
        self.clock = clock
        self.sent: list[tuple[float, bytes]] = []
        self._pending: list[Any] = []

    def produce(self, _topic: str, value: bytes, _key: bytes, on_delivery: Any) -> None:
        self.sent.append((self.clock[0], value))
        self._pending.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        done, self._pending = self._pending, []
        for callback in done:
            callback(None, None)
        return len(done)

    def flush(self, _timeout: float) -> int:
        self.poll(0)
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeProducer]:
    """A fake clock (time.monotonic, advanced by time.sleep) and the producers made."""
    clock = [0.0]
    made: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config, clock))
        return made[-1]

    monkeypatch.setattr(texts, "Producer", producer)
    monkeypatch.setattr(texts.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(texts.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + max(s, 0.0)))
    return made


def test_a_rate_paces_chunks_of_a_tenth_of_a_second(fake: list[FakeProducer]) -> None:
    assert texts.produce_texts("b:1", "t", 95, seed=3, start=5, rate=200.0) == 95
    sent = fake[0].sent
    # 20 texts every 0.1 s from the start: the last chunk (texts 80..94) at 0.4 s
    assert [round(t, 3) for t, _ in sent[::20]] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert len({t for t, _ in sent}) == 5
    registry = SchemaRegistry.from_dir()
    ids = [decode(registry, value)[1]["event_id"] for _, value in sent]
    assert ids == texts.text_ids(95, seed=3, start=5) == texts.generate_texts(95, seed=3, start=5).event_ids


def test_a_stop_ends_the_run_after_the_chunk_in_hand_and_counts_what_was_sent(fake: list[FakeProducer]) -> None:
    stop = threading.Event()
    progress: list[int] = []

    def seen(delivered: int) -> None:
        progress.append(delivered)
        if delivered >= 30:
            stop.set()

    assert texts.produce_texts("b:1", "t", 1_000, rate=100.0, stop=stop, on_progress=seen) == 30
    assert len(fake[0].sent) == 30 and progress[-1] == 30


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        texts.produce_texts("b:1", "t", 1, rate=0.0)


def test_the_load_generators_start_without_torch() -> None:
    """`python -m producers` and the text producer take the demo's schema names from `stream.models.demo_names`:
    taking them from `stream.models.demo` imported torch, about 3 s of CPU at each load generator's start here."""
    code = ("import sys; import producers.cli, producers.texts; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=Path(__file__).parents[2])
