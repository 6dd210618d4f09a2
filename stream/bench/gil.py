"""Who holds the GIL while the text worker drains: ``python -m stream.bench.gil [--baseline REV]``.

On a GPU an eager forward pass is a few hundred torch calls, and each gives the GIL up while it launches and takes
it back after: every moment another of the worker's threads holds the GIL then, the device waits for its next
kernel. On an H200 the worker's device time a batch of 4,096 was twice the model's alone (docs/performance.md).
What the host path holds the GIL for, per text, is what that costs; this measures it on any machine.

MiniLM's host path with a free model (`stream.bench.simulated`, the host ceiling's worker) drains pre-produced texts
at ``--batch``; py-spy attaches to the worker once it is ready and samples only the thread holding the GIL
(``--gil``, ``--native``), until the worker exits. Samples under the pipeline's four loops (poll, prepare, device,
finish) are counted per thread and per step: the innermost frame below the loop that is one of the host path's
known steps (`STEPS`), else the loop's own line. Each figure is µs of GIL-held time a text: samples / rate /
texts. With ``--baseline``, a git worktree of that revision drains the same texts in interleaved rounds (as
`stream.bench.ab`), and the ratio of the totals' medians is printed.

py-spy is not among the project's dependencies (a change to pyproject.toml rebuilds the image's dependency layers):
``pip install py-spy==0.4.3`` first, or ``--py-spy PATH``. Attaching needs ptrace (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stream.bench.revisions import short_rev

RATE_HZ = 250  # py-spy's samples a second
LOOPS = {"_poll_loop": "poll", "_prepare_loop": "prepare", "_device_loop": "device", "_finish_loop": "finish"}
# The host path's steps, by the function that names them in a stack (the innermost one below the loop).
STEPS = ("Intake.take", "Spans.accept", "Spans.close_batch", "Records.concat", "ProcessingStages.offer",
         "Committer.commit", "ColumnDecoder.decode_batch", "_as_input", "tokenize_flat", "layout_flat",
         "layout_packed", "plan_passes", "InferenceEngine.submit", "InferenceEngine.result",
         "OutputEncoder.encode_joined", "produce_joined", "Publisher.send_now", "Publisher.serve",
         "BatchProcessor.complete")


def parse_raw(text: str) -> dict[str, dict[str, int]]:
    """py-spy's ``--format raw`` (one ``thread;frame;...;frame count`` line a stack, root first) as
    {thread kind: {step: samples}}; stacks under none of `LOOPS` go to thread ``other``."""
    out: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        names = [f.partition(" (")[0] for f in stack.split(";")[1:]]  # "name (where)": the name
        at = next((i for i, n in enumerate(names) if n.rpartition(".")[2] in LOOPS), None)
        if at is None:
            out["other"]["-"] += int(count)
            continue
        kind = LOOPS[names[at].rpartition(".")[2]]
        below = names[at + 1:]
        step = next((n for n in reversed(below) if any(n == s or n.endswith("." + s) for s in STEPS)), None)
        out[kind][step or f"{kind} loop"] += int(count)
    return {k: dict(v) for k, v in out.items()}


def gil_us_per_text(samples: dict[str, dict[str, int]], texts: int) -> dict[str, Any]:
    """{thread kind: µs a text, ...} and the total over the four loops, from `parse_raw`'s samples."""
    per = 1e6 / RATE_HZ / texts
    threads = {k: sum(v.values()) * per for k, v in samples.items() if k != "other"}
    steps = {f"{k}: {s}": n * per for k, v in samples.items() if k != "other" for s, n in v.items()}
    return {"total": sum(threads.values()), "threads": threads,
            "steps": dict(sorted(steps.items(), key=lambda kv: -kv[1])),
            "outside_loops_samples": sum(samples.get("other", {}).values())}


def _py_spy(path: str | None) -> str:
    found = path or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install py-spy==0.4.3, or --py-spy PATH")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.gil", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="a git revision to compare with (interleaved rounds)")
    parser.add_argument("--texts", type=int, default=1_000_000, help="texts pre-produced and drained (1,000,000)")
    parser.add_argument("--batch", type=int, default=4096, help="the worker's --max-batch-size (4,096)")
    parser.add_argument("--rounds", type=int, default=2, help="drains of each (2)")
    parser.add_argument("--py-spy", dest="py_spy", default=None, help="py-spy's path (default: on PATH)")
    parser.add_argument("--results", type=Path, default=None, help="write the drains here as JSON")
    parser.add_argument("--profiles", type=Path, default=None,
                        help="keep py-spy's raw profiles in this folder (flamegraph.pl reads them)")
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    args = parser.parse_args(argv)
    if args.texts < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--texts, --batch and --rounds must be at least 1")
    spy = _py_spy(args.py_spy)
    from stream.bench.ab import _texts, baseline_and_broker, current_revision, figures
    from stream.bench.bench_config import BenchConfig
    from stream.bench.runner import Bench

    if args.profiles is not None:
        args.profiles.mkdir(parents=True, exist_ok=True)
    current_rev = current_revision()
    with baseline_and_broker(parser, args.baseline, args.bootstrap_servers, "stream-gil-") as (
            work, tree, bootstrap, broker_pid):
        bench = Bench(bootstrap, BenchConfig(events=args.texts), work / "unused", broker_pid)
        topic, flags = _texts(bench, "free-text", args.texts, args.batch)
        sides: list[tuple[str, str, Path | None]] = [("current", current_rev, None)]
        if tree is not None:
            sides.insert(0, ("baseline", short_rev(args.baseline), tree))
        drains: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for code, rev, cwd in (sides if r % 2 == 0 else sides[::-1]):
                out = (args.profiles or work) / f"{code}-{r}.txt"
                drains.append(_profiled_drain(bench, spy, out, flags, topic, cwd,
                                              {"code": code, "rev": rev, "round": r}))
                d = drains[-1]
                print(f"round {r} {code} ({rev}): {d['events']:,} texts in {d['seconds']:.2f} s, "
                      f"{d['rate']:,.0f}/s; GIL held {d['gil']['total']:.2f} µs a text ("
                      + figures(d["gil"]["threads"]) + ")", flush=True)
        summary = {code: statistics.median(d["gil"]["total"] for d in drains if d["code"] == code)
                   for code, _, _ in sides}
        print("median GIL-held µs a text: " + figures(summary)
              + (f"; current/baseline {summary['current'] / summary['baseline']:.3f}"
                 if tree is not None and summary["baseline"] > 0 else ""))
        if not all(d["gil"]["total"] for d in drains):
            print(f"a drain had no sample under the worker's loops: at {RATE_HZ} Hz a drain of a few seconds is "
                  f"needed; drain more --texts")
        if args.results is not None:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps({
                "method": f"{args.rounds} rounds (interleaved) of --stop-at-end drains of {args.texts:,} texts, one "
                          f"worker with MiniLM's host path and a free model at --max-batch-size {args.batch}, "
                          f"py-spy record --gil --native at {RATE_HZ} Hz attached once /readyz is 200",
                "texts": args.texts, "batch": args.batch, "worker_args": flags, "medians": summary,
                "drains": drains, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
        return 0


def _profiled_drain(bench: Any, spy: str, out: Path, flags: list[str], topic: str, cwd: Path | None,
                    tags: dict[str, Any]) -> dict[str, Any]:
    """One drain with py-spy attached from ready to exit: its figures and GIL-held µs a text."""
    profilers: list[subprocess.Popen[bytes]] = []
    log = out.with_suffix(".log")

    def attach(pid: int) -> None:
        with open(log, "wb") as sink:
            profilers.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--gil", "--native", "--threads", "--rate", str(RATE_HZ),
                 "--format", "raw", "--output", str(out)], stdout=sink, stderr=subprocess.STDOUT))

    try:
        drain = bench.worker_drain(f"gil-{tags['code']}-{tags['round']}", flags, cwd=cwd, input_topic=topic,
                                   model_dir=False, on_ready=attach)
    finally:
        for p in profilers:  # py-spy ends with the worker it sampled; one that does not is stopped
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if not profilers:
        raise RuntimeError("the worker never answered /readyz: py-spy was not attached")
    if not out.exists():
        raise RuntimeError(f"py-spy wrote no profile (exit {profilers[0].returncode}): "
                           f"{log.read_text(errors='replace')[-2000:]}")
    samples = parse_raw(out.read_text())
    return {**tags, "events": drain.events, "seconds": drain.seconds, "rate": drain.rate,
            "steady_rate": drain.steady_rate, "samples": samples, "gil": gil_us_per_text(samples, drain.events)}


if __name__ == "__main__":
    sys.exit(main())
