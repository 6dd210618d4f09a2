"""``python -m stream.bench.gateway``: callers through the gateway against the pipeline's own latency, same run.

One broker, one worker (``--batch-policy fixed``: batches closed by count or ``--max-wait-ms`` after their first
record, so that batching shows), one gateway per event loop in ``--loops`` (each reading its own reply partition;
the rates take turns between them, ``--rounds`` times, so the loops are compared in one run), and callers
(`stream.bench.callers`: an open loop at a set rate, each event's ``ts_ms`` the time it is sent). A reader of the
output topic (``read_committed``) times when each prediction becomes readable there. Per steady rate:

* **HTTP**: from sending the request to having the answer, p50/p99;
* **pipeline**: from sending the request to its prediction readable in the output topic (what a downstream
  consumer sees: the event → prediction latency, with the gateway's way in included and its way out not);
* **gateway's cost**, the target being ≤ 5 ms at p99: HTTP's p99 over the pipeline's p99 (the issue's measure), and
  the stricter per-request one, HTTP minus pipeline request by request: the reply's way back (reply copy, the
  gateway's read, the answer) against the output topic's way to its reader;
* **two readers**: a second reader of the output topic in a process of its own; per prediction, when it read it
  minus when the first reader did. Its p99 is what the per-request cost would show for a gateway that added
  nothing: one more reader of records produced at the same moment, on the same busy cores;
* the mean batch size of the predictions (their ``batch_size`` field);
* the garbage collector's pauses during the cell, in the gateway (from its ``/metrics``) and in the callers'
  process.

Then a **burst** beyond capacity, against a worker whose (simulated) device takes a set time a record, so that the
worker is the bound as a real model's would be: the statuses (503 once ``--max-pending`` are waiting), and the
answered requests' p99 against the timeout.

Then **OpenAI's route**: the same texts at the same rates through ``/v1/predict`` (a ``stream.demo.TextEvent`` as
JSON) and ``/v1/embeddings`` (``{"model", "input": text}``, the SDK's default base64 answer) of one gateway,
taking turns, in front of one worker whose model is MiniLM's host path with a free device
(`stream.bench.simulated.SimulatedDevice`, 0 ns a token: its tokenizing and 384-float answers, no arithmetic), so
that what differs is the route: the text made an event, the answer in the API's shape. Per rate: each route's HTTP
p50/p99 and the differences.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from producers.events import generate_events
from stream.bench.arrivals import ArrivalClock, SecondReader, gateway_gc
from stream.bench.callers import Answer, call_at_rate
from stream.kafka.topics import create_topics
from stream.local.broker import free_port, start_broker
from stream.local.children import WorkerProcess
from stream.models.demo import (
    DEFAULT_MODEL_DIR,
    EVENT_SCHEMA,
    TEXT_COPY_FIELDS,
    TEXT_EMBEDDING_SCHEMA,
    TEXT_EVENT_SCHEMA,
)
from stream.models.train_demo import ensure_trained
from stream.ops.gc_pauses import GcPauses, pauses_between

PARTITIONS = 4


def demo_events(count: int, seed: int) -> list[dict[str, Any]]:
    block = generate_events(count, seed=seed)
    return [{"event_id": e, "key": k, "ts_ms": 0, "features": [float(x) for x in f]}
            for e, k, f in zip(block.event_ids, block.keys, block.features, strict=True)]


def _pct(values: list[float] | np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def steady_figures(answers: list[Answer], arrived: dict[str, float], rate: float,
                   second: dict[str, float] | None = None) -> dict[str, Any]:
    """A steady cell's figures; ``arrived``: when the reader read each prediction, ``second``: when the second
    reader did."""
    ok = [a for a in answers if a.status == 200]
    http = [a.seconds * 1000.0 for a in ok]
    timed = [(a.seconds * 1000.0, arrived[a.event["event_id"]] - a.sent_ms) for a in ok
             if a.event["event_id"] in arrived]
    pipeline = [p for _, p in timed]
    cost = [h - p for h, p in timed]
    http_p99, pipeline_p99 = _pct(http, 99), _pct(pipeline, 99)
    readers = [second[i] - arrived[i] for i in (a.event["event_id"] for a in ok)
               if i in arrived and second is not None and i in second]
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    return {"rate": rate, "requests": len(answers), "statuses": statuses,
            "http_ms": {"p50": _pct(http, 50), "p99": _pct(http, 99)},
            "pipeline_ms": {"p50": _pct(pipeline, 50), "p99": _pct(pipeline, 99), "timed": len(timed)},
            "gateway_cost_ms": {"p50": _pct(cost, 50), "p99": _pct(cost, 99),
                                "p99_over_p99": None if http_p99 is None or pipeline_p99 is None
                                else http_p99 - pipeline_p99},
            "second_reader_ms": {"p50": _pct(readers, 50), "p99": _pct(readers, 99), "timed": len(readers)},
            "mean_batch_size": float(np.mean([a.body["batch_size"] for a in ok])) if ok else None,
            "callers_waited_for_a_connection_max_ms": max((a.waited_s for a in answers), default=0.0) * 1000.0}


def burst_figures(answers: list[Answer], timeout_ms: float, rate: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    answered = [a.seconds * 1000.0 for a in answers if a.status == 200]
    refused = [a.seconds * 1000.0 for a in answers if a.status == 503]
    return {"rate": rate, "requests": len(answers), "statuses": statuses, "timeout_ms": timeout_ms,
            "answered_ms": {"p50": _pct(answered, 50), "p99": _pct(answered, 99), "max": max(answered, default=None)},
            "refused_ms": {"p50": _pct(refused, 50), "p99": _pct(refused, 99)}}


@contextmanager
def pipeline(bootstrap: str, work: Path, args: argparse.Namespace, tag: str, max_pending: int,
             worker_extra: tuple[str, ...] = (), worker_env: dict[str, str] | None = None,
             loops: tuple[str, ...] = ("auto",), gateway_extra: tuple[str, ...] = ("--input-schema", EVENT_SCHEMA),
             probe: list[dict[str, Any]] | None = None) -> Iterator[tuple[list[int], str]]:
    """(the gateways' ports, one per event loop, and the output topic) of a worker and its gateways on topics of
    their own, both run from ``args.tree`` (None: this checkout); ``probe``: the event that shows them answering (a
    demo event)."""
    procs: list[WorkerProcess] = []
    gateway_extra = gateway_flags_known(args.tree, gateway_extra)
    try:
        run = f"{tag}-{int(time.time())}"
        topics = {"input": f"gw-in-{run}", "output": f"gw-out-{run}"}
        create_topics(bootstrap, topics.values(), PARTITIONS)
        model_dir = ensure_trained(DEFAULT_MODEL_DIR)
        procs.append(WorkerProcess(
            ["--bootstrap-servers", bootstrap, "--input-topic", topics["input"], "--output-topic",
             topics["output"], "--group-id", f"gw-{run}", "--model-dir", str(model_dir), "--batch-policy", "fixed",
             "--max-wait-ms", str(args.max_wait_ms), "--max-batch-size", str(args.max_batch_size),
             "--guarantee", args.guarantee, *worker_extra], work / f"worker-{tag}.log", worker_env, cwd=args.tree))
        ports = [free_port() for _ in loops]
        for i, (port, loop) in enumerate(zip(ports, loops, strict=True)):
            procs.append(WorkerProcess(
                ["--bootstrap-servers", bootstrap, "--input-topic", topics["input"], "--port", str(port),
                 "--timeout-ms", str(args.timeout_ms), "--max-pending", str(max_pending), "--loop", loop,
                 "--reply-partition", str(i), *gateway_extra],
                work / f"gateway-{tag}-{i}.log", command="gateway", cwd=args.tree))
        for port in ports:
            _wait_answering(port, procs, work, probe or demo_events(1, seed=0))
        yield ports, topics["output"]
    finally:
        for p in procs:
            p.terminate(30)


@contextmanager
def frozen_callers() -> Iterator[GcPauses]:
    """This process's heap collected and frozen (the callers' and the readers': a full collection walked torch's
    objects, holding back every answer and arrival it overlapped), and its collector's pauses timed meanwhile."""
    gc.collect()
    gc.freeze()
    pauses = GcPauses("bench")
    try:
        yield pauses
    finally:
        pauses.close()


def with_pauses(port: int, callers: GcPauses,
                calls: Coroutine[Any, Any, list[Answer]]) -> tuple[list[Answer], dict[str, Any]]:
    """``calls``' answers (run here), and the collector's pauses meanwhile in the gateway on ``port`` and in the
    callers."""
    before = gateway_gc(port), callers.snapshot()
    answers = asyncio.run(calls)
    after = gateway_gc(port), callers.snapshot()
    return answers, {"gateway": pauses_between(before[0], after[0]), "callers": pauses_between(before[1], after[1])}


def gateway_flags_known(tree: Path | None, flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` less those (with their values) that the gateway at ``tree`` does not have (an older revision's, in
    the A/B: ``--max-connections`` came with its cap); all of them for this checkout's."""
    if tree is None:
        return flags
    known = _gateway_flags(tree)
    kept: list[str] = []
    for i, flag in enumerate(flags):
        if flag.startswith("--") and flag not in known:
            print(f"bench-gateway: the gateway at {tree} has no {flag}: left out", flush=True)
        elif not (i and flags[i - 1].startswith("--") and flags[i - 1] not in known):
            kept.append(flag)
    return tuple(kept)


@functools.cache
def _gateway_flags(tree: Path) -> frozenset[str]:
    """The flags ``python -m stream gateway --help`` of the checkout at ``tree`` lists (read once a run)."""
    helped = subprocess.run([sys.executable, "-m", "stream", "gateway", "--help"], cwd=tree, capture_output=True,
                            text=True, check=True).stdout
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", helped))


def _wait_answering(port: int, procs: list[WorkerProcess], work: Path, probe: list[dict[str, Any]],
                    timeout_s: float = 120.0) -> None:
    """Until one event is answered (the worker has its partitions, the gateway reads its replies)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.log_path.name} exited:\n{p.output()[-3000:]}")
        try:
            answers = asyncio.run(call_at_rate("127.0.0.1", port, probe, rate=1.0))
            if answers[0].status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer within {timeout_s:.0f} s; logs in {work}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from stream.bench.processes import versions

    work = Path(tempfile.mkdtemp(prefix="stream-bench-gateway-"))
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "results"}
    report: dict[str, Any] = {"config": config,
                              "versions": versions(args.broker), "steady": []}
    broker = start_broker(args.broker)
    try:
        with pipeline(broker.bootstrap, work, args, "steady", args.max_pending,
                      loops=tuple(args.loops)) as (ports, output):
            clock = ArrivalClock(broker.bootstrap, output, PARTITIONS)
            second = SecondReader(broker.bootstrap, output, PARTITIONS)
            try:
                with frozen_callers() as callers_gc:
                    # Warm-up: each gateway at each rate for a few seconds. With 2 s at 100/s only, the first cell at
                    # each rate (always the first loop's, in round 1) had the per-request cost's worst p99 in every
                    # run (docs/gateway.md).
                    for rate in args.rates:
                        for port in ports:
                            asyncio.run(call_at_rate("127.0.0.1", port, demo_events(int(rate * args.warmup_seconds),
                                                                                    seed=1), rate=rate))
                    seed = 10
                    gateways = list(zip(ports, args.loops, strict=True))
                    for r in range(args.rounds):
                        # Each round starts with the other loop, so neither always follows the same one.
                        order = gateways[::-1] if r % 2 else gateways
                        for rate in args.rates:
                            for port, loop in order:
                                seed += 1
                                events = demo_events(int(rate * args.seconds), seed=seed)
                                print(f"bench-gateway: round {r + 1}, {len(events)} callers at {rate:,.0f}/s, "
                                      f"gateway on {loop} ...", flush=True)
                                answers, pauses = with_pauses(port, callers_gc,
                                                              call_at_rate("127.0.0.1", port, events, rate=rate))
                                ok = [a.event["event_id"] for a in answers if a.status == 200]
                                clock.wait_for(set(ok), 30.0)
                                report["steady"].append({
                                    "round": r + 1, "loop": loop, **steady_figures(answers, clock.arrived, rate,
                                                                                  second.arrivals(ok)),
                                    "gc_pauses": pauses})
            finally:
                second.close()
                clock.close()
        # The burst: a worker on a slower (simulated) device, so that it, not the gateway, is the bound.
        env = {"BENCH_SIM_MS_PER_RECORD": str(args.burst_device_ms_per_record)}
        with pipeline(broker.bootstrap, work, args, "burst", args.burst_max_pending,
                      ("--model", "stream.bench.simulated:DelayedDemo"), env, (args.loops[0],),
                      ("--input-schema", EVENT_SCHEMA, "--max-connections", str(args.burst_connections + 100))
                      ) as (ports, _):
            port = ports[0]
            events = demo_events(int(args.burst_rate * args.burst_seconds), seed=99)
            print(f"bench-gateway: burst of {len(events)} callers at {args.burst_rate:,.0f}/s, the worker's "
                  f"device taking {args.burst_device_ms_per_record} ms a record ...", flush=True)
            # Frozen again (the steady cells' answers are new objects): unfrozen, a full collection in this process
            # stalled every caller 170-460 ms mid-burst here, and the refusals' p99 measured the callers.
            with frozen_callers() as callers_gc:
                answers, pauses = with_pauses(port, callers_gc, call_at_rate(
                    "127.0.0.1", port, events, rate=args.burst_rate, connections=args.burst_connections))
            report["burst"] = burst_figures(answers, args.timeout_ms, args.burst_rate)
            report["burst"].update(device_ms_per_record=args.burst_device_ms_per_record,
                                   max_pending=args.burst_max_pending, gc_pauses=pauses)
        if args.openai_rounds:
            report["openai"] = openai_section(broker.bootstrap, work, args)
    finally:
        broker.stop()
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(report, indent=1))
    return report


SERVED = "free-model"  # the simulated device's name (stream.bench.simulated.SimulatedDevice, 0 ns a token)


def text_events(count: int, seed: int) -> list[dict[str, Any]]:
    from producers.texts import generate_texts

    block = generate_texts(count, seed=seed)
    return [{"event_id": f"t{seed}-{i}", "key": f"k{i % 100}", "ts_ms": 0, "text": t}
            for i, t in enumerate(block.texts)]


def openai_section(bootstrap: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The same texts at the same rates through /v1/predict and /v1/embeddings of one gateway (see the module's
    docstring): per rate and round, each route's HTTP p50/p99."""
    from stream.bench.simulated import write_spec

    spec = write_spec(work / "free-model.json", 0.0)
    model = "stream.bench.simulated:SimulatedDevice"
    worker = ("--model", model, "--model-dir", str(spec), "--input-schema", TEXT_EVENT_SCHEMA, "--output-schema",
              TEXT_EMBEDDING_SCHEMA, "--copy-fields", TEXT_COPY_FIELDS)
    gateway = ("--model", model, "--input-schema", TEXT_EVENT_SCHEMA, "--served-model-name", SERVED)
    routes = {"predict": ("/v1/predict", None),
              "embeddings": ("/v1/embeddings", lambda e: {"model": SERVED, "input": e["text"],
                                                         "encoding_format": "base64"})}
    cells: list[dict[str, Any]] = []
    with pipeline(bootstrap, work, args, "openai", args.max_pending, worker, loops=("asyncio",),
                  gateway_extra=gateway, probe=text_events(1, seed=0)) as (ports, _):
        port = ports[0]
        for rate in args.rates:  # warm-up, each route
            for path, body in routes.values():
                asyncio.run(call_at_rate("127.0.0.1", port, text_events(int(rate * args.warmup_seconds), seed=1),
                                         rate=rate, path=path, body=body))
        seed = 100
        for r in range(args.openai_rounds):
            order = list(routes.items())[::-1] if r % 2 else list(routes.items())
            for rate in args.rates:
                for name, (path, body) in order:
                    seed += 1
                    texts = text_events(int(rate * args.seconds), seed=seed)
                    print(f"bench-gateway: openai round {r + 1}, {len(texts)} texts at {rate:,.0f}/s through "
                          f"{path} ...", flush=True)
                    answers = asyncio.run(call_at_rate("127.0.0.1", port, texts, rate=rate, path=path, body=body))
                    ok = [a.seconds * 1000.0 for a in answers if a.status == 200]
                    statuses: dict[str, int] = {}
                    for a in answers:
                        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
                    cells.append({"round": r + 1, "rate": rate, "route": name, "requests": len(answers),
                                  "statuses": statuses, "http_ms": {"p50": _pct(ok, 50), "p99": _pct(ok, 99)}})
    by_rate = []
    for rate in args.rates:
        mine = {route: [c for c in cells if c["rate"] == rate and c["route"] == route] for route in routes}
        figures = {route: {q: float(np.median([c["http_ms"][q] for c in cs if c["http_ms"][q] is not None]))
                           for q in ("p50", "p99")} for route, cs in mine.items()}
        by_rate.append({"rate": rate, **figures, "embeddings_minus_predict_ms": {
            q: figures["embeddings"][q] - figures["predict"][q] for q in ("p50", "p99")}})
    return {"cells": cells, "by_rate": by_rate, "rounds": args.openai_rounds}


def format_report(report: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = ["| round | loop | rate/s | requests | mean batch | HTTP p50 / p99 ms | pipeline p50 / p99 ms "
             "| gateway's cost: p99 over p99 ms | per request p50 / p99 ms | two readers p50 / p99 ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in report["steady"]:
        lines.append(f"| {s.get('round', 1)} | {s.get('loop', 'asyncio')} | {s['rate']:,.0f} | "
                     f"{s['requests']:,} {s['statuses']} | {ms(s['mean_batch_size'])} | "
                     f"{ms(s['http_ms']['p50'])} / {ms(s['http_ms']['p99'])} | {ms(s['pipeline_ms']['p50'])} / "
                     f"{ms(s['pipeline_ms']['p99'])} | {ms(s['gateway_cost_ms'].get('p99_over_p99'))} | "
                     f"{ms(s['gateway_cost_ms']['p50'])} / {ms(s['gateway_cost_ms']['p99'])} | "
                     f"{ms(s.get('second_reader_ms', {}).get('p50'))} / "
                     f"{ms(s.get('second_reader_ms', {}).get('p99'))} |")
    cells = [s["gc_pauses"] for s in report["steady"] if "gc_pauses" in s]
    if cells:
        def gc_line(who: str) -> str:
            count = sum(g["count"] for c in cells for g in c[who].values())
            total = sum(g["ms"] for c in cells for g in c[who].values())
            over = sum(g["over"].get("5", 0) for c in cells for g in c[who].values())
            return f"{who} {count:,} collections, {total:.1f} ms in all, {over} over 5 ms"
        lines.append(f"\ncollector pauses during the cells: {gc_line('gateway')}; {gc_line('callers')}")
    o = report.get("openai")
    if o:
        lines.append(f"\nOpenAI's route against /v1/predict, same texts, same rates, one gateway, a free model "
                     f"(median of {o['rounds']} rounds):\n\n| rate/s | /v1/predict p50 / p99 ms | /v1/embeddings p50 / "
                     "p99 ms | difference p50 / p99 ms |\n| --- | --- | --- | --- |")
        for f in o["by_rate"]:
            d = f["embeddings_minus_predict_ms"]
            lines.append(f"| {f['rate']:,.0f} | {ms(f['predict']['p50'])} / {ms(f['predict']['p99'])} | "
                         f"{ms(f['embeddings']['p50'])} / {ms(f['embeddings']['p99'])} | {d['p50']:+.2f} / "
                         f"{d['p99']:+.2f} |")
    b = report.get("burst")
    if b:
        lines.append(f"\nburst: {b['requests']:,} callers at {b['rate']:,.0f}/s: {b['statuses']}; answered p99 "
                     f"{ms(b['answered_ms']['p99'])} ms (max {ms(b['answered_ms']['max'])}, timeout "
                     f"{b['timeout_ms']:.0f}); refused p99 {ms(b['refused_ms']['p99'])} ms")
        for who, pauses in b.get("gc_pauses", {}).items():  # who: "gateway" or "callers"
            worst = max((int(bound) for g in pauses.values() for bound, n in g["over"].items() if n), default=0)
            lines.append(f"  {who}: the collector in the burst: {sum(g['count'] for g in pauses.values()):,} "
                         f"collections, {sum(g['ms'] for g in pauses.values()):.1f} ms in all, the longest over "
                         f"{worst} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=["kafka", "tansu"], default="kafka")
    parser.add_argument("--rates", type=lambda v: [float(r) for r in v.split(",")], default=[100.0, 400.0],
                        help="steady caller rates per second, comma-separated (100,400)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds at each steady rate (10)")
    parser.add_argument("--loops", type=lambda v: v.split(","), default=["uvloop", "asyncio"],
                        help="one gateway per event loop, the rates taking turns between them (uvloop,asyncio)")
    parser.add_argument("--rounds", type=int, default=2, help="times each rate runs on each gateway (2)")
    parser.add_argument("--warmup-seconds", type=float, default=3.0,
                        help="seconds at each rate on each gateway before the first round (3)")
    parser.add_argument("--burst-rate", type=float, default=1500.0, help="callers per second in the burst (1500)")
    parser.add_argument("--burst-seconds", type=float, default=3.0)
    parser.add_argument("--burst-device-ms-per-record", type=float, default=2.0,
                        help="the burst's worker: its simulated device's time a record (2: about 500 a second)")
    parser.add_argument("--burst-max-pending", type=int, default=400,
                        help="the burst's gateway (400: at most about 0.8 s of that worker's work waiting)")
    parser.add_argument("--burst-connections", type=int, default=2000,
                        help="the burst's connections: enough that the callers wait on the gateway, not on a pool")
    parser.add_argument("--max-wait-ms", type=float, default=20.0, help="the worker's (20)")
    parser.add_argument("--max-batch-size", type=int, default=256, help="the worker's (256)")
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once")
    parser.add_argument("--timeout-ms", type=float, default=2000.0, help="the gateway's (2000)")
    parser.add_argument("--max-pending", type=int, default=1000, help="the gateway's (1000)")
    parser.add_argument("--openai-rounds", type=int, default=3,
                        help="rounds of OpenAI's route against /v1/predict at each rate (3; 0: leave it out)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run the worker and the gateway of the checkout there (another revision's, as the A/B "
                             "does); the callers, readers and figures stay this checkout's")
    parser.add_argument("--results", type=Path, default=None, help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    report = run(args)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
