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
    args = sys.argv[1:] if argv is None else argv
    as_markdown = bool(args) and args[0] == "--markdown"
    args = args[1:] if as_markdown else args
    if len(args) != 1:
        print("usage: python -m stream.bench.summarize [--markdown] RESULTS_DIR", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if as_markdown:
        source = folder / "summary.json" if (folder / "summary.json").exists() else folder / "bench.json"
        print(markdown(json.loads(source.read_text())))
        return 0
    report = json.loads((folder / "bench.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summarize(report), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
