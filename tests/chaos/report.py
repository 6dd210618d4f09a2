"""The README's chaos table from a `make chaos` result file: ``python -m tests.chaos.report FILE``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def table(report: dict[str, Any]) -> str:
    runs: dict[str, dict[str, Any]] = report["runs"]
    modes = list(runs)
    rows = [("events sent", lambda r: f"{r['events']:,}"),
            ("sends that failed (not expected)", lambda r: f"{r['send_failures']:,}"),
            ("worker kills (by phase)", _kills),
            ("replica freezes", lambda r: str(r["freezes"])),
            ("lost", lambda r: str(r["lost"])),
            ("duplicates (read_committed)", lambda r: f"{r['duplicates']:,}"),
            ("of which the input held twice", lambda r: str(r["upstream_repeats"]) if "upstream_repeats" in r
             else "not counted"),
            ("order violations", lambda r: str(r["order_violations"])),
            ("dead-lettered / bad records sent", lambda r: f"{r['dead_lettered']:,} / {r['poison_injected']:,}"),
            ("committed == end offsets", lambda r: "no" if r["commit_problems"] else "yes"),
            ("hanging transactions", lambda r: str(len(r["hanging_transactions"]))),
            ("worker exits", lambda r: str(len(r["worker_failures"])))]
    kinds = list(dict.fromkeys(k for r in runs.values() for k in r["recovery"]))
    for kind in kinds:
        rows.append((f"{kind}: faults, recovered; recovery median / max",
                     lambda r, kind=kind: _recovery(r["recovery"].get(kind))))
    lines = ["| | " + " | ".join(modes) + " |", "| --- |" + " --- |" * len(modes)]
    lines += [f"| {name} | " + " | ".join(cell(runs[m]) for m in modes) + " |" for name, cell in rows]
    return "\n".join(lines)


def _kills(r: dict[str, Any]) -> str:
    phases = ", ".join(f"{k} {v}" for k, v in r["phase_kills"].items())
    return f"{r['kills']} ({phases})"


def _recovery(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if entry["median_s"] is None:
        return f"{entry['faults']}, {entry['recovered']}"
    return f"{entry['faults']}, {entry['recovered']}; {entry['median_s']:.1f} s / {entry['max_s']:.1f} s"


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
