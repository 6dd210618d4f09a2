"""Worker settings: frozen, validated, from CLI flags > ``STREAM_*`` env > defaults.

librdkafka settings pass through from the environment with Confluent's naming rule
(``KAFKA_SESSION_TIMEOUT_MS`` -> ``session.timeout.ms``; ``__`` -> ``_``; ``___`` -> ``-``).
``KAFKA_CONSUMER_*`` and ``KAFKA_PRODUCER_*`` reach only that client.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stream.errors import ConfigError
from stream.kafka_env import kafka_admin_env_config, kafka_env_config

# Settings the worker owns: a pass-through value that contradicts them would break the delivery guarantee.
_CONSUMER_OWNED = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "partition.assignment.strategy": "cooperative-sticky",
}
_PRODUCER_OWNED = {"enable.idempotence": "true", "acks": "all"}
# STREAM_* variables read elsewhere (broker cache, test fixtures and fault hooks), not worker settings.
NON_SETTING_ENV = frozenset({"STREAM_CACHE_DIR", "STREAM_REQUIRE_KAFKA", "STREAM_REQUIRE_NATIVE"})
# STREAM_TEST_*: test fault hooks; STREAM_GATEWAY_*: the gateway's settings (`stream.gateway.settings`).
NON_SETTING_PREFIXES = ("STREAM_TEST_", "STREAM_GATEWAY_")


class PortRange(NamedTuple):
    """A port, or a range of them of which a server takes the first free one (``first == last``: one port)."""

    first: int
    last: int


def parse_port_range(value: object) -> PortRange:
    """``9100``, ``"9100"`` or ``"9100-9107"``; a ValueError says what is wrong."""
    text = str(value).strip()
    first, dash, last = text.partition("-")
    try:
        ports = PortRange(int(first), int(last) if dash else int(first))
    except ValueError:
        raise ValueError(f"a port (9100) or a range of ports (9100-9107), not {text!r}") from None
    if not (0 <= ports.first <= ports.last <= 65535) or (dash and ports.first == 0):
        raise ValueError(f"ports are 0 to 65535 (a range from 1, first to last), not {text!r}")
    return ports


MAX_COPY_HEADERS = 10  # --copy-headers: the consumer takes at most 16 header names a record (4 a reply's, 2 W3C's)


def _names(listed: str) -> tuple[str, ...]:
    """A comma-separated list's names, stripped, each once, in order."""
    return tuple(dict.fromkeys(n.strip() for n in listed.split(",")))


def parse_start_time(text: str) -> int:
    """``--start-from``'s time: Unix milliseconds, or an ISO 8601 date-time with a zone (Z or +hh:mm)."""
    from datetime import datetime

    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start_from {text!r} is not earliest, latest, Unix milliseconds or an ISO 8601 "
                         "date-time") from None
    if when.tzinfo is None:
        raise ValueError(f"start_from {text!r} has no time zone (add Z or +hh:mm)")
    return int(when.timestamp() * 1000)


def default_prepare_threads(cores: int | None = None) -> int:
    """Prepare threads by default: half the cores (the poll, device and finish threads, the clients' own threads
    and the model's intra-op threads need the rest), at least 1, at most 4."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(4, cores // 2))



def default_reply_topic(input_topic: str) -> str:
    """The reply topic the worker answers and the gateway reads unless told otherwise."""
    return f"{input_topic}.replies"

class WorkerSettings(BaseSettings):
    """Everything the worker needs; invalid combinations fail before any connection is made."""

    model_config = SettingsConfigDict(env_prefix="STREAM_", frozen=True, extra="forbid")

    bootstrap_servers: str = Field(default="", description="the brokers, host:port,... (or KAFKA_BOOTSTRAP_SERVERS)")
    input_topic: str = Field(min_length=1, max_length=249, description="required: the topic of events to predict")
    output_topic: str = Field(min_length=1, max_length=249, description="required: the topic predictions go to")
    group_id: str = Field(min_length=1, description="required: the consumer group this pipeline's replicas share")
    max_batch_size: int = Field(default=4096, ge=1, le=65536, description="close a batch at this many records")
    max_wait_ms: float = Field(default=20.0, ge=0.0, le=60_000.0,
                               description="close a batch when its first record has waited this long")
    batch_policy: Literal["adaptive", "fixed"] = Field(
        default="adaptive",
        description="fixed: a batch closes at max_batch_size or max_wait_ms; adaptive: also as soon as the model "
                    "is idle and no more records are waiting")
    model: str = Field(default="demo", min_length=1,
                       description="demo, minilm (text to sentence embedding; needs the text extra), "
                                   "export:PATH.pt2, torchscript:PATH.pt, or package.module:HandlerClass")
    model_dir: Path | None = Field(default=None, description="the model's files, given to its handler (demo: "
                                                             "default artifacts/demo-fraud; minilm: its folder "
                                                             "or .zip, default the installed weights)")
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="auto (CUDA when available), cpu, cuda, cuda:N")
    max_tokens: int | None = Field(
        default=None, ge=3, le=512,
        description="--model minilm: texts are cut to this many tokens (default 256; the model's limit is 512)")
    max_batch_tokens: int | None = Field(
        default=None, ge=1,
        description="a text model: also close a batch before its texts could take more tokens than this (each "
                    "counted at its most: its record's bytes + 2, at most --max-tokens); at least --max-tokens")
    max_batch_bytes: int = Field(
        default=32 * 1_048_576, ge=1024, le=1_073_741_824,
        description="also close a batch before its records pass this many bytes: their values, keys and the "
                    "headers the worker keeps (a batch holds at least one record); with --max-inflight-batches, "
                    "what large records can hold in memory")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="--model minilm: the encoder's weights and activations (default bfloat16 on CUDA, "
                                  "float32 on the CPU, the only one there)")
    fixed_shapes: bool | None = Field(
        default=None, description="--model minilm: passes of a fixed shape set (lengths rounded up to a multiple "
                                  "of 16 tokens, rows to a few sizes) instead of each batch's own")
    cuda_graphs: bool | None = Field(
        default=None, description="--model minilm on CUDA: each pass's shape captured once as a CUDA graph and "
                                  "replayed (one launch instead of hundreds); with --packing one graph per token "
                                  "bucket, all captured by the warm-up, else a fixed shape set")
    packing: bool | None = Field(
        default=None, description="--model minilm: a batch's texts packed one after another, attention within each "
                                  "text (variable-length flash attention on CUDA in 16-bit floats), no padding "
                                  "but to a token bucket (default: on CUDA in bfloat16 or float16 without a fixed "
                                  "shape set)")
    torch_threads: int = Field(default=1, ge=1, le=1024, description="intra-op threads for inference on the CPU")
    malloc_mmap_threshold_kib: int | None = Field(
        default=None, ge=4, le=1_048_576,
        description="glibc only: allocations of this many KiB or more are mmap'd and returned on free (default "
                    "128, which keeps a long run's heap from creeping; 32768 for --model minilm, whose activations "
                    "are reallocated every pass); ignored when MALLOC_MMAP_THRESHOLD_ is set")
    gpu_overlap: bool = Field(
        default=True,
        description="on CUDA, submit the next batch to the device before waiting for the one before, so its copy "
                    "and forward pass overlap the host's work on the batches around it")
    prepare_threads: int = Field(
        default_factory=lambda: default_prepare_threads(),
        ge=1, le=64,
        description="threads that prepare batches for the model (decode, bind, the handler's prepare such as "
                    "tokenizing), several batches at once (default: half the cores, 1 to 4)")
    gil_switch_interval_ms: float = Field(
        default=1.0, ge=0.05, le=100.0,
        description="how long a thread may hold the GIL while another waits (Python's default is 5 ms); the poll "
                    "thread waits on the processing thread's GIL for at most this long")
    metrics_port: PortRange | None = Field(
        default=None,
        description="serve /metrics and the probes on this port, or on the first free one of a range (9100-9107: "
                    "several replicas on one host's network)")
    metrics_port_file: Path | None = Field(
        default=None,
        description="write the port /metrics took into this file (with a range of ports: for a container's "
                    "health check, which must probe its own replica)")
    metrics_host: str = Field(
        default="127.0.0.1", min_length=1,
        description="address /metrics listens on: this host only by default; 0.0.0.0 for every interface (the "
                    "container image sets it, so that Prometheus can scrape the pod)")
    commit_interval_ms: int = Field(default=1000, ge=10, le=600_000,
                                    description="how often acknowledged offsets are committed")
    transaction_interval_ms: float = Field(
        default=100.0, ge=0.0, le=60_000.0,
        description="exactly-once: batches queued behind a transaction's first batch join it until it is this "
                    "old at a batch's end, then it commits (0: one transaction per batch); with nothing queued it "
                    "commits at once")
    max_inflight_batches: int = Field(default=4, ge=1, le=1024,
                                      description="closed batches waiting for the model before input pauses")
    shutdown_timeout_s: float = Field(default=30.0, gt=0.0, le=3600.0,
                                      description="bound on the graceful shutdown after SIGTERM or SIGINT "
                                                  "(batches not finished by then: exit 1, left uncommitted)")
    stall_timeout_s: float = Field(
        default=120.0, ge=1.0, le=86_400.0,
        description="an assigned partition with records waiting and no committed progress for this long is "
                    "reported stalled (a WARNING naming it, stream_stalled_partitions)")
    model_timeout_s: float = Field(
        default=600.0, ge=1.0, le=86_400.0,
        description="a call into the model (its prepare, predict, the wait for the device, postprocess) that has "
                    "not returned for this long fails the worker: /healthz 503, the call's stack in an ERROR, the "
                    "batches behind it left uncommitted and its partitions to the group's other replicas; raise it "
                    "for a model whose largest batch can take longer on its hardware")
    stop_at_end: bool = Field(default=False,
                              description="drain to the end offsets that existed at start, commit, exit 0")
    dlq_topic: str | None = Field(default=None, min_length=1, max_length=249,
                                  description="dead-letter topic for bad records (created if missing); without "
                                              "it a bad record stops the worker")
    max_input_bytes: int = Field(default=1_048_576, ge=16, le=1_073_741_824,
                                 description="larger input values are dead-lettered")
    model_retries: int = Field(default=2, ge=0, le=100, description="retries of a failed batch before bisecting it")
    retry_backoff_ms: float = Field(default=50.0, ge=0.0, le=60_000.0,
                                    description="the first retry's delay, doubled per retry")
    dlq_max_fraction: float = Field(default=0.5, gt=0.0, le=1.0,
                                    description="stop when the model failed on more than this fraction of the last "
                                                "--dlq-window records it was given (1: never); records the decode "
                                                "stage dead-letters do not count")
    dlq_window: int = Field(default=1000, ge=1, le=10_000_000,
                            description="records given to the model in the circuit breaker's window")
    schemas_dir: Path | None = Field(default=None, description="the schema folder when no registry is given "
                                                               "(default: the repository's schemas/)")
    schema_registry_url: str | None = Field(
        default=None, min_length=1,
        description="a Confluent-compatible schema registry (also SCHEMA_REGISTRY_URL; client settings from "
                    "SCHEMA_REGISTRY_*); without it, the schema folder")
    input_schema: str | None = Field(
        default=None, min_length=1,
        description="the schema the worker reads: an .avsc file, or a subject (registry) / record name (folder); "
                    "default: the model's own, else <input-topic>-value")
    output_schema: str | None = Field(
        default=None, min_length=1,
        description="the prediction schema: an .avsc file (registered under the output subject), or a subject / "
                    "record name; default: the model's own, else derived from the model's outputs, the copied "
                    "fields and the lineage fields")
    copy_fields: str | None = Field(
        default=None, description="FIELD or OUTPUT=FIELD,...: input fields copied into every prediction "
                                  "(default: the model's own list)")
    subject_name_strategy: Literal["topic", "record", "topic-record"] = Field(
        default="topic", description="the output schema's subject: <topic>-value, <record name> or "
                                     "<topic>-<record name>")
    input_map: str | None = Field(
        default=None, description="INPUT=FIELD,...: the input schema's field (dotted path) each model input "
                                  "reads; default: the field of the input's name")
    provenance_headers: bool = Field(
        default=False,
        description="also put the input record's topic, partition and offset in headers of each prediction "
                    "(stream.input.topic/partition/offset); the prediction schema carries them in its value "
                    "from version 2 on, and with an older schema the headers are always written")
    copy_headers: str | None = Field(
        default=None, min_length=1,
        description="NAME,...: input record headers carried onto its prediction, dead letter and reply (with "
                    "traceparent and tracestate, always carried); at most 10")
    reply_topics: str | None = Field(
        default=None, min_length=1,
        description="the topics a caller's reply address (header stream.reply, set by the gateway) may name, "
                    "comma-separated; default: <input-topic>.replies; an address naming another topic is refused "
                    "(stream_replies_total{outcome=\"refused\"}) and its record processed as any other")
    shadow: bool = Field(
        default=False,
        description="a shadow run of a model version: never answer callers' reply addresses (the production "
                    "workers do); give it a group and an output topic of its own, then python -m stream compare")
    start_from: str | None = Field(
        default=None, min_length=1,
        description="where a partition without a committed offset in this group starts: earliest (the default), "
                    "latest, or a time (Unix milliseconds, or ISO 8601 such as 2026-11-26T14:00:00Z): the first "
                    "record at or after it")
    native_producer: bool = Field(
        default=True,
        description="publish predictions through the C extension where it is built (one librdkafka call a batch; "
                    "not with --provenance-headers; docs/internals.md)")
    native_consumer: bool = Field(
        default=True,
        description="take input records through the C extension where it is built (whole batches into one buffer; "
                    "docs/internals.md)")
    guarantee: Literal["at-least-once", "exactly-once"] = Field(
        default="at-least-once",
        description="exactly-once: Kafka transactions holding the predictions and the input offsets")
    transactional_id: str | None = Field(default=None, min_length=1,
                                         description="exactly-once: a stable id per replica (default: "
                                                     "group-host-pid)")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="the log's level")
    max_traced_per_s: float = Field(default=200.0, ge=0.0, le=1e6, description="with OTel on: the most input "
                                    "records a second that get spans; the others are only carried")

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _port_range(cls, value: object) -> object:
        return value if value is None or isinstance(value, tuple) else parse_port_range(value)

    @model_validator(mode="after")
    def _check_topics(self) -> WorkerSettings:
        if self.input_topic == self.output_topic:
            raise ValueError("input_topic and output_topic must differ (the worker would consume its own output)")
        if self.dlq_topic is not None and self.dlq_topic in (self.input_topic, self.output_topic):
            raise ValueError("dlq_topic must differ from the input and output topics")
        if self.shadow and self.reply_topics is not None:
            raise ValueError("a shadow worker answers no caller: reply_topics cannot be given with shadow")
        if self.start_from is not None and self.start_from not in ("earliest", "latest"):
            parse_start_time(self.start_from)  # a ValueError names the problem
        return self

    @property
    def start_from_ms(self) -> int | None:
        """``--start-from`` as a time (ms), None for earliest/latest or when not given."""
        if self.start_from is None or self.start_from in ("earliest", "latest"):
            return None
        return parse_start_time(self.start_from)

    @field_validator("copy_headers")
    @classmethod
    def _check_copy_headers(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = _names(value)
        if "" in names:
            raise ValueError(f"copy_headers {value!r}: an empty header name")
        if len(names) > MAX_COPY_HEADERS:
            raise ValueError(f"copy_headers: {len(names)} names, at most {MAX_COPY_HEADERS}")
        own = [n for n in names if n.startswith(("stream.", "kafka_"))]  # ours, and Spring's reply headers
        if own:
            raise ValueError(f"copy_headers: {own[0]} is the pipeline's own header (set by the worker or the "
                             "gateway), not copied")
        return value

    @property
    def copy_header_names(self) -> tuple[str, ...]:
        """``copy_headers`` as names (empty: only the trace context is carried)."""
        return () if self.copy_headers is None else _names(self.copy_headers)

    @property
    def reply_topic_set(self) -> frozenset[str]:
        if self.shadow:
            return frozenset()
        if self.reply_topics is None:
            return frozenset([default_reply_topic(self.input_topic)])
        return frozenset(t.strip() for t in self.reply_topics.split(",") if t.strip())

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly-once"

    def consumer_config(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        consumer, _ = kafka_env_config(os.environ if environ is None else environ)
        _check_owned(consumer, _CONSUMER_OWNED)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "auto.offset.reset": "latest" if self.start_from == "latest" else "earliest",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            # Fetch big chunks: the poll thread hands whole batches on, it never waits on the model.
            "fetch.min.bytes": 1,
            # A batch never waits longer than max_wait_ms for more records, so a fetch is never held longer
            # either: Kafka answers a waiting fetch when data arrives, but a broker that answers only at the
            # deadline (Tansu) otherwise adds up to librdkafka's 500 ms default to every record's latency.
            "fetch.wait.max.ms": max(1, min(500, int(self.max_wait_ms))),
            # Bounded prefetch: 16 MiB keeps the poll thread fed at full speed; 64 MiB measured the same
            # throughput with RSS still creeping up 10-15 % between 1 M and 5 M events.
            "queued.max.messages.kbytes": 16384,
            # ... of values: librdkafka counts a record's value alone toward it, not its key or headers, so records
            # of small values with large keys or headers stop its prefetch only at this count (100,000 by
            # default: most of a backlog of them). 200 records drained the demo and the text worker as fast
            # (docs/operations.md, "Memory and logs").
            "queued.min.messages": 200,
            # When the prefetch queue is over its bounds librdkafka stops fetching for this long (1 s by
            # default) and only then looks again: a broker that answers a fetch with far more than
            # max.partition.fetch.bytes (Tansu: ~6 MB per partition) fills the queue in one round, the worker
            # drains it in well under a second and then sat idle for the rest (measured: ~0.3 s of every
            # 1.2 s on Tansu; drain 118,000 -> 141,000-162,000 events/s with this setting).
            "fetch.queue.backoff.ms": 10,
            # The consumer's statistics every 5 s: partition lag and prefetched records for /metrics
            # (`client_stats`); 0 turns them off.
            "statistics.interval.ms": 5_000,
        }
        conf.update(consumer)
        conf.update(_CONSUMER_OWNED)
        if self.bootstrap_servers:  # the flag (or STREAM_BOOTSTRAP_SERVERS) wins over KAFKA_BOOTSTRAP_SERVERS
            conf["bootstrap.servers"] = self.bootstrap_servers
        conf["group.id"] = self.group_id
        if self.exactly_once:
            if str(conf.get("isolation.level", "read_committed")) != "read_committed":
                raise ConfigError("--guarantee exactly-once needs isolation.level=read_committed on the consumer")
            conf["isolation.level"] = "read_committed"
        if not conf["bootstrap.servers"]:
            raise ConfigError("no bootstrap servers: pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS")
        return conf

    def admin_config(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """For the worker's admin requests (creating the dead-letter topic, reading partitions and end offsets)."""
        conf: dict[str, Any] = kafka_admin_env_config(os.environ if environ is None else environ)
        if self.bootstrap_servers:
            conf["bootstrap.servers"] = self.bootstrap_servers
        if not conf.get("bootstrap.servers"):
            raise ConfigError("no bootstrap servers: pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS")
        return conf

    def producer_config(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        _, producer = kafka_env_config(os.environ if environ is None else environ)
        _check_owned(producer, _PRODUCER_OWNED)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "linger.ms": 5,
            "compression.type": "lz4",
            "batch.num.messages": 10_000,
        }
        conf.update(producer)
        conf.update(_PRODUCER_OWNED)
        if self.bootstrap_servers:
            conf["bootstrap.servers"] = self.bootstrap_servers
        if self.exactly_once:
            # Default: unique per process. Give each replica a stable id (e.g. its pod name) so that a restarted
            # replica aborts its predecessor's open transaction at once instead of after transaction.timeout.ms.
            conf["transactional.id"] = self.transactional_id or (
                f"{self.group_id}-{socket.gethostname()}-{os.getpid()}")
            # The coordinator answers CONCURRENT_TRANSACTIONS while the previous commit's markers are being
            # written, which back-to-back transactions often meet; librdkafka retries AddPartitionsToTxn after a
            # fixed 20 ms (as Java does) but AddOffsetsToTxn (send_offsets_to_transaction) after retry.backoff.ms,
            # 100 by default: that wait was most of exactly-once's added latency (docs/performance.md, "What a
            # read_committed reader waits").
            conf.setdefault("retry.backoff.ms", 20)
            timeout_ms = int(conf.setdefault("transaction.timeout.ms", 60_000))
            if timeout_ms <= self.max_wait_ms + self.transaction_interval_ms + 1000:
                raise ConfigError(
                    f"transaction.timeout.ms={timeout_ms} cannot fit a transaction: it must exceed --max-wait-ms "
                    f"({self.max_wait_ms:g}) plus --transaction-interval-ms ({self.transaction_interval_ms:g}) "
                    "plus the model and publish time, by at least 1000 ms")
            if timeout_ms > 900_000:
                raise ConfigError(f"transaction.timeout.ms={timeout_ms} exceeds the brokers' default "
                                  "transaction.max.timeout.ms (900000); the broker would refuse it")
        elif "transactional.id" in conf:
            raise ConfigError("transactional.id is set but --guarantee is at-least-once; "
                              "use --guarantee exactly-once")
        if not conf["bootstrap.servers"]:
            raise ConfigError("no bootstrap servers: pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS")
        return conf


def _check_owned(conf: Mapping[str, str], owned: Mapping[str, str]) -> None:
    for key, required in owned.items():
        if key in conf and str(conf[key]).lower() != required:
            raise ConfigError(
                f"librdkafka setting {key}={conf[key]!r} (from the environment) conflicts with the worker's "
                f"delivery guarantee, which needs {key}={required}; unset it"
            )


def load_settings(overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> WorkerSettings:
    """Settings from CLI overrides (None values ignored), then ``STREAM_*`` env, then defaults.

    ``KAFKA_BOOTSTRAP_SERVERS`` fills ``bootstrap_servers`` when neither the flag nor
    ``STREAM_BOOTSTRAP_SERVERS`` is given. Raises ConfigError with one line per bad setting.
    """
    env = os.environ if environ is None else environ
    given = {k: v for k, v in overrides.items() if v is not None}
    if "bootstrap_servers" not in given and "STREAM_BOOTSTRAP_SERVERS" not in env and env.get(
        "KAFKA_BOOTSTRAP_SERVERS"
    ):
        given["bootstrap_servers"] = env["KAFKA_BOOTSTRAP_SERVERS"]
    if "schema_registry_url" not in given and "STREAM_SCHEMA_REGISTRY_URL" not in env and env.get(
            "SCHEMA_REGISTRY_URL"):
        given["schema_registry_url"] = env["SCHEMA_REGISTRY_URL"]
    # Every STREAM_* variable must be a setting (typos fail loudly) except the few other tools read.
    stream_env = {k[len("STREAM_"):].lower(): v for k, v in env.items()
                  if k.startswith("STREAM_") and k not in NON_SETTING_ENV and not k.startswith(NON_SETTING_PREFIXES)}
    try:
        return WorkerSettings.model_validate({**stream_env, **given})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError, what: str = "worker", env_prefix: str = "STREAM_") -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        flag = "--" + where.replace("_", "-") if err["loc"] else where
        lines.append(f"{flag} ({env_prefix}{where.upper()}): {err['msg']}")
    return f"invalid {what} settings:\n  " + "\n  ".join(lines)
