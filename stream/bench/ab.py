"""The worker's drain against another revision of itself: ``python -m stream.bench.ab --baseline REV``.

Both run the same pre-produced records on one local broker, in interleaved rounds (baseline, current, current,
baseline, ...), each a fresh consumer group draining the whole topic with ``--stop-at-end``. The baseline is a git
worktree of REV with its C extensions built in place; the current tree is this checkout. Prints one line per drain
and the ratio of the medians, and writes them to ``--results`` as JSON.

``--model`` picks what is drained:

* ``demo`` (default): the demo's events, one worker at its defaults;
* ``free-text``: seeded texts (`producers.texts`), MiniLM's host path with a free model
  (`stream.bench.simulated`, ``predict`` returns zeros at once): the CPU text worker's host ceiling;
* ``minilm``: the same texts through ``--model minilm`` on the CPU (the installed weights).

The text workers run at ``--max-batch-size --batch`` and one torch thread (`stream.bench.stages.text_worker_args`).
Extra worker flags for both sides go after ``--``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stream.bench.bench_config import BenchConfig
from stream.bench.report import Drain, compare_drains
from stream.bench.revisions import ROOT, checkout_revision, remove_checkout, short_rev
from stream.bench.runner import Bench

DEFAULT_EVENTS = {"demo": 1_000_000, "free-text": 1_000_000, "minilm": 3_000}
METHOD = {"demo": "demo events, one worker at defaults",
          "free-text": "texts, one worker with MiniLM's host path and a free model (the host ceiling)",
          "minilm": "texts, one worker with --model minilm on the CPU"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--model", choices=sorted(DEFAULT_EVENTS), default="demo",
                        help="what the workers drain (default demo; see above)")
    parser.add_argument("--events", type=int, default=None,
                        help="records pre-produced and drained by each worker (demo 1,000,000, free-text 1,000,000, "
                             "minilm 3,000)")
    parser.add_argument("--batch", type=int, default=128, help="the text workers' --max-batch-size (128)")
    parser.add_argument("--rounds", type=int, default=3, help="drains of each, interleaved (3)")
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--results", type=Path, default=None, help="write the drains here as JSON")
    parser.add_argument("worker_args", nargs="*", help="extra worker flags for both (after --)")
    args = parser.parse_args(argv)
    events = args.events if args.events is not None else DEFAULT_EVENTS[args.model]
    if events < 1 or args.batch < 1:
        parser.error("--events and --batch must be at least 1")
    from stream.models.train_demo import ensure_trained

    current_rev = current_revision()
    with baseline_and_broker(parser, args.baseline, args.bootstrap_servers, "stream-ab-") as (
            work, tree, bootstrap, broker_pid):
        assert tree is not None
        base_rev = short_rev(args.baseline)
        model_dir = ensure_trained(work / "model") if args.model == "demo" else work / "unused"
        bench = Bench(bootstrap, BenchConfig(events=events), model_dir, broker_pid)
        topic: str | None = None
        model_flags: list[str] = []
        if args.model == "demo":
            bench.prepare()
        else:
            topic, model_flags = _texts(bench, args.model, events, args.batch)
        drains: list[dict[str, Any]] = []

        def record(r: int, which: str, drain: Drain) -> None:
            code = "baseline" if which == "before" else "current"
            cpu_us = stage_us_per_record(drain.stage_cpu_s, drain.events)
            drains.append({"code": code, "rev": base_rev if code == "baseline" else current_rev, "round": r,
                           "events": drain.events, "seconds": drain.seconds, "rate": drain.rate,
                           "steady_rate": drain.steady_rate, "peak_rss_mib": drain.peak_rss_mib,
                           "stage_busy_s": drain.stage_busy_s, "stage_cpu_s": drain.stage_cpu_s,
                           "stage_cpu_us_per_record": cpu_us})
            steady = f", steady {drain.steady_rate:,.0f}" if drain.steady_rate is not None else ""
            cpu = f"; stage CPU µs a record: {figures(cpu_us)}" if cpu_us else ""
            print(f"round {r} {code} ({drains[-1]['rev']}): {drain.events:,} records in {drain.seconds:.2f} s, "
                  f"{drain.rate:,.0f}/s{steady}{cpu}", flush=True)

        current, before = bench.interleaved_drains(tree, args.rounds, [*model_flags, *args.worker_args],
                                                   on_drain=record, input_topic=topic,
                                                   model_dir=args.model == "demo")
        compared = compare_drains(base_rev, current, before)
        medians = {"baseline": statistics.median(compared["before_rates"]),
                   "current": statistics.median(compared["current_rates"])}
        spread = {"baseline": (min(compared["before_rates"]), max(compared["before_rates"])),
                  "current": (min(compared["current_rates"]), max(compared["current_rates"]))}
        ratio = compared["ratio"]
        steady = {code: _median_steady(drains, code) for code in ("baseline", "current")}
        print(f"median drain: baseline {base_rev} {medians['baseline']:,.0f} events/s "
              f"({spread['baseline'][0]:,.0f}-{spread['baseline'][1]:,.0f}), current {current_rev} "
              f"{medians['current']:,.0f} ({spread['current'][0]:,.0f}-{spread['current'][1]:,.0f}): "
              f"current/baseline {ratio:.3f}" + (f"; steady rates' medians {steady['baseline']:,.0f} and "
                                                 f"{steady['current']:,.0f}: "
                                                 f"{steady['current'] / steady['baseline']:.3f}"
                                                 if steady["baseline"] and steady["current"] else ""), flush=True)
        cpu_medians = {code: _median_stage_cpu(drains, code) for code in ("baseline", "current")}
        for code, per in cpu_medians.items():
            if per:
                print(f"median stage CPU µs a record, {code}: {figures(per)}", flush=True)
        if args.results is not None:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps({
                "method": f"{args.rounds} interleaved rounds of --stop-at-end drains of {events:,} pre-produced "
                          f"{METHOD[args.model]} (plus the extra flags), a fresh group each",
                "model": args.model, "events": events, "baseline": base_rev, "current": current_rev,
                "worker_args": [*model_flags, *args.worker_args],
                "medians": medians, "ratio": ratio, "steady_medians": steady, "stage_cpu_us_medians": cpu_medians,
                "pair_ratios": compared["pair_ratios"], "drains": drains,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
        return 0


def current_revision() -> str:
    """This checkout's revision as ``git describe --always --dirty`` names it."""
    return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


@contextmanager
def baseline_and_broker(parser: argparse.ArgumentParser, baseline: str | None, bootstrap_servers: str | None,
                        prefix: str) -> Iterator[tuple[Path, Path | None, str, int | None]]:
    """(a scratch folder, ``baseline``'s worktree in it with its extensions built or None without one, the
    bootstrap servers, the broker's PID): a local Apache Kafka is started unless ``bootstrap_servers`` is given.
    All of it is stopped or removed on the way out."""
    from stream.local.broker import start_kafka

    work = Path(tempfile.mkdtemp(prefix=prefix))
    broker = None
    tree = None
    try:
        if baseline is not None:
            tree = checkout_revision(baseline, work / "baseline")
            if tree is None:
                parser.error(f"this clone has no revision {baseline}")
        broker = None if bootstrap_servers else start_kafka()
        yield (work, tree, bootstrap_servers or broker.bootstrap,  # type: ignore[union-attr]
               broker.pid if broker is not None else None)
    finally:
        if broker is not None:
            broker.stop()
        if tree is not None:
            remove_checkout(tree)
        shutil.rmtree(work, ignore_errors=True)


def figures(named: dict[str, float]) -> str:
    """``{"prepare": 1.234, ...}`` as "prepare 1.23, ..."."""
    return ", ".join(f"{k} {v:.2f}" for k, v in named.items())


def stage_us_per_record(cpu_s: dict[str, float] | None, events: int) -> dict[str, float] | None:
    """Each stage's CPU µs a record (None for a revision whose worker did not report its stages' CPU time)."""
    if not cpu_s or events < 1:
        return None
    return {stage: seconds * 1e6 / events for stage, seconds in cpu_s.items()}


def _median_stage_cpu(drains: list[dict[str, Any]], code: str) -> dict[str, float] | None:
    """Per stage, the median over one side's drains of its CPU µs a record (None where a drain has none)."""
    per = [d["stage_cpu_us_per_record"] for d in drains if d["code"] == code]
    if not per or None in per:
        return None
    return {stage: statistics.median(p[stage] for p in per) for stage in per[0]}


def _median_steady(drains: list[dict[str, Any]], code: str) -> float | None:
    """The median of one side's steady rates (None where a drain was too short to have one)."""
    rates = [d["steady_rate"] for d in drains if d["code"] == code]
    return statistics.median(rates) if rates and None not in rates else None


def _texts(bench: Bench, model: str, count: int, batch: int) -> tuple[str, list[str]]:
    """Pre-produce ``count`` texts; (their topic, the text worker's flags for ``model``)."""
    from producers.texts import produce_texts
    from stream.bench.simulated import write_spec
    from stream.bench.stages import free_model, text_worker_args

    topic = bench.topic("texts-in")
    produced = produce_texts(bench.bootstrap, topic, count, seed=2027)
    if produced != count:
        raise RuntimeError(f"pre-producing texts: {produced} of {count} acknowledged")
    flags = (free_model(write_spec(bench.work / "free.json", 0.0)) if model == "free-text"
             else ["--model", "minilm"])
    return topic, text_worker_args(flags, batch)


if __name__ == "__main__":
    sys.exit(main())
