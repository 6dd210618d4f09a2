"""``python -m stream compare``: two output topics (a baseline and a shadow run of a new model version) joined by
input lineage, and how far they agree.

Both topics are read from their beginning to the end offsets they had when the command started
(``read_committed``). A prediction's lineage is the input record it answers: its ``input_topic``,
``input_partition``, ``input_offset`` fields (prediction schemas from version 2 on), else its ``stream.input.*``
headers. For every lineage in both, each field the two records share is compared, but for what tells the runs
apart (model name and version, the prediction time, the batch size, the lineage itself): numbers within
``--tolerance`` (absolute), float vectors (embeddings) by cosine similarity at least ``--min-cosine``, anything
else for equality. The report: how many records each side has and how many joined, the share of joined records
on which every field agrees (and per field), the mean and largest difference of each number, the least cosine,
each side's latency (``predicted_ts_ms - event_ts_ms``) p50/p99, and, given their dead-letter topics, the
lineages dead-lettered on one side and predicted on the other. ``--min-agreement`` turns it into a check (exit 1
below it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream.codec.registry import WireDecoder, open_source
from stream.errors import ConfigError, StreamError
from stream.kafka.records import MESSAGES_A_CONSUME
from stream.kafka.topics import end_offsets
from stream.ops.verify import headers_of, input_source

IGNORED = frozenset({"model_name", "model_version", "predicted_ts_ms", "batch_size", "input_topic",
                     "input_partition", "input_offset"})
Lineage = tuple[str, int, int]


def drop_read_to_end(consumer: Consumer, topic: str, todo: dict[int, int]) -> None:
    """Take out of ``todo`` ({partition: its end offset}) the partitions whose position has reached their end: a
    transaction's control record or aborted records can end a partition without a record at end - 1."""
    for tp in consumer.position([TopicPartition(topic, p) for p in list(todo)]):
        if tp.offset >= 0 and tp.offset >= todo.get(tp.partition, math.inf):
            todo.pop(tp.partition, None)


def read_topic(bootstrap: str, topic: str, config: dict[str, Any] | None = None,
               timeout_s: float = 120.0) -> Iterator[tuple[bytes | None, dict[str, bytes]]]:
    """(value, headers) of every record of ``topic`` up to the end offsets it had at the call."""
    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({**(config or {}), "bootstrap.servers": bootstrap, "group.id": f"compare-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        todo = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise StreamError(f"{topic}: not read to its end offsets within {timeout_s:.0f} s "
                                  f"(partitions left: {sorted(todo)})")
            for msg in consumer.consume(MESSAGES_A_CONSUME, 0.5):
                if msg.error() is not None:
                    continue
                p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                if p in todo and offset < todo[p]:
                    yield msg.value(), headers_of(msg)
                if p in todo and offset + 1 >= todo[p]:
                    del todo[p]
            drop_read_to_end(consumer, topic, todo)
    finally:
        consumer.close()


@dataclass
class Side:
    topic: str
    records: dict[Lineage, dict[str, Any]] = field(default_factory=dict)
    duplicates: int = 0
    dead: set[Lineage] = field(default_factory=set)

    def latency_ms(self) -> list[float]:
        return [float(r["predicted_ts_ms"]) - float(r["event_ts_ms"]) for r in self.records.values()
                if "predicted_ts_ms" in r and "event_ts_ms" in r]


def load_side(bootstrap: str, topic: str, decode: WireDecoder, dlq: str | None) -> Side:
    side = Side(topic)
    for value, headers in read_topic(bootstrap, topic):
        if value is None:
            continue
        record = decode(value)
        lineage = input_source(record, headers)
        if lineage in side.records:
            side.duplicates += 1
        side.records[lineage] = record
    if dlq:
        side.dead = {input_source({}, headers) for _value, headers in read_topic(bootstrap, dlq)}
    return side


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / norm) if norm > 0 else float(np.array_equal(x, y))


def compare(baseline: Side, candidate: Side, tolerance: float, min_cosine: float) -> dict[str, Any]:
    joined = sorted(baseline.records.keys() & candidate.records.keys())
    fields: dict[str, dict[str, Any]] = {}
    agree_all = 0
    for lineage in joined:
        a, b = baseline.records[lineage], candidate.records[lineage]
        every = True
        for name in sorted((a.keys() & b.keys()) - IGNORED):
            x, y = a[name], b[name]
            stats = fields.setdefault(name, {"compared": 0, "agree": 0})
            stats["compared"] += 1
            if isinstance(x, list) and isinstance(y, list) and all(isinstance(v, float | int) for v in x + y):
                cos = _cosine(x, y) if len(x) == len(y) else -1.0
                ok = cos >= min_cosine
                stats["min_cosine"] = min(stats.get("min_cosine", 1.0), cos)
                stats["_cos_sum"] = stats.get("_cos_sum", 0.0) + cos
            elif isinstance(x, float | int) and isinstance(y, float | int) and not isinstance(x, bool):
                diff = abs(float(x) - float(y))
                ok = diff <= tolerance
                stats["max_abs_diff"] = max(stats.get("max_abs_diff", 0.0), diff)
                stats["_diff_sum"] = stats.get("_diff_sum", 0.0) + diff
            else:
                ok = x == y
            stats["agree"] += ok
            every = every and ok
        agree_all += every
    for stats in fields.values():
        n = stats["compared"]
        stats["agreement"] = stats["agree"] / n if n else None
        if "_diff_sum" in stats:
            stats["mean_abs_diff"] = stats.pop("_diff_sum") / n
        if "_cos_sum" in stats:
            stats["mean_cosine"] = stats.pop("_cos_sum") / n

    def side(s: Side) -> dict[str, Any]:
        lat = s.latency_ms()
        return {"topic": s.topic, "records": len(s.records), "duplicates": s.duplicates,
                "only_here": len(s.records.keys() - (baseline.records.keys() & candidate.records.keys())),
                "latency_ms": {"p50": float(np.percentile(lat, 50)) if lat else None,
                               "p99": float(np.percentile(lat, 99)) if lat else None},
                "dead_letters": len(s.dead)}

    return {"baseline": side(baseline), "candidate": side(candidate), "joined": len(joined),
            "agreement": agree_all / len(joined) if joined else None, "fields": fields,
            "tolerance": tolerance, "min_cosine": min_cosine,
            "dead_here_predicted_there": {
                "baseline": len(baseline.dead & candidate.records.keys()),
                "candidate": len(candidate.dead & baseline.records.keys())}}


def format_report(report: dict[str, Any]) -> str:
    b, c = report["baseline"], report["candidate"]
    agreement = report["agreement"]
    lines = [f"baseline  {b['topic']}: {b['records']:,} predictions ({b['only_here']:,} not in the candidate), "
             f"{b['dead_letters']:,} dead letters, latency p50/p99 {_ms(b['latency_ms'])}",
             f"candidate {c['topic']}: {c['records']:,} predictions ({c['only_here']:,} not in the baseline), "
             f"{c['dead_letters']:,} dead letters, latency p50/p99 {_ms(c['latency_ms'])}",
             f"joined by input lineage: {report['joined']:,}; every field agrees on "
             + ("-" if agreement is None else f"{agreement:.4%}")
             + f" (numbers within {report['tolerance']:g}, vectors at cosine >= {report['min_cosine']:g})"]
    for name, s in sorted(report["fields"].items()):
        extra = ""
        if "max_abs_diff" in s:
            extra = f", mean |diff| {s['mean_abs_diff']:.3g}, max {s['max_abs_diff']:.3g}"
        if "min_cosine" in s:
            extra = f", mean cosine {s['mean_cosine']:.6f}, min {s['min_cosine']:.6f}"
        lines.append(f"  {name}: {s['agreement']:.4%} agree{extra}")
    dead = report["dead_here_predicted_there"]
    if b["dead_letters"] or c["dead_letters"]:
        lines.append(f"dead-lettered in the baseline but predicted by the candidate: {dead['baseline']:,}; "
                     f"the other way: {dead['candidate']:,}")
    return "\n".join(lines)


def _ms(lat: dict[str, float | None]) -> str:
    return "-" if lat["p50"] is None else f"{lat['p50']:.0f}/{lat['p99']:.0f} ms"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser("compare", help="join two output topics by input lineage and report how they agree "
                                       "(a shadow run of a new model version against its baseline)")
    c.add_argument("baseline", help="the baseline's output topic")
    c.add_argument("candidate", help="the candidate's (shadow) output topic")
    c.add_argument("--bootstrap-servers", required=True, help="the brokers (host:port,...)")
    c.add_argument("--tolerance", type=float, default=1e-6, help="numbers agree within this (absolute; 1e-6)")
    c.add_argument("--min-cosine", type=float, default=0.9999, help="vectors agree at this cosine or more")
    c.add_argument("--baseline-dlq", default=None, help="the baseline's dead-letter topic")
    c.add_argument("--candidate-dlq", default=None, help="the candidate's dead-letter topic")
    c.add_argument("--schema-registry-url", default=None, help="where the writer schemas are (else schemas/)")
    c.add_argument("--schemas-dir", type=Path, default=None,
                   help="schema folder when no registry is given (default: the repo's schemas/)")
    c.add_argument("--min-agreement", type=float, default=None,
                   help="exit 1 when fewer joined records than this share agree on every field (or none joined)")
    c.add_argument("--json", type=Path, default=None, help="also write the report here")


def run(args: argparse.Namespace) -> int:
    if args.tolerance < 0 or not -1.0 <= args.min_cosine <= 1.0:
        raise ConfigError("--tolerance must be >= 0 and --min-cosine within [-1, 1]")
    if args.baseline == args.candidate:
        raise ConfigError("the baseline and the candidate are the same topic")
    source = open_source(args.schema_registry_url, args.schemas_dir)
    try:
        decode = WireDecoder(source)
        baseline = load_side(args.bootstrap_servers, args.baseline, decode, args.baseline_dlq)
        candidate = load_side(args.bootstrap_servers, args.candidate, decode, args.candidate_dlq)
    finally:
        source.close()
    report = compare(baseline, candidate, args.tolerance, args.min_cosine)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.min_agreement is not None and (report["agreement"] is None or report["agreement"] < args.min_agreement):
        print(f"agreement below --min-agreement {args.min_agreement}", file=sys.stderr)
        return 1
    return 0
