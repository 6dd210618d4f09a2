"""Model rollouts as the README's "Rolling out a model" does them: a canary and its rollback, a switch of the group,
and a shadow run compared with `python -m stream compare`; all with the CLI, under load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState
from safetensors.torch import load_file, save_file

from producers.load import produce_events
from stream.kafka.topics import admin, create_topics
from stream.local.broker import free_port
from stream.local.children import WorkerProcess
from stream.models.demo import CONFIG_FILE, WEIGHTS_FILE
from tests.integration.harness import PARTITIONS, Pipeline, wait_for_assignment
from tests.probes import get
from tests.verify import OutputReader


def model_version(source: Path, target: Path, version: str, shift: float = 0.0) -> Path:
    """A copy of the demo model under another version; ``shift`` moves its last layer's bias (a changed model)."""
    shutil.copytree(source, target)
    config = json.loads((target / CONFIG_FILE).read_text())
    (target / CONFIG_FILE).write_text(json.dumps({**config, "version": version}))
    if shift:
        weights = load_file(str(target / WEIGHTS_FILE))
        last = sorted(k for k in weights if k.endswith("bias"))[-1]
        weights[last] = weights[last] + shift
        save_file(weights, str(target / WEIGHTS_FILE))
    return target


def test_canary_rollback_and_switch_lose_nothing_and_never_hand_a_partition_back(
        pipeline: Pipeline, model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    a_dir = model_version(model_dir, tmp_path / "model-a", "A")
    b_dir = model_version(model_dir, tmp_path / "model-b", "B")
    stop = threading.Event()
    request.addfinalizer(stop.set)  # a failed step does not leave the load running against a stopped broker
    produced: list[int] = []
    # The load runs until stopped (its count is a ceiling it never reaches): on a slow machine the steps below take
    # more than a fixed count's 40 s, and a load that had ended before the old replicas left gave the new version
    # nothing to answer on some partition.
    load = threading.Thread(target=lambda: produced.append(produce_events(
        pipeline.bootstrap, pipeline.input, 1_000_000, seed=71, rate=1500.0, stop=stop).delivered), daemon=True)
    ports: dict[WorkerProcess, int] = {}

    def worker(version_dir: Path) -> WorkerProcess:
        port = free_port()
        w = pipeline.worker("--model-dir", str(version_dir), "--metrics-port", str(port))
        ports[w] = port
        return w

    def predicted(ws: list[WorkerProcess]) -> float:
        """Predictions the workers have had acknowledged (their /metrics)."""
        total = 0.0
        for w in ws:
            status, text = get(ports[w], "/metrics")
            assert status == 200, text
            total += sum(float(line.split()[-1]) for line in text.splitlines()
                         if line.startswith("stream_predictions_total"))
        return total

    def until(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"not within {timeout_s:g}s: {what}"
            time.sleep(0.1)

    olds = [worker(a_dir) for _ in range(3)]
    for w in olds:
        wait_for_assignment(w)
    load.start()
    until("every old replica predicts", lambda: all(predicted([w]) > 0 for w in olds))
    canary = worker(b_dir)  # the canary takes its share of the partitions ...
    wait_for_assignment(canary)
    until("the canary predicts", lambda: predicted([canary]) > 0)
    top = subprocess.run([sys.executable, "-m", "stream", "top", "--once", "--interval", "1",
                          *[str(p) for p in ports.values()]], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "250"})
    assert top.returncode == 0, top.stderr
    # ... and stream top shows both versions side by side, a row each
    rows = {line.split("│")[1].strip(): line for line in top.stdout.splitlines() if "│ version" in line}
    assert set(rows) == {"demo-fraud-mlp:A (3)", "demo-fraud-mlp:B (1)"}, top.stdout
    assert all("fraud_score 0." in line for line in rows.values()), top.stdout  # each version's mean score
    logs_at = [len(w.output()) for w in olds]
    assert canary.terminate() == 0  # the rollback: its partitions go back to version A
    until("an old replica takes the canary's partitions back",
          lambda: any(" assigned " in w.output()[at:] for w, at in zip(olds, logs_at, strict=True)))
    switch_ms = time.time() * 1000.0
    news = [worker(b_dir) for _ in range(3)]  # the switch: the new version joins first ...
    for w in news:
        wait_for_assignment(w)

    client = admin(pipeline.bootstrap)  # kept: its futures fail once it is gone

    def settled() -> bool:
        [group] = client.describe_consumer_groups([pipeline.group]).values()
        described = group.result(timeout=30)
        return described.state == ConsumerGroupState.STABLE and len(described.members) == 6

    # (six members on four partitions: some of them hold none until the old ones leave)
    until("the group stable with the old and the new replicas in it", settled)
    for w in olds:  # ... then the old replicas leave together, so their partitions can only go to new ones
        w.proc.send_signal(15)
    # Each exits 0 on that one SIGTERM. (terminate() would send a second one to a process not yet gone: one that
    # had finished and was in the interpreter's finalization, whose handlers are the defaults again, died of it.)
    assert [w.wait(60) for w in olds] == [0, 0, 0]
    for w in olds:
        w.terminate()  # closes its log; the process has exited
    alone_from = predicted(news)  # the new version alone answers the load for a while (2 s of it)
    until("the new version alone predicts 3,000 more", lambda: predicted(news) >= alone_from + 3000)
    assert load.is_alive(), "the load ended before the switch was over"
    stop.set()
    load.join(120)
    reader = OutputReader(pipeline.bootstrap, pipeline.output)
    try:
        from producers.events import generate_events

        expected = set(generate_events(produced[0], seed=71).event_ids)
        assert reader.read_until(expected, timeout_s=120), f"{reader.missing(expected)} lost"
        versions: dict[int, list[tuple[int, str, float]]] = defaultdict(list)
        for p in reader.predictions:
            _, partition, offset = p.source
            versions[partition].append((offset, str(p.record["model_version"]), float(p.record["predicted_ts_ms"])))
    finally:
        reader.close()
    assert {v for rows in versions.values() for _, v, _ in rows} == {"A", "B"}
    for partition, rows in versions.items():
        after = [v for _, v, ts in sorted(rows) if ts >= switch_ms]
        first_b = after.index("B") if "B" in after else len(after)
        assert "A" not in after[first_b:], f"partition {partition} went back from B to A after the switch began"
        assert after and after[-1] == "B", f"partition {partition} did not end on B"
    assert [w.terminate() for w in news] == [0, 0, 0]


def test_a_shadow_run_of_the_same_model_agrees_and_of_a_changed_one_does_not(
        pipeline: Pipeline, model_dir: Path, tmp_path: Path) -> None:
    pipeline.produce(3000, seed=72)
    baseline = pipeline.worker("--stop-at-end")
    assert baseline.wait(120) == 0, baseline.output()[-3000:]
    baseline.kill()  # gone already: closes its log
    same = model_version(model_dir, tmp_path / "same", "same-weights")
    changed = model_version(model_dir, tmp_path / "changed", "changed", shift=0.5)
    reports = {}
    for name, version_dir in (("same", same), ("changed", changed)):
        shadow_topic = f"{pipeline.output}-shadow-{name}"
        create_topics(pipeline.bootstrap, [shadow_topic], PARTITIONS)
        shadow = WorkerProcess(
            ["--bootstrap-servers", pipeline.bootstrap, "--input-topic", pipeline.input, "--output-topic",
             shadow_topic, "--group-id", f"{pipeline.group}-shadow-{name}", "--model-dir", str(version_dir),
             "--shadow", "--start-from", "earliest", "--stop-at-end"], tmp_path / f"shadow-{name}.log",
            {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
        code = shadow.wait(120)
        shadow.kill()
        assert code == 0, shadow.output()[-3000:]
        out = tmp_path / f"compare-{name}.json"
        compare = subprocess.run([sys.executable, "-m", "stream", "compare", pipeline.output, shadow_topic,
                                  "--bootstrap-servers", pipeline.bootstrap, "--json", str(out),
                                  "--min-agreement", "1.0"], capture_output=True, text=True, timeout=120)
        reports[name] = (compare.returncode, json.loads(out.read_text()), compare.stdout)
    code, same_report, text = reports["same"]
    assert code == 0 and same_report["joined"] == 3000 and same_report["agreement"] == 1.0, text
    code, changed_report, text = reports["changed"]
    assert code == 1 and changed_report["joined"] == 3000, text
    score = changed_report["fields"]["fraud_score"]
    assert score["agreement"] < 0.5 and score["mean_abs_diff"] > 1e-3, text  # the scores moved
    assert changed_report["fields"]["event_id"]["agreement"] == 1.0, "joined by lineage: the same events"
