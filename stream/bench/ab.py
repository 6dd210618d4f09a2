"""The worker's drain against another revision of itself: ``python -m stream.bench.ab --baseline REV``.

Both run the same pre-produced events on one local broker, in interleaved rounds (baseline, current, current,
baseline, ...), each a fresh consumer group draining the whole topic with ``--stop-at-end`` at the worker's
defaults. The baseline is a git worktree of REV with its C extensions built in place; the current tree is this
checkout. Prints one line per drain and the ratio of the medians, and writes them to ``--results`` as JSON.
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
from pathlib import Path
from typing import Any

from stream.bench.bench_config import BenchConfig
from stream.bench.report import Drain, compare_drains
from stream.bench.revisions import ROOT, checkout_revision, remove_checkout, short_rev
from stream.bench.runner import Bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="drains of each, interleaved (3)")
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--results", type=Path, default=None, help="write the drains here as JSON")
    parser.add_argument("worker_args", nargs="*", help="extra worker flags for both (after --)")
    args = parser.parse_args(argv)
    from stream.local.broker import start_kafka
    from stream.models.train_demo import ensure_trained

    work = Path(tempfile.mkdtemp(prefix="stream-ab-"))
    current_rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip()
    broker = None
    tree = None
    try:
        tree = checkout_revision(args.baseline, work / "baseline")
        if tree is None:
            parser.error(f"this clone has no revision {args.baseline}")
        base_rev = short_rev(args.baseline)
        model_dir = ensure_trained(work / "model")
        broker = None if args.bootstrap_servers else start_kafka()
        bootstrap = args.bootstrap_servers or broker.bootstrap  # type: ignore[union-attr]
        bench = Bench(bootstrap, BenchConfig(events=args.events), model_dir,
                      broker.pid if broker is not None else None)
        bench.prepare()
        drains: list[dict[str, Any]] = []

        def record(r: int, which: str, drain: Drain) -> None:
            code = "baseline" if which == "before" else "current"
            drains.append({"code": code, "rev": base_rev if code == "baseline" else current_rev, "round": r,
                           "events": drain.events, "seconds": drain.seconds, "rate": drain.rate,
                           "peak_rss_mib": drain.peak_rss_mib})
            print(f"round {r} {code} ({drains[-1]['rev']}): {drain.events:,} events in {drain.seconds:.2f} s, "
                  f"{drain.rate:,.0f} events/s", flush=True)

        current, before = bench.interleaved_drains(tree, args.rounds, list(args.worker_args), on_drain=record)
        compared = compare_drains(base_rev, current, before)
        medians = {"baseline": statistics.median(compared["before_rates"]),
                   "current": statistics.median(compared["current_rates"])}
        spread = {"baseline": (min(compared["before_rates"]), max(compared["before_rates"])),
                  "current": (min(compared["current_rates"]), max(compared["current_rates"]))}
        ratio = compared["ratio"]
        print(f"median drain: baseline {base_rev} {medians['baseline']:,.0f} events/s "
              f"({spread['baseline'][0]:,.0f}-{spread['baseline'][1]:,.0f}), current {current_rev} "
              f"{medians['current']:,.0f} ({spread['current'][0]:,.0f}-{spread['current'][1]:,.0f}): "
              f"current/baseline {ratio:.3f}", flush=True)
        if args.results is not None:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps({
                "method": f"{args.rounds} interleaved rounds of --stop-at-end drains of {args.events:,} pre-produced "
                          "demo events, one worker at defaults (plus the extra flags), a fresh group each",
                "baseline": base_rev, "current": current_rev, "worker_args": args.worker_args,
                "medians": medians, "ratio": ratio, "pair_ratios": compared["pair_ratios"], "drains": drains,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
        return 0
    finally:
        if broker is not None:
            broker.stop()
        if tree is not None:
            remove_checkout(tree)
        shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
