"""Exactly-once against at-least-once: ``python -m stream.bench.guarantees``.

The worker at defaults drains the same pre-produced demo events under ``--guarantee at-least-once`` and
``--guarantee exactly-once`` in interleaved rounds (at-least-once first in even rounds, second in odd ones), each
a fresh consumer group and output topic on one local Apache Kafka; with ``--streams``, a Kafka Streams
``stream(in).to(out)`` pass-through (``stream/bench/jvm/StreamsPassThrough.java``) does the same under
``at_least_once`` and ``exactly_once_v2`` in each round. Prints every drain and the exactly-once / at-least-once
ratio of each round and of the medians, and writes them to ``--results`` as JSON.

Then the latency a ``read_committed`` reader pays: at each of ``--latency-loads`` (10 % and 50 % of the worker's
live at-least-once capacity, measured first as ``make bench`` does), the worker under each guarantee with a
paced load generator and a separate ``read_committed`` reader process on the output topic; per guarantee, the
p50/p99/p99.9 from an input record's append to its prediction's append (*pipeline*) and to the reader's receipt
of it (*visible*). Under at-least-once the two differ by the reader's own fetch; under exactly-once also by the
wait for the transaction's commit, so exactly-once's visible p99 minus at-least-once's at the same load is what
transactions add for such readers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stream.bench.bench_config import BenchConfig
from stream.bench.report import Drain
from stream.bench.revisions import ROOT
from stream.bench.runner import Bench

GUARANTEES = ("at-least-once", "exactly-once")


def ratios(drains: list[dict[str, Any]], contender: str) -> dict[str, Any]:
    """Per round and over the medians: the exactly-once drain rate over the at-least-once one of ``contender``."""
    rate = {(d["round"], d["guarantee"]): d["rate"] for d in drains if d["contender"] == contender}
    rounds = sorted({r for r, _ in rate})
    pairs = [rate[(r, "exactly-once")] / rate[(r, "at-least-once")] for r in rounds]
    medians = {g: statistics.median(rate[(r, g)] for r in rounds) for g in GUARANTEES}
    return {"pair_ratios": pairs, "medians": medians,
            "ratio": medians["exactly-once"] / medians["at-least-once"]}


VISIBLE_KEYS = ("load", "offered_rate", "achieved_rate", "events", "p50_ms", "p99_ms", "p999_ms",
                "visible_isolation", "visible_p50_ms", "visible_p99_ms", "visible_p999_ms", "mean_batch_size",
                "transactions", "batches_per_transaction", "cpu_cores", "broker_gc")


def visibility_steps(bench: Bench, loads: list[float], capacity: float | None,
                     worker_args: list[str]) -> dict[str, Any]:
    """The read_committed latency steps (see the module's doc), guarantees interleaved per load."""
    if capacity is None:
        print("live at-least-once capacity ...", flush=True)
        capacity = bench.live_capacity(min(bench.cfg.events, bench.cfg.live_events)).rate
    steps: list[dict[str, Any]] = []
    for i, load in enumerate(loads):
        for guarantee in GUARANTEES if i % 2 == 0 else GUARANTEES[::-1]:
            step = bench.latency(capacity, load, bench.cfg.waits_ms[0], ["--guarantee", guarantee, *worker_args],
                                 f"-{guarantee}", reader="read_committed")
            steps.append({"guarantee": guarantee, **{k: step[k] for k in VISIBLE_KEYS if k in step}})
            txns = (f", {step['transactions']:,.0f} transactions of {step['batches_per_transaction']:.2f} batches"
                    if "transactions" in step else "")
            print(f"{load:.0%} load ({step['offered_rate']:,.0f} events/s) {guarantee}: pipeline p50/p99/p99.9 "
                  f"{step['p50_ms']:.0f}/{step['p99_ms']:.0f}/{step['p999_ms']:.0f} ms, read_committed visible "
                  f"{step['visible_p50_ms']:.0f}/{step['visible_p99_ms']:.0f}/{step['visible_p999_ms']:.0f} ms"
                  f"{txns}", flush=True)
    added = {}
    for load in loads:
        by = {s["guarantee"]: s for s in steps if s["load"] == load}
        added[str(load)] = by["exactly-once"]["visible_p99_ms"] - by["at-least-once"]["visible_p99_ms"]
        print(f"{load:.0%} load: exactly-once adds {added[str(load)]:+.0f} ms to a read_committed reader's p99",
              flush=True)
    return {"capacity": capacity, "max_wait_ms": bench.cfg.waits_ms[0], "steps": steps,
            "added_visible_p99_ms": added}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.guarantees", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="drains of each guarantee, interleaved (3)")
    parser.add_argument("--streams", action="store_true",
                        help="also a Kafka Streams pass-through under both guarantees (needs a JDK and Maven)")
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--results", type=Path, default=None, help="write the drains here as JSON")
    parser.add_argument("--latency-loads", default="0.1,0.5",
                        help="fractions of the live at-least-once capacity for the read_committed latency steps, "
                             "comma-separated (0.1,0.5); empty: none")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="measured seconds per step (10)")
    parser.add_argument("--capacity", type=float, default=None,
                        help="events/s the loads are fractions of (default: measure the live capacity)")
    parser.add_argument("worker_args", nargs="*", help="extra worker flags for both guarantees (after --)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.events < 1:
        parser.error("--rounds and --events must be at least 1")
    try:
        loads = [float(x) for x in args.latency_loads.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--latency-loads: not a comma-separated list of numbers: {args.latency_loads!r}")
    if any(not 0 < x <= 1 for x in loads) or args.latency_seconds <= 0 or (args.capacity or 1) <= 0:
        parser.error("--latency-loads must be in (0, 1], --latency-seconds and --capacity positive")
    from stream.local.broker import start_kafka
    from stream.local.kafka_node import KafkaHeap
    from stream.models.demo import DEFAULT_MODEL_DIR
    from stream.models.train_demo import ensure_trained

    rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    model_dir = ensure_trained(DEFAULT_MODEL_DIR)
    if args.streams:  # resolved and compiled before any timing
        from stream.bench.jvm import ensure_compiled

        ensure_compiled()
    broker = None if args.bootstrap_servers else start_kafka(heap=KafkaHeap.for_benchmark())
    bench: Bench | None = None
    try:
        bootstrap = args.bootstrap_servers or broker.bootstrap  # type: ignore[union-attr]
        bench = Bench(bootstrap, BenchConfig(events=args.events, latency_seconds=args.latency_seconds), model_dir,
                      broker.pid if broker is not None else None, broker.gc_log if broker is not None else None)
        bench.prepare()
        drains: list[dict[str, Any]] = []

        def record(r: int, contender: str, guarantee: str, drain: Drain) -> None:
            drains.append({"round": r, "contender": contender, "guarantee": guarantee, "events": drain.events,
                           "seconds": drain.seconds, "rate": drain.rate, "mean_batch_size": drain.mean_batch_size,
                           "transactions": drain.transactions})
            txns = f", {drain.transactions:,} transactions" if drain.transactions else ""
            print(f"round {r} {contender} {guarantee}: {drain.events:,} events in {drain.seconds:.2f} s, "
                  f"{drain.rate:,.0f} events/s{txns}", flush=True)

        for r in range(args.rounds):
            order = GUARANTEES if r % 2 == 0 else GUARANTEES[::-1]
            for guarantee in order:
                name = f"worker-{guarantee}-{r}"
                record(r, "worker", guarantee,
                       bench.worker_drain(name, ["--guarantee", guarantee, *args.worker_args]))
            if args.streams:
                for guarantee in order:
                    record(r, "kafka-streams", guarantee, bench.jvm_contender(
                        f"streams-{guarantee}-{r}", "StreamsPassThrough", "--guarantee", guarantee))
        report: dict[str, Any] = {
            "method": f"{args.rounds} interleaved rounds of drains of {args.events:,} pre-produced demo events on "
                      "one local Apache Kafka, a fresh group and output topic each; the worker at defaults with "
                      "--stop-at-end (timed from its first consumed record to its last commit)"
                      + ("; Kafka Streams stream(in).to(out), one stream thread" if args.streams else ""),
            "revision": rev, "worker_args": args.worker_args, "drains": drains,
            "kafka_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("KAFKA_")},
            "worker": ratios(drains, "worker"), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if args.streams:
            report["kafka-streams"] = ratios(drains, "kafka-streams")
        if loads:
            report["visibility"] = visibility_steps(bench, loads, args.capacity, args.worker_args)
        for contender in ("worker", "kafka-streams") if args.streams else ("worker",):
            c = report[contender]
            print(f"{contender}: median at-least-once {c['medians']['at-least-once']:,.0f} events/s, exactly-once "
                  f"{c['medians']['exactly-once']:,.0f}: exactly-once / at-least-once {c['ratio']:.2f} (rounds "
                  + ", ".join(f"{x:.2f}" for x in c["pair_ratios"]) + ")", flush=True)
        if args.results is not None:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    except BaseException:
        if bench is not None:
            print(f"worker logs kept in {bench.work}", file=sys.stderr)
        raise
    finally:
        if broker is not None:
            broker.stop()
        if bench is not None:
            shutil.rmtree(bench.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
