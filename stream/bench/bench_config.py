"""What a benchmark run does (`BenchConfig`): `python -m stream bench`'s contenders, drains, latency steps and the
model-bound section, and the other benches built on `stream.bench.runner.Bench`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from stream.bench import BEFORE_FIELD_PLANS
from stream.bench.text import TextBenchConfig


@dataclass
class BenchConfig:
    events: int = 1_000_000
    naive_events: int = 5_000
    faust_events: int = 100_000
    latency_seconds: float = 10.0
    warmup_seconds: float = 3.0
    loads: tuple[float, ...] = (0.1, 0.5, 0.9)
    fixed_policy_loads: tuple[float, ...] = (0.1, 0.5)  # the same loads with --batch-policy fixed, to compare
    waits_ms: tuple[float, ...] = (5.0, 20.0)
    contenders: tuple[str, ...] = ("passthrough", "jvm-flush", "jvm-pipelined", "kafka-streams", "naive", "faust",
                                   "handtuned", "quix-apply", "quix-sink")
    quix_apply_events: int = 100_000  # Quix's per-record apply runs at a few thousand events/s here
    # The broker alone: Kafka's ConsumerPerformance over the pre-produced topic, ProducerPerformance with records
    # of the demo events' mean size, and EndToEndLatency (one record at a time) this many records.
    broker_tools: bool = True
    end_to_end_records: int = 5_000
    # The broker's latency floor (stream.bench.floor) at these loads of the latency steps, beside them.
    floor_loads: tuple[float, ...] = (0.1, 0.5)
    # One unreported step at this load (0: none) before the latency steps, for the broker's sake: the steps'
    # topics append with LogAppendTime, a path the drains before them never took, and in a full run the
    # first two steps at 50 % and 90 % load spent their first seconds behind while the later ones did not.
    latency_warmup_load: float = 0.5
    # Events for the live capacity (the worker consuming while the load generator publishes as fast as it can);
    # at most ``events``. 0: none (the latency loads are then fractions of the default drain alone).
    live_events: int = 2_000_000
    # Events of the second layout (stream.bench.generic) for its drain beside the demo's; 0: none.
    generic_events: int = 1_000_000
    # The demo layout's drain before the field plans (issue 31: within 10 % of it): the worker of this git
    # revision, built in a worktree, drains the same events in rounds interleaved with this checkout's worker
    # (``worker-default`` is then the median of this checkout's rounds); None: no comparison.
    before: str | None = BEFORE_FIELD_PLANS
    before_rounds: int = 3
    # The model-bound section (stream.bench.text: --model minilm against the model alone); None: none.
    text: TextBenchConfig | None = field(default_factory=TextBenchConfig)
    results: Path = field(default_factory=lambda: Path("results") / time.strftime("bench-%Y%m%d-%H%M%S"))
