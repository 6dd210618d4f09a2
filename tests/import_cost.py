"""The CPU a process spends importing what a worker imports, from the venv's bytecode and from source.

``make venv`` compiles the venv's packages and this checkout to bytecode once: where PYTHONDONTWRITEBYTECODE is
set (this machine and CI) Python writes none on import, so without it every process (each worker, load generator
and test process the suite starts) compiled torch's modules again. This measures what that costs a process:
``--rounds`` interpreters each way, interleaved; "source" points ``PYTHONPYCACHEPREFIX`` at an empty folder, so
that no bytecode is found (and none is written). Figures: user + system CPU seconds of the child, and wall.

    .venv/bin/python -m tests.import_cost [--rounds 5] [--out docs/results/import-cost-<rev>.json]"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = "import torch, stream.pipeline.worker, stream.cli"


def one(env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    runs: dict[str, list[tuple[float, float]]] = {"bytecode": [], "source": []}
    with tempfile.TemporaryDirectory(prefix="stream-no-bytecode-") as empty:
        one(base)  # the files into the page cache, for both
        for _ in range(args.rounds):
            runs["bytecode"].append(one(base))
            runs["source"].append(one({**base, "PYTHONPYCACHEPREFIX": empty}))
    found = list(Path(sys.prefix).rglob("torch/__pycache__/__init__.*.pyc"))
    result = {
        "what": f"`{IMPORTS}` in a fresh interpreter, from the venv's bytecode and from source, interleaved",
        "python": sys.version.split()[0], "cpu_cores": os.cpu_count(), "rounds": args.rounds,
        "torch_bytecode_in_venv": bool(found),
        **{f"{way}_cpu_s": [round(c, 3) for c, _ in r] for way, r in runs.items()},
        **{f"{way}_wall_s": [round(w, 3) for _, w in r] for way, r in runs.items()},
        **{f"{way}_cpu_s_median": round(statistics.median(c for c, _ in r), 3) for way, r in runs.items()},
    }
    print(json.dumps(result, indent=1))
    if not found:
        print("import_cost: the venv holds no bytecode for torch: run `make venv` (it compiles it)", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
