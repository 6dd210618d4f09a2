"""The local cluster's own command under exactly-once workers, every part started from the command line as a user
would: ``python -m stream broker --kind kafka --nodes 3``, ``topics create``, ``train-model``, three
``python -m stream worker --guarantee exactly-once`` and a paced ``python -m producers``; two nodes frozen in turn
(SIGSTOP, ``--freeze-s``, SIGCONT) and a third SIGKILLed for good, each found by its id in the status file the
command writes. Checked by an independent read_committed reader: nothing lost, nothing twice, committed offsets at
the input's end, no transaction left open, every worker and the command alive, progress within a bound after each
fault. Part of `make chaos` (about 3 minutes); ``--results FILE`` writes the figures."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from producers.events import generate_events
from stream.local.children import WorkerProcess
from tests.chaos.verifier import Verifier, hanging_transactions
from tests.cluster_cli import ClusterCommand, wait
from tests.verify import check_committed, committed_offsets, end_offsets

PROGRESS_BOUND_S = 90.0  # after a fault ends, the group's committed offsets advance within this
WORKER_ENV = {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}


def _cli(*args: str, timeout_s: float = 300.0) -> str:
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"python -m {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    """The group's committed offsets summed; None while they cannot be read (the coordinator moving)."""
    try:
        return sum(max(o, 0) for o in committed_offsets(bootstrap, group, topic).values())
    except KafkaException:
        return None


def _commit_problems(bootstrap: str, group: str, topic: str) -> list[str]:
    try:
        return check_committed(committed_offsets(bootstrap, group, topic), end_offsets(bootstrap, topic))
    except KafkaException as exc:
        return [f"committed or end offsets not read: {exc}"]


def _tail(worker: WorkerProcess, chars: int = 2500) -> str:
    """A worker's last log lines, without librdkafka's own."""
    return "\n".join(line for line in worker.output().splitlines() if "rdkafka" not in line)[-chars:]


def run(workdir: Path, *, events: int = 150_000, rate: float = 1_000.0, freeze_s: float = 20.0, gap_s: float = 15.0,
        model_dir: Path | None = None, seed: int = 48, say: Any = print) -> dict[str, Any]:
    cmd = ClusterCommand(workdir)
    workers: list[WorkerProcess] = []
    load: subprocess.Popen[bytes] | None = None
    run_id = uuid.uuid4().hex[:6]
    topic_in, topic_out, topic_dlq, group = (f"cc-in-{run_id}", f"cc-out-{run_id}", f"cc-dlq-{run_id}",
                                             f"cc-{run_id}")
    try:
        bootstrap = cmd.bootstrap
        say(f"cluster up: {bootstrap}, status {cmd.status_path}")
        _cli("stream", "topics", "create", "--bootstrap-servers", bootstrap, "--partitions", "6", topic_in, topic_out,
             topic_dlq)
        if model_dir is None:
            model_dir = workdir / "model"
            _cli("stream", "train-model", "--out", str(model_dir), timeout_s=900)
        for slot in range(3):
            workers.append(WorkerProcess(
                ["--bootstrap-servers", bootstrap, "--input-topic", topic_in, "--output-topic", topic_out,
                 "--dlq-topic", topic_dlq, "--group-id", group, "--model-dir", str(model_dir), "--guarantee",
                 "exactly-once", "--transactional-id", f"{group}-r{slot}", "--commit-interval-ms", "200"],
                workdir / f"worker-{slot}.log", WORKER_ENV))
        with open(workdir / "producers.log", "wb") as out:
            load = subprocess.Popen([sys.executable, "-m", "producers", "--bootstrap-servers", bootstrap, "--topic",
                                     topic_in, "--count", str(events), "--rate", str(rate), "--seed", str(seed)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started = time.monotonic()
        wait(lambda: (_committed(bootstrap, group, topic_in) or 0) > 0, 120, "the workers' first committed offsets")
        faults: list[dict[str, Any]] = []
        stuck: list[dict[str, Any]] = []  # a fault after which the offsets did not advance in time: what was seen

        def progress_after(what: str) -> float | None:
            """Seconds until the committed offsets are ``rate`` past where they were when the fault ended (or
            where they are first read after it)."""
            start = time.monotonic()
            first: list[int] = []

            def advanced() -> bool:
                now = _committed(bootstrap, group, topic_in)
                if now is None:
                    return False
                first[:] = first or [now]
                return now >= min(first[0] + rate, events)  # the load may be all but done

            try:
                wait(advanced, PROGRESS_BOUND_S, f"committed offsets advancing by {rate:.0f} after {what}")
            except AssertionError as exc:
                say(f"  {exc}")
                stuck.append({"after": what, "committed": _committed(bootstrap, group, topic_in),
                              "workers": [_tail(w) for w in workers]})
                return None
            return round(time.monotonic() - start, 1)

        for node in (1, 2):
            time.sleep(gap_s)
            pid = cmd.node_pid(node)
            say(f"freezing node {node} (pid {pid}) for {freeze_s:g} s")
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(freeze_s)
            finally:
                os.kill(pid, signal.SIGCONT)
            faults.append({"node": node, "pid": pid, "fault": f"SIGSTOP {freeze_s:g} s, SIGCONT",
                           "at_s": round(time.monotonic() - started - freeze_s, 1),
                           "progress_after_s": progress_after(f"node {node} thawed")})
            say(f"  {faults[-1]}")
        time.sleep(gap_s)
        pid = cmd.node_pid(3)
        say(f"killing node 3 (pid {pid}) for good")
        os.kill(pid, signal.SIGKILL)
        faults.append({"node": 3, "pid": pid, "fault": "SIGKILL", "at_s": round(time.monotonic() - started, 1),
                       "progress_after_s": progress_after("node 3 killed")})
        say(f"  {faults[-1]}")
        load_rc = load.wait(events / rate + 300)
        load_line = (workdir / "producers.log").read_text(errors="replace").strip().splitlines()[-1:]
        caught_up_s = wait(lambda: not _commit_problems(bootstrap, group, topic_in), 180,
                           "committed offsets at the input's end offsets")
        expected = set(generate_events(events, seed=seed).event_ids)
        verifier = Verifier(bootstrap, topic_out, topic_dlq)
        try:
            verifier.read_until(expected, time.monotonic() + 180)
            verifier.read_more(3)
            counts = verifier.id_counts()
            lost = len(expected - counts.keys())
            duplicates = sum(v - 1 for v in counts.values() if v > 1)
            duplicate_details = verifier.duplicate_details(5)
        finally:
            verifier.close()
        status = cmd.status()
        alive = [w.proc.poll() is None for w in workers]
        result: dict[str, Any] = {
            "events": events, "rate": rate, "freeze_s": freeze_s, "load_exit": load_rc, "load": load_line,
            "faults": faults, "caught_up_after_load_s": round(caught_up_s, 1), "lost": lost,
            "duplicates": duplicates, "duplicate_details": duplicate_details,
            "commit_problems": _commit_problems(bootstrap, group, topic_in),
            "hanging_transactions": hanging_transactions(bootstrap, [topic_out, topic_dlq]),
            "workers_alive": alive,
            # per worker: transactions aborted and rewound, producers replaced after a fatal state
            "worker_aborts": [w.output().count("transaction aborted, rewinding") for w in workers],
            "worker_replacements": [w.output().count("a fresh producer with the same") for w in workers],
            "worker_failures": [f"worker {i} exited {w.proc.returncode}: {_tail(w)}"
                                for i, w in enumerate(workers) if w.proc.poll() is not None],
            "stuck": stuck,
            "command_running": cmd.proc.poll() is None,
            "nodes": [{k: n[k] for k in ("id", "state", "ended")} for n in status["nodes"]],
            "command_log": [line for line in cmd.log().splitlines() if "cluster_supervisor" in line],
        }
        result["ok"] = (not stuck and load_rc == 0 and lost == 0 and duplicates == 0 and not result["commit_problems"]
                        and not result["hanging_transactions"] and all(alive)
                        and result["command_running"])
        result["worker_exits_on_sigterm"] = [w.terminate() for w in workers]
        return result
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait(10)
        for w in workers:
            w.kill()
        cmd.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.cluster_command", description=__doc__)
    parser.add_argument("--events", type=int, default=150_000,
                        help="events offered at --rate (150,000 at 1,000/s: the load outlasts the faults)")
    parser.add_argument("--rate", type=float, default=1_000.0)
    parser.add_argument("--freeze-s", type=float, default=20.0)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: trained now by train-model")
    parser.add_argument("--results", type=Path, default=None, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="cluster-command-") as tmp:
        result = run(Path(tmp), events=args.events, rate=args.rate, freeze_s=args.freeze_s,
                     model_dir=args.model_dir, say=lambda text: print(text, file=sys.stderr, flush=True))
    report = {"command": " ".join(["python -m tests.chaos.cluster_command", *(argv or sys.argv[1:])]),
              "started": began, **result}
    print(json.dumps(report, indent=2))
    if args.results is not None:
        args.results.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
