"""``python -m stream.bench.gateway_ab --baseline REV``: the gateway benchmark (`stream.bench.gateway`) with the
worker and gateway of another revision and of this checkout, taking turns (ABBA: neither always first), ``--runs``
times each, on the same machine in one go; every run's report and, per cell, the median and range of each side's
figures, in one file. Both sides are driven and measured by this checkout's benchmark (``--tree``), so that what
differs is the revision's gateway and worker, not its callers.

Any other flag goes to `stream.bench.gateway` as it is (``--rates 400 --rounds 1 --openai-rounds 0`` keeps a run to
a few minutes)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stream.bench.revisions import ROOT, checkout_revision, remove_checkout, short_rev


def cells(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A run's figures by cell: each steady (rate, loop)'s HTTP and gateway-cost p50/p99 (medians over its rounds),
    and the burst's."""
    out: dict[str, dict[str, list[float]]] = {}
    for c in report["steady"]:
        key = f"{c['rate']:.0f}/s {c['loop']}"
        figures = out.setdefault(key, {})
        for name, source in (("http", "http_ms"), ("gateway_cost", "gateway_cost_ms")):
            for q in ("p50", "p99"):
                figures.setdefault(f"{name}_{q}_ms", []).append(c[source][q])
    burst = report.get("burst")
    if burst:
        out["burst"] = {"answered_p99_ms": [burst["answered_ms"]["p99"]],
                        "refused_p99_ms": [burst["refused_ms"]["p99"]],
                        "answered": [burst["statuses"].get("200", 0)], "refused": [burst["statuses"].get("503", 0)]}
    return {k: {f: statistics.median(v) for f, v in figures.items()} for k, figures in out.items()}


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per side and cell: each figure's median and range over the runs."""
    out: dict[str, Any] = {}
    for side, reports in runs.items():
        per_run = [cells(r) for r in reports]
        for cell in per_run[0]:
            for figure in per_run[0][cell]:
                values = [p[cell][figure] for p in per_run if cell in p]
                out.setdefault(cell, {}).setdefault(figure, {})[side] = {
                    "median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.gateway_ab",
                                     description="the gateway benchmark on another revision and on this checkout, "
                                                 "taking turns")
    parser.add_argument("--baseline", required=True, help="the other revision (a commit this clone has)")
    parser.add_argument("--runs", type=int, default=3, help="runs on each side (3)")
    parser.add_argument("--results", type=Path, required=True, help="write every run and the summary here (JSON)")
    args, bench_args = parser.parse_known_args(argv)
    base, head = short_rev(args.baseline), short_rev("HEAD")
    work = Path(tempfile.mkdtemp(prefix="stream-gateway-ab-"))
    tree = checkout_revision(args.baseline, work / "baseline")
    if tree is None:
        raise SystemExit(f"this clone does not have {args.baseline}")
    runs: dict[str, list[dict[str, Any]]] = {base: [], head: []}
    try:
        sides = ((base, tree), (head, ROOT))
        for r in range(args.runs):
            # ABBA...: neither side always goes first (a run's first pipeline on a fresh broker, or after a
            # quiet spell, has been the slowest in probes of either revision)
            for side, cwd in sides if r % 2 == 0 else sides[::-1]:
                out = work / f"{side}-{r}.json"
                print(f"gateway A/B: run {r + 1} of {args.runs} at {side} ...", flush=True)
                subprocess.run([sys.executable, "-m", "stream.bench.gateway", *bench_args, "--results", str(out),
                                *(["--tree", str(cwd)] if cwd != ROOT else [])],
                               cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
                runs[side].append(json.loads(out.read_text()))
    finally:
        remove_checkout(tree)
    figures_by_cell = summary(runs)
    result = {"baseline": base, "head": head, "bench_args": bench_args, "summary": figures_by_cell, "runs": runs}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1))
    for cell, figures in figures_by_cell.items():
        for figure, sides in figures.items():
            shown = "; ".join(f"{side} {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})" for side, v in sides.items())
            print(f"{cell:>16} {figure:<20} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
