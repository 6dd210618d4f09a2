"""What a worker did, for its shutdown line and ``--summary-json``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerSummary:
    consumed: int = 0
    predicted: int = 0
    dead_lettered: int = 0
    committed: int = 0
    batches: int = 0
    batched_records: int = 0
    transactions: int = 0  # exactly-once: committed transactions
    error: str | None = None
    exit_code: int = 0
    first_consumed_at: float | None = None  # wall-clock seconds
    last_committed_at: float | None = None  # wall-clock seconds, last commit that advanced a position
    stage_busy_s: dict[str, float] = field(default_factory=dict)  # seconds each stage's threads worked
    stage_cpu_s: dict[str, float] = field(default_factory=dict)  # the CPU seconds they used meanwhile
    device_busy_s: float | None = None  # CUDA: the device's time on batches, from CUDA events (None elsewhere)
    device_warm_s: float | None = None  # CUDA: its time on the warm-up's batches (not in device_busy_s)

    @property
    def mean_batch_size(self) -> float:
        return self.batched_records / self.batches if self.batches else 0.0

    def line(self) -> str:
        return (f"consumed={self.consumed} predicted={self.predicted} dead_lettered={self.dead_lettered} "
                f"committed={self.committed} "
                f"batches={self.batches} mean_batch_size={self.mean_batch_size:.1f}"
                + (f" transactions={self.transactions}" if self.transactions else "")
                + "".join(f" {stage}_busy_s={seconds:.1f}" for stage, seconds in self.stage_busy_s.items())
                + (f" error={self.error!r}" if self.error else ""))
