"""``python -m stream.bench.summarize RESULTS_DIR``: the benchmark's report without its per-record arrays
(latencies, batch sizes: hundreds of MB), as ``summary.json`` beside ``bench.json``, small enough to commit."""

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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m stream.bench.summarize RESULTS_DIR", file=sys.stderr)
        return 2
    folder = Path(args[0])
    report = json.loads((folder / "bench.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summarize(report), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
