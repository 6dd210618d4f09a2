"""``python -m stream read``: a topic's records as JSON lines, like ``kafka-avro-console-consumer``.

Each line is one record: its value decoded by its writer schema (the schema registry's with
``--schema-registry-url``, else the schema folder), its key, headers, partition, offset and timestamp. A value that
is not in the Confluent wire format, or whose schema is unknown, is printed as ``null`` with ``error`` saying why
(the line goes on). Avro ``bytes`` are written as Avro's JSON encoding writes them (one code point per byte); a
header or key that is not UTF-8 keeps its bytes as ``\\xNN`` escapes.

No consumer group is joined and nothing is committed: the partitions are assigned. Without ``--follow`` it stops at
the end offsets the topic had when it started; ``--from-beginning`` starts at each partition's first record, else at
its end (so a read without either prints nothing and says so). Records of aborted transactions are left out unless
``--isolation read_uncommitted``. A batch librdkafka cannot decompress is skipped, saying which offsets it held
(`stream.kafka.unreadable`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, Message, TopicPartition

from stream.codec.registry import WireDecoder, open_source
from stream.errors import ConfigError, StreamError
from stream.kafka.records import MESSAGES_A_CONSUME
from stream.kafka.topics import end_offsets, partitions_of
from stream.kafka.unreadable import READ_WITH, UNREADABLE_CODES, batch_end, probe_config
from stream.kafka_env import kafka_admin_env_config, kafka_env_config
from stream.ops.compare import drop_read_to_end

STALL_S = 60.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("read", help="print a topic's records (predictions, dead letters, events) as JSON lines",
                       description="Print a topic's records as JSON lines: the value decoded by its schema, with "
                                   "key, headers, partition, offset and timestamp. Joins no group, commits nothing.")
    r.add_argument("--bootstrap-servers", required=True, help="the brokers (host:port,...)")
    r.add_argument("--topic", required=True, help="the topic to read")
    r.add_argument("--from-beginning", action="store_true",
                   help="start at each partition's first record (default: at its end)")
    r.add_argument("--max", type=int, default=None, metavar="N", help="stop after N records")
    r.add_argument("--follow", action="store_true",
                   help="keep reading new records until Ctrl-C (default: stop at the end offsets seen at start)")
    r.add_argument("--isolation", choices=("read_committed", "read_uncommitted"), default="read_committed",
                   help="read_committed (default) leaves out records of aborted and open transactions")
    r.add_argument("--partition", type=int, action="append", default=None,
                   help="read only this partition (repeatable; default: all)")
    r.add_argument("--schema-registry-url", default=os.environ.get("SCHEMA_REGISTRY_URL"),
                   help="where the writer schemas are (SCHEMA_REGISTRY_URL; else --schemas-dir)")
    r.add_argument("--schemas-dir", type=Path, default=None, help="the schema folder (default: the repository's)")


def _text(raw: bytes | str | None) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    return raw.decode("utf-8", errors="backslashreplace")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")  # Avro's JSON encoding of bytes: one code point per byte
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf": JSON has no such numbers
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def line_of(msg: Message, decode: WireDecoder) -> dict[str, Any]:
    """One record as the dict printed for it."""
    raw = msg.value()
    out: dict[str, Any] = {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}
    kind, ts = msg.timestamp()
    out["timestamp_ms"] = ts if kind else None
    out["key"] = _text(msg.key())
    out["headers"] = {k: _text(v) for k, v in msg.headers() or []}  # type: ignore[str-unpack]
    if raw is None:
        out["value"] = None
    else:
        try:
            out["value"] = _jsonable(decode(raw))
        except (StreamError, ValueError, EOFError, IndexError, TypeError) as exc:
            out["value"] = None
            out["error"] = f"the value ({len(raw)} bytes) was not decoded: {exc}"
    return out


def read(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    """Print the records; the count printed."""
    if args.max is not None and args.max < 1:
        raise ConfigError(f"--max must be at least 1, not {args.max}")
    consumer_env, _ = kafka_env_config(os.environ)
    partitions = partitions_of(args.bootstrap_servers, args.topic, kafka_admin_env_config(os.environ))
    chosen = sorted(partitions) if args.partition is None else sorted(set(args.partition))
    missing = [p for p in chosen if p not in partitions]
    if missing:
        raise ConfigError(f"topic {args.topic} has no partition {missing[0]} (it has {len(partitions)})")
    if not args.follow and not args.from_beginning:
        print(f"read: nothing to print: without --from-beginning reading starts at the end of {args.topic}, and "
              "without --follow it stops there", file=sys.stderr)
        return 0
    todo: dict[int, int] = {}  # without --follow: where each partition stops (its end offset now)
    if not args.follow:
        ends = end_offsets(args.bootstrap_servers, args.topic, client_config=consumer_env)
        todo = {p: ends[p] for p in chosen if ends.get(p, 0) > 0}
        if not todo:
            return 0
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    source = open_source(args.schema_registry_url, args.schemas_dir)
    conf = {**consumer_env, "bootstrap.servers": args.bootstrap_servers, "group.id": f"stream-read-{uuid.uuid4()}",
            "enable.auto.commit": False, "isolation.level": args.isolation}
    consumer = Consumer(conf)
    printed = 0
    progress_at = time.monotonic()  # without --follow, a read that stops getting anywhere ends with an error
    try:
        decode = WireDecoder(source)
        consumer.assign([TopicPartition(args.topic, p, start) for p in (chosen if args.follow else todo)])
        skipped: dict[int, int] = {}  # partition: where reading went on after a batch it could not read
        while args.follow or todo:
            for msg in consumer.consume(MESSAGES_A_CONSUME, 0.5):
                error = msg.error()
                at = msg.offset()
                if error is not None and error.code() in UNREADABLE_CODES and at is not None and at >= 0:
                    p, base = int(msg.partition() or 0), at
                    if base >= skipped.get(p, 0):
                        last = batch_end(lambda: Consumer(probe_config(conf)), args.topic, p, base)
                        print(f"read: {args.topic}[{p}] offsets {base}-{last} skipped: {error.str()} ({READ_WITH})",
                              file=sys.stderr)
                        skipped[p] = last + 1
                        consumer.seek(TopicPartition(args.topic, p, last + 1))
                        if p in todo and last + 1 >= todo[p]:
                            del todo[p]
                        progress_at = time.monotonic()
                    continue
                if error is not None:
                    if error.fatal() or not error.retriable():
                        print(f"read: {error.str()}", file=sys.stderr)
                    continue
                p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                if not args.follow:
                    if p not in todo or offset >= todo[p]:
                        continue
                    if offset + 1 >= todo[p]:
                        del todo[p]
                out.write(json.dumps(line_of(msg, decode), ensure_ascii=False) + "\n")
                printed += 1
                progress_at = time.monotonic()
                if args.max is not None and printed >= args.max:
                    out.flush()
                    return printed
            out.flush()
            if todo:
                drop_read_to_end(consumer, args.topic, todo)
                if todo and time.monotonic() - progress_at > STALL_S:
                    raise StreamError(f"reading {args.topic}: no record for {STALL_S:.0f} s, partitions "
                                      f"{sorted(todo)} not read to the end offsets they had at the start")
    except KafkaException as exc:
        raise StreamError(f"reading {args.topic}: {exc}") from exc
    finally:
        consumer.close()
        source.close()
    return printed


def run(args: argparse.Namespace) -> int:
    try:
        read(args)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `stream read ... | head`
        sys.stderr.close()
    return 0

