"""``python -m stream.bench.summarize RESULTS_DIR``: the benchmark's report without its per-record arrays
(latencies, batch sizes: hundreds of MB), as ``summary.json`` beside ``bench.json``, small enough to commit.

``python -m stream.bench.summarize --markdown RESULTS_DIR`` prints the tables of ``summary.json`` (or
``bench.json``) as Markdown, as `docs/performance.md` quotes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PER_RECORD = ("latencies_ms", "batch_sizes", "rss_samples")


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in PER_RECORD}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(report)  # type: ignore[no-any-return]


def markdown(report: dict[str, Any]) -> str:
    from stream.bench.report import (
        format_before,
        format_broker_alone,
        format_latency,
        format_methods,
        format_table,
    )

    def table(rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(row) + " |" for row in [rows[0], ["---"] * len(rows[0]), *rows[1:]]]

    v = report["versions"]
    lines = [f"{v['cpu_cores']} cores, Python {v['python']}, torch {v['torch']}, confluent-kafka "
             f"{v['confluent_kafka']}, librdkafka {v['librdkafka']}, broker {v['broker']}; "
             f"{report['config']['events']:,} pre-produced events", "", *table(format_table(report)), ""]
    lines += [f"- {line}" for line in format_methods(report)]
    for line in (format_before(report), format_broker_alone(report)):
        if line:
            lines += ["", line]
    if report.get("latency"):
        lines += ["", f"Latency under load (loads are fractions of {report['capacity']:,.0f} events/s, the smaller of "
                      "the default drain and the live rate):", "", *table(format_latency(report))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stream.bench.summarize",
        description="Write a benchmark run's report without its per-record arrays (summary.json beside bench.json, "
                    "small enough to commit), or print its tables as Markdown.")
    parser.add_argument("results", type=Path, metavar="RESULTS_DIR", help="the folder `make bench` wrote into")
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables of summary.json (or bench.json) as Markdown, as docs/performance.md "
                             "quotes them")
    args = parser.parse_args(argv)
    folder: Path = args.results
    source = folder / "summary.json" if args.markdown and (folder / "summary.json").exists() else folder / "bench.json"
    if not source.is_file():
        parser.error(f"{folder}: no {source.name} there (RESULTS_DIR is the folder `make bench` wrote)")
    report = json.loads(source.read_text())
    if args.markdown:
        print(markdown(report))
        return 0
    (folder / "summary.json").write_text(json.dumps(summarize(report), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
