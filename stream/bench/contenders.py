"""Benchmark contenders, each run as its own process: ``python -m stream.bench.contenders NAME ...``.

Each consumes the same pre-produced input topic with its own consumer group, writes to its own output
topic, and prints one JSON line: events handled, wall-clock time of its first consumed record and of its
last durable point (final commit; for faust, the last delivery acknowledgement), and the rate between.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from stream.codec import SchemaRegistry, decode, encode
from stream.models.demo import PREDICTION_SCHEMA, DemoFraudHandler

REGISTRY = SchemaRegistry.from_dir()
PREDICTION = REGISTRY.by_name(PREDICTION_SCHEMA)


def _consumer(args: argparse.Namespace) -> Consumer:
    # fetch.queue.backoff.ms as the worker sets it: with librdkafka's 1 s default, a consumer whose prefetch
    # queue filled up idles once it has drained it, until the second is over (every contender here drains
    # faster than that on Tansu, which answers fetches with several MB per partition).
    return Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "partition.assignment.strategy": "cooperative-sticky",
                     "fetch.queue.backoff.ms": 10})


def _producer(args: argparse.Namespace) -> Producer:
    return Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "compression.type": "lz4",
                     "enable.idempotence": True, "acks": "all"})


def _model(args: argparse.Namespace) -> DemoFraudHandler:
    handler = DemoFraudHandler(Path(args.model_dir))
    handler.load(torch.device("cpu"))
    return handler


def _predict_records(handler: DemoFraudHandler, values: list[bytes | None],
                     sources: list[tuple[str, int, int]]) -> list[bytes]:
    """Per-record fastavro decode, one forward pass, per-record encode: the usual hand-written shape. The
    predictions are the worker's, field for field (``sources``: each input record's topic, partition, offset)."""
    records = [decode(REGISTRY, v)[1] for v in values]
    x = torch.tensor([r["features"] for r in records], dtype=torch.float32)
    with torch.inference_mode():
        scores = handler.predict(x).numpy()
    now = int(time.time() * 1000)
    return [encode(PREDICTION, {"event_id": r["event_id"], "model_name": handler.name,
                                "model_version": handler.version, "fraud_score": float(s),
                                "is_fraud": bool(s >= 0.5), "event_ts_ms": r["ts_ms"], "predicted_ts_ms": now,
                                "batch_size": len(records), "input_topic": topic, "input_partition": partition,
                                "input_offset": offset})
            for r, s, (topic, partition, offset) in zip(records, scores, sources, strict=True)]


def _sources(msgs: list[Message]) -> list[tuple[str, int, int]]:
    return [(str(m.topic()), int(m.partition() or 0), int(m.offset() or 0)) for m in msgs]


def _values_of(size: int) -> Callable[[int], bytes]:
    """The n-th output value of ``size`` bytes: slices of a random buffer at varying offsets, so that neither lz4
    nor the broker sees the same bytes twice in a row (an embedding's floats hardly compress either)."""
    pool = np.random.default_rng(7).bytes(size * 64 + 4096)
    return lambda n: pool[(n * 61) % 4096 + (n % 64) * size:][:size]


def passthrough(args: argparse.Namespace) -> dict[str, Any]:
    """The limit: consume, produce the same bytes (or, with ``--value-bytes``, a value of that size per record, as
    big as the worker's outputs), commit after the producer flushed."""
    consumer, producer = _consumer(args), _producer(args)
    consumer.subscribe([args.input])
    value_of = _values_of(args.value_bytes) if args.value_bytes else None
    positions: dict[tuple[str, int], int] = {}
    n, first = 0, None
    next_commit = time.monotonic() + 0.5
    while n < args.events:
        for m in consumer.consume(10_000, 0.5):
            if m.error() is not None:
                continue
            first = first or time.time()
            producer.produce(args.output, value_of(n) if value_of else m.value(), m.key())
            positions[(str(m.topic()), int(m.partition() or 0))] = int(m.offset() or 0) + 1
            n += 1
        producer.poll(0)
        if time.monotonic() > next_commit and positions:
            producer.flush()
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True)
            next_commit = time.monotonic() + 0.5
    producer.flush()
    consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=False)
    last = time.time()
    consumer.close()
    return {"events": n, "first_ts": first, "last_ts": last}


def naive(args: argparse.Namespace) -> dict[str, Any]:
    """Per message: consume one, decode, infer a batch of 1, produce, flush, commit synchronously."""
    consumer, producer, handler = _consumer(args), _producer(args), _model(args)
    consumer.subscribe([args.input])
    n, first = 0, None
    while n < args.events:
        m = consumer.poll(0.5)
        if m is None or m.error() is not None:
            continue
        first = first or time.time()
        producer.produce(args.output, _predict_records(handler, [m.value()], _sources([m]))[0], m.key())
        producer.flush()
        consumer.commit(message=m, asynchronous=False)
        n += 1
    last = time.time()
    consumer.close()
    return {"events": n, "first_ts": first, "last_ts": last}


def handtuned(args: argparse.Namespace) -> dict[str, Any]:
    """consume(n) -> fastavro per record -> one forward pass -> produce -> flush -> sync commit."""
    consumer, producer, handler = _consumer(args), _producer(args), _model(args)
    consumer.subscribe([args.input])
    n, first = 0, None
    while n < args.events:
        msgs = [m for m in consumer.consume(args.batch, args.wait_ms / 1000.0) if m.error() is None]
        if not msgs:
            continue
        first = first or time.time()
        payloads = _predict_records(handler, [m.value() for m in msgs], _sources(msgs))
        for m, payload in zip(msgs, payloads, strict=True):
            producer.produce(args.output, payload, m.key())
        producer.flush()
        consumer.commit(asynchronous=False)
        n += len(msgs)
    last = time.time()
    consumer.close()
    return {"events": n, "first_ts": first, "last_ts": last}


def faust_agent(args: argparse.Namespace) -> dict[str, Any]:
    """faust-streaming: an agent with ``stream.take_events(batch, within=wait)`` (``take``'s batching, with each
    value's message for its partition and offset), same decode/infer/produce."""
    import faust

    handler = _model(args)
    app = faust.App(args.group, broker=f"kafka://{args.bootstrap}", value_serializer="raw", key_serializer="raw",
                    topic_allow_declare=False, topic_disable_leader=True, web_enabled=False,
                    producer_acks=-1, broker_commit_interval=0.5, datadir=args.data_dir)
    source = app.topic(args.input, value_serializer="raw", key_serializer="raw")
    sink = app.topic(args.output, value_serializer="raw", key_serializer="raw")
    state: dict[str, Any] = {"n": 0, "first": None, "last": None}

    @app.agent(source)
    async def infer(stream: Any) -> None:
        async for events in stream.take_events(args.batch, within=args.wait_ms / 1000.0):
            state["first"] = state["first"] or time.time()
            payloads = _predict_records(handler, [e.value for e in events],
                                        [(e.message.topic, e.message.partition, e.message.offset) for e in events])
            futures = [await sink.send(value=p) for p in payloads]
            await asyncio.gather(*futures)
            state["n"] += len(payloads)
            if state["n"] >= args.events:
                state["last"] = time.time()
                print(json.dumps({"events": state["n"], "first_ts": state["first"], "last_ts": state["last"]}),
                      flush=True)
                import os

                os._exit(0)  # faust's own shutdown takes seconds and is not what is measured

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.execute_from_commandline()
    return {"events": state["n"], "first_ts": state["first"], "last_ts": state["last"]}


CONTENDERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "passthrough": passthrough, "naive": naive, "handtuned": handtuned, "faust": faust_agent}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.contenders")
    parser.add_argument("name", choices=sorted(CONTENDERS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--wait-ms", type=float, default=20.0)
    parser.add_argument("--value-bytes", type=int, default=0,
                        help="passthrough: produce a value of this many bytes per record instead of the input's")
    parser.add_argument("--data-dir", default=None,
                        help="faust's table directory (default: its own, '<app id>-data' in the working directory)")
    args = parser.parse_args(argv)
    result = CONTENDERS[args.name](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
