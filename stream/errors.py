"""One error root for the project, with a few subclasses that carry context."""

from __future__ import annotations

from confluent_kafka import KafkaError

# What a group-coordinator request (committed offsets) answers while the coordinator is slow, moving or
# restarting (NOT_COORDINATOR is seen on a fresh cluster's first group and after a broker restart): ask again.
_COORDINATOR_AWAY = frozenset({
    KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._WAIT_COORD,
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def coordinator_away(error: object) -> bool:
    """``error`` (a KafkaException's argument) is transient: the same request can be made again later."""
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in _COORDINATOR_AWAY)


class StreamError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(StreamError):
    """Bad configuration: raised before anything connects, with a message naming the setting."""


class DecodeError(StreamError):
    """A record's bytes could not be turned into an event.

    `reason` is a short machine-readable category (e.g. ``bad-magic``, ``unknown-schema``); topic,
    partition and offset are filled in when the bytes came from Kafka.
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.detail = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = f" at {topic}[{partition}]@{offset}" if topic is not None else ""
        super().__init__(f"{reason}: {message}{where}")

    def at(self, topic: str, partition: int, offset: int) -> DecodeError:
        """The same error, located at a Kafka record."""
        return DecodeError(self.reason, self.detail, topic=topic, partition=partition, offset=offset)


class ModelError(StreamError):
    """The model failed on a batch."""


class DeviceMemoryError(ModelError):
    """The device ran out of memory on a batch: the batch is split and its halves run, not retried as it was."""


class UnrecoverableModelError(ModelError):
    """The model cannot serve at all (cannot load, device lost): the worker must stop without committing."""


class ModelHung(StreamError):
    """A call into the model has not returned within --model-timeout-s: the worker stops without waiting for it."""


class KafkaClientError(StreamError):
    """A Kafka client operation failed; keeps librdkafka's error code and whether it is retriable/fatal."""

    def __init__(self, operation: str, error: object) -> None:
        self.operation = operation
        self.kafka_error = error
        code = getattr(error, "code", None)
        self.code = code() if callable(code) else None
        fatal = getattr(error, "fatal", None)
        self.fatal = bool(fatal()) if callable(fatal) else False
        retriable = getattr(error, "retriable", None)
        self.retriable = bool(retriable()) if callable(retriable) else False
        super().__init__(f"{operation} failed: {error}")


class PublishError(KafkaClientError):
    """A prediction could not be delivered: nothing at or after it may be committed."""


class BrokerError(StreamError):
    """A local broker (Apache Kafka or Tansu) could not be prepared or started."""


class TransactionError(KafkaClientError):
    """A transactional call failed. ``requires_abort``: abort and rewind; ``fatal``: this producer is
    fenced or broken and the worker must stop; ``producer_replaced``: the call was stuck and a fresh producer
    took over (nothing to abort: rewind)."""

    def __init__(self, operation: str, error: object, producer_replaced: bool = False) -> None:
        super().__init__(operation, error)
        self.producer_replaced = producer_replaced
        requires_abort = getattr(error, "txn_requires_abort", None)
        self.requires_abort = bool(requires_abort()) if callable(requires_abort) else False


class StoppedAtStartUp(StreamError):
    """A SIGTERM or SIGINT came while the worker's start-up waited on something that may never answer (the schema
    registry): the worker exits 0 without consuming, leaving the wait to end alone."""


class StoppedOnPurpose(StreamError):
    """The worker stops itself rather than go on (the dead-letter breaker tripped; a bad record and no dead-letter
    topic): nothing at or after ``partition``/``offset`` of the input topic is committed, and the worker leaves a
    note of it in the group's committed offsets, which the next start reads (`stream.pipeline.stops`).
    ``reason``: ``dead-letter-breaker`` or ``no-dlq-topic``."""

    def __init__(self, reason: str, message: str, partition: int | None = None, offset: int | None = None,
                 counts: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.partition = partition
        self.offset = offset
        self.counts = counts  # the breaker's: (records given to the model in its window, failed)
