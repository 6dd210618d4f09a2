"""``python -m stream gateway``: an HTTP front for callers that wait for their prediction, in the protocols their
clients speak: its own ``/v1/predict`` (`stream.gateway.app`), OpenAI's embeddings API and TEI's ``/embed``
(`stream.gateway.openai`), the Open Inference Protocol (`stream.gateway.kserve`); API keys and HTTPS
(`stream.gateway.auth`); every caller's resources bounded (`stream.gateway.server`).

Each request goes one way, whatever its protocol (`stream.gateway.door`): its events checked as the workers will
check them, then produced to the input topic (the durable queue the workers batch from) with a reply address, all
or none; the worker that predicts each publishes a copy of the prediction to this gateway's reply partition, where
the gateway picks it up and answers (`stream.kafka.replies`, `stream.gateway.client`).

Why Starlette on uvicorn: an asyncio server holds thousands of waiting callers on one thread (each waits on a
future the client's reply thread settles), both are small, maintained and typed, and neither brings a framework
the worker does not need.

Layer: imports `stream.errors`, `stream.config`, `stream.models` (declarations only), `stream.kafka`,
`stream.codec`, `stream.ops` and the pipeline's decode stage (`stream.pipeline.contract`, no torch for the
built-in models); only the commands import it.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from stream.errors import ConfigError

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from stream.codec.registry import SchemaSource, WriterSchema
    from stream.gateway.app import GatewayMetrics
    from stream.gateway.auth import KeySource
    from stream.gateway.door import Door
    from stream.gateway.http import Operation
    from stream.gateway.server import BodyBudget, Limits
    from stream.gateway.settings import GatewaySettings
    from stream.pipeline.contract import DecodeStage

log = logging.getLogger(__name__)
HEADROOM_BYTES = 1024  # what an event's record needs beside its value: its key, its reply header, the framing
WORKER_MAX_INPUT_BYTES = 1_048_576  # the workers' default --max-input-bytes (stream.config.WorkerSettings)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from stream.gateway.settings import add_arguments

    g = sub.add_parser("gateway", help="an HTTP service answering callers with their prediction: POST /v1/predict, "
                                       "OpenAI's /v1/embeddings, TEI's /embed, KServe v2 / Triton's /v2",
                       description="Puts each caller's events on the input topic, with a reply address, and answers "
                                   "with their predictions. Every flag has a STREAM_GATEWAY_* variable of its name.")
    add_arguments(g)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; then stop taking requests and wait for the pending ones (bounded)."""
    from stream.gateway.settings import GatewaySettings, load_gateway_settings

    settings = load_gateway_settings({name: getattr(args, name, None) for name in GatewaySettings.model_fields})
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    _check_tls(settings)
    _check_client_configs()
    from stream.gateway.auth import load_keys

    keys = load_keys([k.get_secret_value() for k in settings.api_key], settings.api_key_file)

    import threading

    import uvicorn
    from uvicorn._compat import asyncio_run

    from stream.gateway.server import protocol_class, shrink_tls_buffers, with_tls_handshake_timeout

    limits = limits_of(settings)
    starting = Starting()
    loop = settings.loop
    if settings.ssl_certfile:
        # uvloop's TLS holds 256 KiB per connection from its accept; asyncio's is made smaller (`shrink_tls_buffers`)
        if loop == "uvloop":
            log.warning("--loop uvloop with HTTPS: each connection, even one that never completes its handshake, "
                        "holds 256 KiB; --loop asyncio holds 32 KiB")
        else:
            loop = "asyncio"
            shrink_tls_buffers()
    config = uvicorn.Config(starting, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            lifespan="off", loop=loop, http=protocol_class(limits),
                            timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
                            ssl_certfile=settings.ssl_certfile, ssl_keyfile=settings.ssl_keyfile,
                            timeout_graceful_shutdown=int(max(1, settings.shutdown_timeout_s)))
    server = uvicorn.Server(config)

    def failed() -> None:
        server.should_exit = True  # uvicorn's loop looks every 0.1 s

    startup = Startup(settings, keys, starting, failed)
    # uvicorn serves SIGTERM/SIGINT itself (stops listening, waits for the requests in flight up to the bound),
    # then raises the signal again under the handler it found: one that does nothing lets the client close next.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # What is loaded now lives as long as the process: out of the collector's reach, so that a full collection
    # walks only what requests allocate (it walked the imports too, every request waiting behind it). The start-up
    # freezes again what it made.
    gc.collect()
    gc.freeze()
    thread = threading.Thread(target=startup.run, name="gateway-startup", daemon=True)
    thread.start()
    loop_factory = config.get_loop_factory()
    try:
        asyncio_run(server.serve(), loop_factory=with_tls_handshake_timeout(
            loop_factory or _default_loop, settings.tls_handshake_timeout_s))
    finally:
        startup.stop.set()
        thread.join(timeout=1.0)  # done, or blocked on something that may never answer: nothing to finish
        if thread.is_alive():
            log.warning("stopped while the start-up was still %s; leaving it", starting.phase)
        else:
            startup.close(settings.shutdown_timeout_s)
    if startup.error is not None:
        raise startup.error
    log.info("gateway stopped")
    return 0


def make_app(settings: GatewaySettings, source: SchemaSource, client: Any, max_input_bytes: int,
             keys: KeySource | None = None) -> tuple[Any, Limits]:
    """The gateway's ASGI app over ``client`` (a `stream.gateway.client.PredictionClient`, or a stand-in with its
    ``send``, ``max_pending``, ``pending``, ``alive`` and ``ready``), and the limits its server applies."""
    from stream.gateway.app import GatewayMetrics, build_app, own_operations
    from stream.gateway.auth import ApiKeys
    from stream.gateway.door import Door
    from stream.gateway.events import EventEncoder, json_schema
    from stream.gateway.server import BodyBudget

    schema = _input_schema(source, settings)
    encoder = EventEncoder(schema, max_input_bytes, settings.key_field)
    stage = _decode_stage(settings, source, schema, max_input_bytes)
    output = _output_schema(settings, source)
    door = Door(encoder, stage, client)
    limits = limits_of(settings)
    budget = BodyBudget(limits)
    metrics = GatewayMetrics(client)
    components: dict[str, Any] = {}
    operations = [*own_operations(door, client, budget, metrics, components,
                                  json_schema(output) if output else None),
                  *_embeddings_operations(settings, door, budget, schema, metrics, components),
                  *_inference_operations(settings, door, budget, schema, output, client, metrics, components)]
    app = build_app(operations, budget, components, version=_version(), secured=keys is not None)
    log.info("events as %s (id %d)", schema.name, schema.schema_id)
    return (ApiKeys(app, keys, {op.path for op in operations if op.open}) if keys else app), limits


def limits_of(settings: GatewaySettings) -> Limits:
    """What the server bounds for every caller, from the settings alone (it applies them from the start-up on)."""
    from stream.gateway.server import Limits

    return Limits(max_header_bytes=settings.max_header_bytes, header_timeout_s=settings.header_timeout_s,
                  body_timeout_s=settings.body_timeout_s, tls_handshake_timeout_s=settings.tls_handshake_timeout_s,
                  keep_alive_s=settings.keep_alive_s, max_body_bytes=settings.max_body_bytes,
                  max_buffered_bytes=settings.max_buffered_bytes, max_connections=settings.max_connections)


class Starting:
    """The ASGI app the server answers with from its start: the gateway's own (``app``) once the start-up has made
    it; until then the probes (``/healthz`` and ``/v2/health/live`` 200: the process is alive; ``/readyz`` and
    ``/v2/health/ready`` 503, with the phase it is in) and a 503 with ``Retry-After`` for every other route, in the
    shape of its protocol. A gateway started before its brokers used to listen only once they answered: a
    supervisor's liveness probe failed meanwhile and restarted it, each time with a longer back-off."""

    def __init__(self) -> None:
        self.app: Any = None
        self.phase = "waiting for the Kafka brokers"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self.app
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # no route takes one: refused (403), as the app's router does
            await send({"type": "websocket.close", "code": 1013})
            return
        if scope["type"] != "http":
            return
        from stream.gateway.http import NOT_READY_RETRY_AFTER, error_for_path, json_response

        path, probe = scope["path"], scope["method"] in ("GET", "HEAD")
        if probe and path == "/healthz":
            response = json_response({"alive": True})
        elif probe and path == "/v2/health/live":
            response = json_response({"live": True})
        elif probe and path == "/readyz":
            response = json_response({"ready": False, "why": [f"the gateway is starting: {self.phase}"]}, 503,
                                     NOT_READY_RETRY_AFTER)
        elif probe and path == "/v2/health/ready":
            response = json_response({"ready": False}, 503, NOT_READY_RETRY_AFTER)
        else:
            response = json_response(error_for_path(path, f"the gateway is starting ({self.phase}): try again "
                                                          "shortly", "unavailable"), 503, NOT_READY_RETRY_AFTER)
        await response(scope, receive, send)


class Startup:
    """What the gateway needs of its brokers and its schema source before it takes a request, on a thread of its
    own while the server answers with `Starting`: the brokers waited for, the reply topic made, the limits the
    broker sets read, the schemas loaded, the client started and the app made, then handed to ``starting``. An
    error is kept (``error``, raised by the command once the server has stopped) and ``failed`` called; ``stop``
    ends the wait for the brokers."""

    def __init__(self, settings: GatewaySettings, keys: KeySource | None, starting: Starting,
                 failed: Callable[[], None]) -> None:
        import threading

        self.settings = settings
        self.keys = keys
        self.starting = starting
        self.failed = failed
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.client: Any = None
        self.source: SchemaSource | None = None
        self.tracing: Any = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # raised again by the command, on its own thread
            self.error = exc
            self.failed()

    def _run(self) -> None:
        from stream.codec.registry import open_source
        from stream.config import default_reply_topic
        from stream.gateway.client import PredictionClient
        from stream.kafka.topics import create_topics, partitions_of
        from stream.kafka_env import kafka_admin_env_config, kafka_env_config
        from stream.ops.tracing import RequestSpans, tracing_from_env

        settings = self.settings
        reply_topic = settings.reply_topic or default_reply_topic(settings.input_topic)
        consumer_env, producer_env = kafka_env_config(os.environ)
        admin_env = kafka_admin_env_config(os.environ)
        _wait_for_brokers(settings.bootstrap_servers, admin_env, self.stop)
        if self.stop.is_set():
            return
        self.starting.phase = "creating its reply topic and reading its schemas"
        create_topics(settings.bootstrap_servers, [reply_topic], settings.reply_partitions, client_config=admin_env)
        partitions = partitions_of(settings.bootstrap_servers, reply_topic, admin_env)
        if settings.reply_partition not in partitions:
            raise ConfigError(f"--reply-partition {settings.reply_partition}: {reply_topic} has {len(partitions)} "
                              "partition(s) (it existed already; add partitions with kafka-topics --alter)")
        max_input_bytes = _max_input_bytes(settings, producer_env, admin_env)
        self.source = open_source(settings.schema_registry_url, settings.schemas_dir)
        if self.stop.is_set():
            return
        self.client = PredictionClient(
            bootstrap_servers=settings.bootstrap_servers, input_topic=settings.input_topic, reply_topic=reply_topic,
            reply_partition=settings.reply_partition, source=self.source, timeout_s=settings.timeout_ms / 1000.0,
            max_pending=settings.max_pending, worker_group=settings.worker_group, producer_config=producer_env,
            consumer_config=consumer_env, admin_config=admin_env)
        served, _ = make_app(settings, self.source, self.client, max_input_bytes, self.keys)
        self.tracing = tracing_from_env("stream-gateway")  # OTEL_EXPORTER_OTLP_ENDPOINT: a span per request
        if self.tracing is not None:
            served = RequestSpans(served, self.tracing)
        self.starting.app = served
        scheme = "https" if settings.ssl_certfile else "http"
        log.info("gateway on %s://%s:%d: events to %s, checked against --model %s, up to %d bytes; replies from "
                 "%s[%d]", scheme, settings.host, settings.port, settings.input_topic, settings.model,
                 max_input_bytes, reply_topic, settings.reply_partition)
        if self.keys:
            log.info("callers need one of %d API key(s) (Authorization: Bearer)", len(self.keys))
        else:
            log.warning("no --api-key: anyone who can reach %s:%d may call this gateway", settings.host,
                        settings.port)
        gc.collect()
        gc.freeze()

    def close(self, wait_s: float) -> None:
        """What the start-up made, once the server has stopped: the client (waiting up to ``wait_s`` for the
        requests still pending), the schema source, the tracer."""
        if self.client is not None:
            left = self.client.close(wait_s=wait_s)
            if left:
                log.warning("stopped with %d request(s) unanswered (their events are in the input topic)", left)
        if self.source is not None:
            self.source.close()
        if self.tracing is not None:
            self.tracing.shutdown()


def _default_loop() -> Any:
    import asyncio

    return asyncio.new_event_loop()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kafka-microbatch-inference")
    except PackageNotFoundError:
        return "0"


def _check_client_configs() -> None:
    """A ``KAFKA_*`` setting librdkafka refuses fails the command before it listens, with the reason."""
    from stream.kafka_env import check_client_configs, kafka_admin_env_config, kafka_env_config

    consumer, producer = kafka_env_config(os.environ)
    check_client_configs({"consumer": consumer, "producer": producer, "admin": kafka_admin_env_config(os.environ)})


def _check_tls(settings: GatewaySettings) -> None:
    if settings.ssl_certfile:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(settings.ssl_certfile,
                                                                                settings.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--ssl-certfile {settings.ssl_certfile} / --ssl-keyfile {settings.ssl_keyfile}: "
                              f"{exc}") from None


def _wait_for_brokers(bootstrap: str, admin_env: dict[str, str], stop: threading.Event) -> None:
    """Until the brokers answer a metadata request, before the gateway asks them anything else: one WARNING with
    librdkafka's reason when they cannot be reached, a reminder every 30 s, an INFO when they answer (a gateway
    started beside its brokers, or before them, waits for them; SIGTERM ends the wait). It used to say nothing
    for 30 s, then exit 1 with a TimeoutError's traceback."""
    from stream.kafka.client_logs import ConnectionWatch
    from stream.kafka.topics import ask_until_answered

    connection = ConnectionWatch()
    ask_until_answered(lambda client: client.list_topics(timeout=10), {
        **admin_env, "bootstrap.servers": bootstrap, "error_cb": connection.on_admin_error}, connection, stop)


def _max_input_bytes(settings: GatewaySettings, producer_env: dict[str, str], admin_env: dict[str, str]) -> int:
    """``--max-input-bytes``, or what the producer and the input topic can take: an event the broker would refuse
    must be a 413 at the door, never a 503 after it."""
    try:
        producer_max = int(producer_env.get("message.max.bytes", 1_000_000))
    except ValueError:
        raise ConfigError(f"message.max.bytes {producer_env['message.max.bytes']!r} is not a number") from None
    topic_max = _topic_max_message_bytes(settings, admin_env)
    can = min(producer_max, topic_max or producer_max) - HEADROOM_BYTES
    why = f"the producer's message.max.bytes {producer_max:,}" + (
        f" and the input topic's max.message.bytes {topic_max:,}" if topic_max else "")
    if settings.max_input_bytes is None:
        if can < 16:
            raise ConfigError(f"{why} leave no room for an event")
        return min(can, WORKER_MAX_INPUT_BYTES)  # what the workers take by default (their --max-input-bytes)
    if settings.max_input_bytes > can:
        raise ConfigError(f"--max-input-bytes {settings.max_input_bytes:,} is more than the broker takes: {why}, "
                          f"less {HEADROOM_BYTES} bytes for the key and headers, is {can:,}")
    return settings.max_input_bytes


def _topic_max_message_bytes(settings: GatewaySettings, admin_env: dict[str, str]) -> int | None:
    """The input topic's max.message.bytes, where the brokers tell (None: they do not, or not to us)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, **admin_env})
    try:
        [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, settings.input_topic)],
                                          request_timeout=10).values()
        entry = future.result().get("max.message.bytes")
        return int(entry.value) if entry is not None and entry.value else None
    except (KafkaException, ValueError, TypeError) as exc:
        log.info("the input topic's max.message.bytes is not known (%s): the producer's limit applies", exc)
        return None


def _decode_stage(settings: GatewaySettings, source: SchemaSource, schema: WriterSchema,
                  max_input_bytes: int) -> DecodeStage:
    """The workers' decode stage for ``--model``'s inputs, run on every event before it is sent."""
    from stream.pipeline.contract import decode_stage, model_inputs
    from stream.pipeline.inputs import parse_input_map

    inputs = model_inputs(settings.model, settings.model_dir)
    try:
        stage = decode_stage(inputs, source, schema, parse_input_map(settings.input_map), max_input_bytes)
    except ConfigError as exc:
        raise ConfigError(f"{exc}\n(--model, --model-dir and --input-map name the workers' model: the gateway "
                          "checks each event as they will)") from None
    stage.decoder.plan_for(schema.schema_id)  # the writer's plan made now, not at the first request
    return stage


def _output_schema(settings: GatewaySettings, source: SchemaSource) -> Any:
    """The prediction schema as JSON, when known: --output-schema, else the model's own without a registry (with
    one the workers register theirs under a subject of the output topic's, which the gateway does not know)."""
    from stream.models.declared import declared

    name = settings.output_schema or (None if settings.schema_registry_url else declared(settings.model).output_schema)
    if not name:
        return None
    try:
        return _raw(source.latest(name).raw)
    except ConfigError as exc:
        if settings.output_schema:
            raise
        log.info("the prediction schema is not known: %s (--output-schema names the workers')", exc)
        return None


def _embeddings_operations(settings: GatewaySettings, door: Door, budget: BodyBudget, schema: WriterSchema,
                           metrics: GatewayMetrics, components: dict[str, Any]) -> list[Operation]:
    """OpenAI's embeddings API and TEI's /embed (`stream.gateway.openai`). An input schema with no text field
    (and no --text-field) turns them off: they answer 404 saying why. One whose other required fields a text
    cannot fill stops the start, as does a --text-field or --text-event-field that does not fit it."""
    from stream.gateway.openai import EmbeddingsApi, unavailable_operations
    from stream.gateway.texts import NoTextField, TextEvents, parse_field_values
    from stream.models.declared import declared

    values = parse_field_values(settings.text_event_field)
    try:
        texts = TextEvents(_raw(schema.raw), settings.text_field, values)
    except NoTextField as exc:
        if values:
            raise
        log.info("OpenAI's embeddings API is off: %s", exc)
        return unavailable_operations(str(exc))
    model = declared(settings.model)
    api = EmbeddingsApi(door, budget, texts, model_name=settings.served_model_name or model.name or settings.model,
                        embedding_field=settings.embedding_field, dimensions=model.vector_size,
                        max_texts=min(settings.max_texts, settings.max_pending), pooling=model.pooling,
                        max_tokens=model.max_tokens)
    log.info("OpenAI's embeddings API: /v1/embeddings serves %s, texts into %s.%s", api.model_name, schema.name,
             texts.text_field)
    return api.operations(components, (metrics.embeddings, metrics.embeddings_latency))


def _inference_operations(settings: GatewaySettings, door: Door, budget: BodyBudget, schema: WriterSchema,
                          output: Any, client: Any, metrics: GatewayMetrics, components: dict[str, Any]
                          ) -> list[Operation]:
    """The Open Inference Protocol's routes (`stream.gateway.kserve`)."""
    from stream.gateway.kserve import InferenceApi
    from stream.models.declared import declared

    api = InferenceApi(door, budget, _raw(schema.raw), output,
                       model_name=settings.served_model_name or declared(settings.model).name or settings.model,
                       probes=client)
    log.info("the Open Inference Protocol (v2): /v2/models/%s, inputs %s", api.model_name,
             ", ".join(f.name for f in api.inputs))
    return api.operations(components, (metrics.infer, metrics.infer_latency))


def _raw(raw: Any) -> Any:
    """A registry's schema JSON as an object, logical types kept."""
    return json.loads(raw) if isinstance(raw, str) else raw


def _input_schema(source: SchemaSource, settings: GatewaySettings) -> WriterSchema:
    """The events' schema, registered (its id goes in front of each event): an .avsc file registered under
    ``<input-topic>-value`` (or found in the folder), else a subject or record name, else the worker's default:
    that subject with a registry, the model's own input schema without."""
    from stream.codec.registry import reader_schema
    from stream.models.declared import declared_input_schema

    subject = f"{settings.input_topic}-value"
    if settings.input_schema and settings.input_schema.endswith(".avsc"):
        return source.register(subject, reader_schema(source, settings.input_schema, None).raw)
    if settings.input_schema or settings.schema_registry_url:
        return reader_schema(source, settings.input_schema, subject)
    declared = declared_input_schema(settings.model)
    if declared is None:
        raise ConfigError(f"no input schema: --model {settings.model} declares none; pass --input-schema (an .avsc "
                          "file or a record name in the schema folder), or --schema-registry-url (the subject "
                          "<input-topic>-value)")
    return reader_schema(source, declared, None)
