"""``python -m stream gateway``: an HTTP front for callers that wait for their prediction, in the protocols their
clients speak: its own ``/v1/predict``, OpenAI's embeddings API and TEI's ``/embed`` (`stream.gateway.openai`), the
Open Inference Protocol (`stream.gateway.kserve`); API keys and HTTPS (`stream.gateway.auth`).

Each request becomes a record of the input topic (the durable queue the workers batch from) with a reply address;
the worker that predicts it publishes a copy of the prediction to this gateway's reply partition, where the
gateway picks it up and answers (`stream.kafka.replies`, `stream.gateway.client`, `stream.gateway.app`).

Why Starlette on uvicorn: an asyncio server holds thousands of waiting callers on one thread (each waits on a
future the client's reply thread settles), both are small, maintained and typed, and neither brings a framework
the worker does not need (FastAPI's request models would duplicate the Avro schema, which is the contract here).

Layer: imports `stream.errors`, `stream.config`, `stream.models` (names only), `stream.kafka`, `stream.codec` and
`stream.ops`, never the pipeline (a gateway runs without torch); only the commands import it.
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
    from starlette.routing import Route

    from stream.codec.registry import SchemaSource, WriterSchema
    from stream.gateway.app import GatewayMetrics
    from stream.gateway.client import PredictionClient

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("gateway", help="an HTTP service answering callers with their prediction: POST /v1/predict, "
                                       "OpenAI's /v1/embeddings, TEI's /embed, KServe v2 / Triton's /v2")
    g.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="Kafka brokers (KAFKA_BOOTSTRAP_SERVERS; other KAFKA_* variables as for the worker)")
    g.add_argument("--input-topic", required=True, help="the workers' input topic")
    g.add_argument("--reply-topic", default=None,
                   help="where workers send replies (default <input-topic>.replies, the workers' default "
                        "--reply-topics); created if missing")
    g.add_argument("--reply-partition", type=int, default=0,
                   help="the partition of the reply topic this gateway reads: one per gateway replica (0)")
    g.add_argument("--reply-partitions", type=int, default=4,
                   help="partitions of the reply topic when it is created here (4: room for four replicas)")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; 0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=8080)
    g.add_argument("--timeout-ms", type=float, default=5000.0,
                   help="answer 504 when no prediction came within this long (5000)")
    g.add_argument("--max-pending", type=int, default=1000,
                   help="answer 503 while this many events wait for their predictions (1000)")
    g.add_argument("--max-input-bytes", type=int, default=1_048_576,
                   help="answer 413 for a body, or an event encoded, over this size (1 MiB, as the worker)")
    g.add_argument("--schema-registry-url", default=os.environ.get("SCHEMA_REGISTRY_URL"),
                   help="a Confluent-compatible schema registry (SCHEMA_REGISTRY_URL); without it, --schemas-dir")
    g.add_argument("--schemas-dir", default=None, help="the schema folder (default: the repository's schemas/)")
    g.add_argument("--input-schema", default=None,
                   help="the events' schema: an .avsc file (registered under <input-topic>-value), or a subject "
                        "(registry) / record name (folder); default as the worker's: with a registry "
                        "<input-topic>-value, else the --model's own")
    g.add_argument("--model", default=os.environ.get("STREAM_MODEL", "demo"),
                   help="the workers' --model (STREAM_MODEL; default demo), whose input schema is the default "
                        "--input-schema without a registry, as for the worker (the model is not loaded)")
    g.add_argument("--served-model-name", default=None,
                   help="the model name OpenAI's API and the v2 protocol serve (/v1/models, /v2/models/NAME; a "
                        "request naming another gets 404); "
                        "default: the --model's own name (minilm: all-MiniLM-L6-v2), else --model")
    g.add_argument("--text-field", default=None,
                   help="/v1/embeddings: the input schema's field that gets each text (default: text); the other "
                        "fields get fresh ids (strings), the time (timestamps) or their defaults")
    g.add_argument("--text-event-field", action="append", default=[], metavar="NAME=VALUE",
                   help="/v1/embeddings: a value for another field of each text's event (repeatable)")
    g.add_argument("--output-schema", default=None,
                   help="the workers' prediction schema (a record name in the schema folder, or a subject), for the "
                        "v2 model metadata's outputs; default: the --model's own (demo's), else none listed")
    g.add_argument("--embedding-field", default="embedding",
                   help="/v1/embeddings: the prediction's float-vector field (embedding)")
    g.add_argument("--max-texts", type=int, default=512,
                   help="/v1/embeddings: most texts in one request (512; at most --max-pending); more: 400")
    g.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key callers send as Authorization: Bearer KEY (repeat it for several; also "
                        "STREAM_GATEWAY_API_KEYS, comma-separated); every route but /healthz, /readyz and the v2 "
                        "health ones needs one; without any key, anyone who can reach the port may call")
    g.add_argument("--api-key-file", action="append", default=[], metavar="PATH",
                   help="a file of keys, one a line (# comments), e.g. a mounted Kubernetes secret")
    g.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM; with --ssl-keyfile)")
    g.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    g.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                   help="the event loop: asyncio's own, or uvloop (libuv; install it yourself: it measured no "
                        "faster here, docs/gateway.md); auto: uvloop when installed")
    g.add_argument("--shutdown-timeout-s", type=float, default=30.0,
                   help="on SIGTERM, how long to wait for the requests in flight (30)")
    g.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; then stop taking requests and wait for the pending ones (bounded)."""
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    _check(args)
    from pathlib import Path

    from stream.gateway.auth import ApiKeys, load_keys

    keys = load_keys(args.api_key, args.api_key_file)

    import uvicorn

    from stream.codec.registry import open_source
    from stream.config import default_reply_topic, kafka_admin_env_config, kafka_env_config
    from stream.gateway.app import GatewayMetrics, build_app
    from stream.gateway.client import PredictionClient
    from stream.kafka.topics import create_topics, partitions_of

    reply_topic = args.reply_topic or default_reply_topic(args.input_topic)
    consumer_env, producer_env = kafka_env_config(os.environ)
    admin_env = kafka_admin_env_config(os.environ)
    create_topics(args.bootstrap_servers, [reply_topic], args.reply_partitions, client_config=admin_env)
    partitions = partitions_of(args.bootstrap_servers, reply_topic, admin_env)
    if args.reply_partition not in partitions:
        raise ConfigError(f"--reply-partition {args.reply_partition}: {reply_topic} has {len(partitions)} "
                          "partition(s) (it existed already; add partitions with kafka-topics --alter)")
    source = open_source(args.schema_registry_url, Path(args.schemas_dir) if args.schemas_dir else None)
    schema = _input_schema(source, args)
    client = PredictionClient(
        bootstrap_servers=args.bootstrap_servers, input_topic=args.input_topic, reply_topic=reply_topic,
        reply_partition=args.reply_partition, source=source, input_schema=schema,
        timeout_s=args.timeout_ms / 1000.0, max_pending=args.max_pending, max_input_bytes=args.max_input_bytes,
        producer_config=producer_env, consumer_config=consumer_env)
    metrics = GatewayMetrics(client)
    app = build_app(client, metrics, args.max_input_bytes,
                    [*_embeddings_routes(args, client, schema, metrics),
                     *_inference_routes(args, client, schema, source, metrics)])
    served = ApiKeys(app, keys) if keys else app
    server = uvicorn.Server(uvicorn.Config(served, host=args.host, port=args.port, log_level="warning",
                                           access_log=False, lifespan="off", loop=args.loop,
                                           ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                                           timeout_graceful_shutdown=int(max(1, args.shutdown_timeout_s))))
    scheme = "https" if args.ssl_certfile else "http"
    log.info("gateway on %s://%s:%d: events to %s as %s (id %d), replies from %s[%d]", scheme, args.host, args.port,
             args.input_topic, schema.name, schema.schema_id, reply_topic, args.reply_partition)
    if keys:
        log.info("callers need one of %d API key(s) (Authorization: Bearer)", len(keys))
    else:
        log.warning("no --api-key: anyone who can reach %s:%d may call this gateway", args.host, args.port)
    # uvicorn serves SIGTERM/SIGINT itself (stops listening, waits for the requests in flight up to the bound),
    # then raises the signal again under the handler it found: one that does nothing lets the client close next.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # What is loaded now lives as long as the process: out of the collector's reach, so that a full collection
    # walks only what requests allocate (it walked the imports too, every request waiting behind it).
    gc.collect()
    gc.freeze()
    try:
        server.run()
    finally:
        left = client.close(wait_s=args.shutdown_timeout_s)
        if left:
            log.warning("stopped with %d request(s) unanswered (their events are in the input topic)", left)
        source.close()
    log.info("gateway stopped")
    return 0


def _check(args: argparse.Namespace) -> None:
    if not args.bootstrap_servers:
        raise ConfigError("no brokers: pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS")
    for name in ("timeout_ms", "max_pending", "max_input_bytes", "reply_partitions", "shutdown_timeout_s",
                 "max_texts"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}")
    if not 0 <= args.reply_partition < args.reply_partitions:
        raise ConfigError(f"--reply-partition {args.reply_partition} is not one of the reply topic's "
                          f"{args.reply_partitions} partitions (--reply-partitions)")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is not a TCP port")
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise ConfigError("HTTPS needs both --ssl-certfile and --ssl-keyfile")
    if args.ssl_certfile:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--ssl-certfile {args.ssl_certfile} / --ssl-keyfile {args.ssl_keyfile}: {exc}") from None


def _embeddings_routes(args: argparse.Namespace, client: PredictionClient, schema: WriterSchema,
                       metrics: GatewayMetrics) -> list[Route]:
    """OpenAI's embeddings API and TEI's /embed (`stream.gateway.openai`). An input schema with no text field
    (and no --text-field) turns them off: they answer 404 saying why. One whose other required fields a text
    cannot fill stops the start, as does a --text-field or --text-event-field that does not fit it."""
    from stream.gateway.app import read_body, timed
    from stream.gateway.openai import EmbeddingsApi, unavailable_routes
    from stream.gateway.texts import NoTextField, TextEvents, parse_field_values
    from stream.models.declared import declared

    values = parse_field_values(args.text_event_field)
    try:
        texts = TextEvents(_raw(schema.raw), args.text_field, values)
    except NoTextField as exc:
        if values:
            raise
        log.info("OpenAI's embeddings API is off: %s", exc)
        return unavailable_routes(str(exc))
    model = declared(args.model)
    api = EmbeddingsApi(client, texts, model_name=args.served_model_name or model.name or args.model,
                        embedding_field=args.embedding_field, dimensions=model.vector_size,
                        max_texts=min(args.max_texts, args.max_pending),
                        read_body=lambda request: read_body(request, args.max_input_bytes))
    log.info("OpenAI's embeddings API: /v1/embeddings serves %s, texts into %s.%s", api.model_name, schema.name,
             texts.text_field)
    return api.routes(lambda handler: timed(handler, metrics.embeddings, metrics.embeddings_latency))


def _inference_routes(args: argparse.Namespace, client: PredictionClient, schema: WriterSchema,
                      source: SchemaSource, metrics: GatewayMetrics) -> list[Route]:
    """The Open Inference Protocol's routes (`stream.gateway.kserve`)."""
    from stream.gateway.app import read_body, timed
    from stream.gateway.kserve import InferenceApi
    from stream.models.declared import declared

    model = declared(args.model)
    # The model's own names a record in the schema folder; with a registry the workers register theirs under a
    # subject of the output topic's, which the gateway does not know: --output-schema names it.
    output_name = args.output_schema or (None if args.schema_registry_url else model.output_schema)
    output = None
    if output_name:
        try:
            output = _raw(source.latest(output_name).raw)
        except ConfigError as exc:
            if args.output_schema:
                raise
            log.info("the v2 model metadata lists no outputs: %s (--output-schema names the workers')", exc)
    api = InferenceApi(client, _raw(schema.raw), output, model_name=args.served_model_name or model.name or args.model,
                       read_body=lambda request: read_body(request, args.max_input_bytes))
    log.info("the Open Inference Protocol (v2): /v2/models/%s, inputs %s", api.model_name,
             ", ".join(f.name for f in api.inputs))
    return api.routes(lambda handler: timed(handler, metrics.infer, metrics.infer_latency))


def _raw(raw: Any) -> Any:
    """A registry's schema JSON as an object, logical types kept."""
    return json.loads(raw) if isinstance(raw, str) else raw


def _input_schema(source: SchemaSource, args: argparse.Namespace) -> WriterSchema:
    """The events' schema, registered (its id goes in front of each event): an .avsc file registered under
    ``<input-topic>-value`` (or found in the folder), else a subject or record name, else the worker's default:
    that subject with a registry, the model's own input schema without."""
    from stream.codec.registry import reader_schema
    from stream.models.declared import declared_input_schema

    subject = f"{args.input_topic}-value"
    if args.input_schema and args.input_schema.endswith(".avsc"):
        return source.register(subject, reader_schema(source, args.input_schema, None).raw)
    if args.input_schema or args.schema_registry_url:
        return reader_schema(source, args.input_schema, subject)
    declared = declared_input_schema(args.model)
    if declared is None:
        raise ConfigError(f"no input schema: --model {args.model} declares none; pass --input-schema (an .avsc "
                          "file or a record name in the schema folder), or --schema-registry-url (the subject "
                          "<input-topic>-value)")
    return reader_schema(source, declared, None)
