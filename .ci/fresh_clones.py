"""What CI does, several times in a row: a fresh clone of one commit, ``CI=true bash .ci/run``, the clone removed,
and again. Each run's wall time, its parts' times (the ``== .ci/run: ... passed in N s`` lines), pytest's summary
lines and any server process it left behind are written after every run to ``docs/results/ci-fresh-<rev>.json``;
each run's whole log stays in the work folder. It stops at the first failed run (its log's path and tail printed).

    python3 .ci/fresh_clones.py [--runs 5] [--commit HEAD] [--work /tmp/stream-fresh-clones] [--append]

Run it on a quiet machine: the times are the point, and another load lengthens them."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PART = re.compile(r"^== \.ci/run: '(.+)' passed in (\d+) s$")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped)\b.* in [\d.]+s.*?)\s*=*$")
SERVERS = ("dockerd", "containerd", "java", "tansu", "prometheus")


def servers() -> set[tuple[int, str]]:
    out = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        pid, _, name = line.strip().partition(" ")
        if any(name.strip().startswith(s) for s in SERVERS):
            found.add((int(pid), name.strip()))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--work", type=Path, default=Path("/tmp/stream-fresh-clones"))
    ap.add_argument("--append", action="store_true",
                    help="add the runs to this commit's results file, numbered on from its last")
    args = ap.parse_args()
    repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", args.commit], capture_output=True,
                         text=True, check=True).stdout.strip()
    results = repo / "docs" / "results" / f"ci-fresh-{rev}.json"
    args.work.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "commit": rev, "what": "fresh clones of this commit, CI=true bash .ci/run, one after another", "runs": []}
    if args.append and results.exists():
        record = json.loads(results.read_text())
    first = len(record["runs"]) + 1
    for n in range(first, first + args.runs):
        clone = args.work / f"clone{n}"
        log = args.work / f"run{n}-{rev}.log"
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", "-B", "main", rev], check=True)
        before = servers()
        started = time.time()
        with log.open("w") as out:
            rc = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "CI": "true"}).returncode
        wall = time.time() - started
        shutil.rmtree(clone, ignore_errors=True)
        lines = log.read_text(errors="replace").splitlines()
        run = {
            "run": n, "rc": rc, "wall_s": round(wall),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "parts_s": {m.group(1): int(m.group(2)) for m in map(PART.match, lines) if m},
            "pytest": [m.group(1) for m in map(SUMMARY.match, lines) if m],
            "left_behind": sorted(f"{pid} {name}" for pid, name in servers() - before),
            "log": str(log),
        }
        record["runs"].append(run)
        results.write_text(json.dumps(record, indent=1) + "\n")
        print(f"run {n}: rc={rc} wall={run['wall_s']} s parts={run['parts_s']} left_behind={run['left_behind']}",
              flush=True)
        if rc != 0:
            print(f"run {n} failed; its log: {log}\n" + "\n".join(lines[-40:]), file=sys.stderr)
            return 1
    print(f"{args.runs} runs passed: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
