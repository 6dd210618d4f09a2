"""Input paused while a closed batch waits for room in the model's queue, and only then.

The poll thread pauses every assigned partition when a closed batch has waited `PAUSE_AFTER_S` for the
processor, and resumes them as soon as no closed batch waits: the batch went to the model, or a revoke, a lost
assignment or an exactly-once rewind emptied it (then nothing would ever be dispatched, and resume, again).
Partitions assigned meanwhile get their state set explicitly both ways: librdkafka keeps a partition's pause
flag across unassign and assign (confluentinc/librdkafka#1849), so one paused when it was lost would otherwise
come back paused, however long ago that was.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from stream.ops.metrics import StreamMetrics

PAUSE_AFTER_S = 1.0  # a closed batch waits this long for the processor before input pauses


class InputPause:
    def __init__(self, metrics: StreamMetrics) -> None:
        self._metrics = metrics
        self.paused = False

    def set(self, consumer: Consumer, paused: bool) -> None:
        """Pause or resume every assigned partition."""
        assignment = consumer.assignment()
        if assignment:
            (consumer.pause if paused else consumer.resume)(assignment)
        self.paused = paused
        self._metrics.paused_partitions.set(len(assignment) if paused else 0)

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New partitions take the current state (resuming one that is not paused is a no-op)."""
        if self.paused:
            consumer.pause(partitions)
            self._metrics.paused_partitions.inc(len(partitions))
        else:
            consumer.resume(partitions)

    def gone(self, partitions: list[TopicPartition]) -> None:
        """Revoked or lost partitions."""
        if self.paused:
            self._metrics.paused_partitions.dec(len(partitions))
