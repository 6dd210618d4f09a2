"""Freeze and thaw each replica in turn (SIGSTOP for longer than the session timeout, then SIGCONT) while input
arrives, then check progress and the invariants: every partition's committed offset must reach its end offset
within ``drain_bound_s`` of the input's end, and the verifier's counts must hold.

A frozen replica is evicted from the group; its partitions move to the other; when it thaws it finds them lost
(its open transaction fails with UNKNOWN_MEMBER_ID under exactly-once) and rejoins, and the other is frozen in
its turn. Before the fix, a replica thawed while its input was paused behind a full model queue dropped the
waiting batch with the lost partitions and never resumed: the partitions it was given next were never read,
while the process looked healthy.

``python -m tests.chaos.freeze --runs 10`` repeats it (both guarantees, the demo model as fast as the input and
a model slower than it) on a local Apache Kafka, one line per run; exit 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from producers.events import generate_events
from producers.load import ProduceSummary, produce_events
from stream.kafka.topics import create_topics
from tests.chaos.runner import ChaosConfig, Fleet
from tests.chaos.verifier import Verifier, hanging_transactions
from tests.verify import check_committed, committed_offsets, end_offsets

SLOW_BATCH_S = 0.2  # the slow model: 0.2 s a batch of <= 128, about 640 events/s a replica (two: 1,280 < 1,500)


@dataclass
class FreezeConfig:
    bootstrap: str
    model_dir: Path
    guarantee: str = "exactly-once"
    events: int = 90_000
    rate: float = 1_500.0
    partitions: int = 6
    freeze_s: float = 20.0  # longer than the fleet's 6 s session timeout
    gap_s: float = 10.0  # from one thaw to the next freeze
    slow_model: bool = False  # a model slower than the input: queues stay full, input is paused at the freeze
    drain_bound_s: float = 120.0  # input end -> every committed offset at its end offset
    stall_timeout_s: float = 30.0
    seed: int = 5
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="stream-freeze-")))


@dataclass
class FreezeResult:
    events: int
    drain_s: float | None  # None: not drained within the bound
    behind: dict[int, int]  # partition -> records the committed offset stayed behind its end, at the bound
    lost: int
    duplicates: int
    order_violations: int
    commit_problems: list[str]
    hanging_transactions: list[str]
    exit_codes: list[int]
    stall_warnings: int  # "stalled:" lines the replicas logged
    load: str
    logs: Path
    duplicate_details: list[str] = field(default_factory=list)  # where the first repeated ids were written

    def ok(self) -> bool:
        return (self.drain_s is not None and self.lost == 0 and self.order_violations == 0
                and not self.commit_problems and not self.hanging_transactions and self.exit_codes == [0, 0])

    def line(self) -> str:
        drained = f"{self.drain_s:.1f}s" if self.drain_s is not None else f"NOT drained, behind {self.behind}"
        return (f"freeze/thaw: events={self.events} drained={drained} lost={self.lost} "
                f"duplicates={self.duplicates} order_violations={self.order_violations} "
                f"commit_problems={len(self.commit_problems)} hanging_transactions={len(self.hanging_transactions)} "
                f"exit_codes={self.exit_codes} stall_warnings={self.stall_warnings}")


def run_freeze_thaw(cfg: FreezeConfig, log: bool = False) -> FreezeResult:
    run = uuid.uuid4().hex[:8]
    input_topic, output_topic, dlq_topic, group = (f"freeze-in-{run}", f"freeze-out-{run}", f"freeze-dlq-{run}",
                                                   f"freeze-{run}")
    create_topics(cfg.bootstrap, [input_topic, output_topic, dlq_topic], cfg.partitions)
    fleet = Fleet(ChaosConfig(cfg.bootstrap, cfg.model_dir, guarantee=cfg.guarantee, workdir=cfg.workdir),
                  input_topic, output_topic, dlq_topic, group)
    fleet.args += ["--stall-timeout-s", str(cfg.stall_timeout_s)]
    env = {}
    if cfg.slow_model:
        fleet.args[fleet.args.index("tests.handlers:PoisonHandler")] = "tests.handlers:SlowHandler"
        env["STREAM_TEST_BATCH_SLEEP_S"] = str(SLOW_BATCH_S)
    produced: dict[str, ProduceSummary] = {}
    try:
        fleet.start(0, env)
        fleet.start(1, env)
        deadline = time.monotonic() + 90
        while not all(" assigned " in p.output() for p in fleet.live.values()):
            assert time.monotonic() < deadline, "the replicas never joined"
            time.sleep(0.2)
        producer = threading.Thread(target=lambda: produced.update(summary=produce_events(
            cfg.bootstrap, input_topic, cfg.events, seed=cfg.seed, rate=cfg.rate)), daemon=True)
        producer.start()
        time.sleep(5.0)  # both replicas at work before the first freeze
        for slot in (0, 1):
            proc = fleet.live[slot].proc
            _say(log, f"freeze replica {slot} for {cfg.freeze_s:g}s")
            proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(cfg.freeze_s)
            finally:
                proc.send_signal(signal.SIGCONT)
            _say(log, f"thawed replica {slot}")
            time.sleep(cfg.gap_s)
        producer.join(cfg.events / cfg.rate + 120)
        input_end = time.monotonic()
        _say(log, "input ended; waiting for the committed offsets to reach the end offsets")
        ends = end_offsets(cfg.bootstrap, input_topic)
        drain_s = None
        behind: dict[int, int] = {}
        while True:
            committed = committed_offsets(cfg.bootstrap, group, input_topic)
            behind = {p: end - max(committed.get(p, 0), 0) for p, end in ends.items() if committed.get(p, 0) < end}
            if not behind:
                drain_s = time.monotonic() - input_end
                break
            if time.monotonic() - input_end > cfg.drain_bound_s:
                break
            time.sleep(0.5)
        sent = produced["summary"].delivered if "summary" in produced else 0
        expected = set(generate_events(sent, seed=cfg.seed).event_ids)
        verifier = Verifier(cfg.bootstrap, output_topic, dlq_topic)
        try:
            verifier.read_until(expected, time.monotonic() + (60 if drain_s is not None else 5))
            codes = [fleet.stop(slot) for slot in sorted(fleet.live)]
            verifier.read_more(2.0)
            ids = verifier.id_counts()
            order_violations = verifier.order_violations()
            duplicate_details = verifier.duplicate_details(dead_letters=False)  # as duplicates counts them
        finally:
            verifier.close()
    finally:
        for slot in list(fleet.live):
            fleet.kill(slot)
    return FreezeResult(
        events=sent, drain_s=drain_s, behind=behind,
        lost=sum(1 for e in expected if e not in ids), duplicates=sum(c - 1 for c in ids.values() if c > 1),
        order_violations=order_violations,
        commit_problems=check_committed(committed_offsets(cfg.bootstrap, group, input_topic),
                                        end_offsets(cfg.bootstrap, input_topic)),
        hanging_transactions=hanging_transactions(cfg.bootstrap, [output_topic, dlq_topic]),
        exit_codes=codes, stall_warnings=sum(p.output().count(" stalled: ") for p in fleet.all()),
        load=produced["summary"].line() if "summary" in produced else "load generator failed", logs=cfg.workdir,
        duplicate_details=duplicate_details)


def _commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def _say(log: bool, what: str) -> None:
    if log:
        print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def summarize(paths: list[Path]) -> str:
    """A markdown table of --results files: one row per commit, guarantee and model."""
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            run = json.loads(line)
            rows.setdefault((run["commit"], run["guarantee"], run["model"]), []).append(run)
    out = ["| code | guarantee | model | runs passed | drained after the input's end (s) | lost | duplicates | "
           "exit codes not 0 | stall warnings |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (commit, guarantee, model), runs in rows.items():
        drains = [r["drain_s"] for r in runs if r["drain_s"] is not None]
        stuck = len(runs) - len(drains)
        drained = (f"{min(drains):.1f} to {max(drains):.1f}" if drains else "—") + (f", {stuck} never" if stuck else "")
        dups = [r["duplicates"] for r in runs]
        bad_exits = sum(1 for r in runs for code in r["exit_codes"] if code != 0)
        out.append(f"| {commit} | {guarantee} | {model} | {sum(r['ok'] for r in runs)} / {len(runs)} | {drained} | "
                   f"{sum(r['lost'] for r in runs):,} | {min(dups):,} to {max(dups):,} | {bad_exits} | "
                   f"{sum(r['stall_warnings'] for r in runs)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.freeze", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--runs", type=int, default=10, help="runs of each guarantee and model (10)")
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once", "both"], default="both")
    parser.add_argument("--model", choices=["fast", "slow", "both"], default="both",
                        help="fast: the demo model (as in the issue's report); slow: a model slower than the input")
    parser.add_argument("--events", type=int, default=90_000)
    parser.add_argument("--rate", type=float, default=1_500.0)
    parser.add_argument("--first-run", type=int, default=1, help="number (and seed) of the first run (1)")
    parser.add_argument("--results", type=Path, default=None, help="append one JSON line per run to this file")
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="RESULTS",
                        help="print a table of the runs in these --results files instead of running")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    # SIGTERM and SIGINT (ignored by default in a background job) unwind through the finally blocks, which thaw
    # and kill the replicas and stop the broker: a replica left frozen would outlive the run.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from stream.local.broker import start_kafka
    from stream.models.train_demo import ensure_trained

    model_dir = ensure_trained(Path(tempfile.mkdtemp(prefix="freeze-model-")))
    broker = None if args.bootstrap_servers else start_kafka()
    bootstrap = args.bootstrap_servers or broker.bootstrap  # type: ignore[union-attr]
    guarantees = ["exactly-once", "at-least-once"] if args.guarantee == "both" else [args.guarantee]
    models = ["fast", "slow"] if args.model == "both" else [args.model]
    failed = 0
    try:
        for model in models:
            for guarantee in guarantees:
                for i in range(args.first_run - 1, args.first_run - 1 + args.runs):
                    cfg = FreezeConfig(bootstrap, model_dir, guarantee=guarantee, events=args.events, rate=args.rate,
                                       slow_model=model == "slow", seed=i + 1)
                    result = run_freeze_thaw(cfg)
                    ok = result.ok() and (guarantee != "exactly-once" or result.duplicates == 0)
                    failed += not ok
                    if args.results is not None:
                        record = {"guarantee": guarantee, "model": model, "run": i + 1, "ok": ok,
                                  "commit": _commit(), **asdict(result), "logs": str(result.logs)}
                        with args.results.open("a") as out:
                            out.write(json.dumps(record) + "\n")
                    print(f"{guarantee} {model} run {i + 1}: {'ok' if ok else 'FAILED'} {result.line()} "
                          f"load: {result.load} logs: {result.logs}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print(f"{failed} of {args.runs * len(models) * len(guarantees)} runs failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
