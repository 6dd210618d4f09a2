"""``python -m stream demo``: broker, topics, 2 worker processes, 100,000 events (``--model minilm``: 2,000 texts
to embeddings), verified end to end."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from producers.events import generate_events
from producers.load import produce_events
from producers.texts import generate_texts, produce_texts
from stream.errors import ConfigError
from stream.kafka.topics import committed_offsets, create_topics, end_offsets
from stream.kafka_env import kafka_admin_env_config
from stream.local.broker import BrokerKind, LocalBroker, start_broker
from stream.local.children import WorkerProcess
from stream.models.demo import (
    DEFAULT_MODEL_DIR,
    TEXT_COPY_FIELDS,
    TEXT_EMBEDDING_SCHEMA,
    TEXT_EVENT_SCHEMA,
)
from stream.models.train_demo import ensure_trained
from stream.ops.verify import OutputReader, check_committed


@contextlib.contextmanager
def _broker_or_cluster(kind: BrokerKind, bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    broker: LocalBroker = start_broker(kind)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def run_demo(*, broker_kind: BrokerKind = "tansu", events: int | None = None, workers: int = 2, partitions: int = 8,
             bootstrap: str | None = None, seed: int = 42, model: str = "demo") -> int:
    """The fraud demo (``model="demo"``, 100,000 events by default) or the text one (``model="minilm"``: seeded
    synthetic texts to sentence embeddings, 2,000 by default)."""
    console = Console()
    text = model == "minilm"
    if model not in ("demo", "minilm"):
        raise ConfigError(f"demo --model {model!r}: demo or minilm")
    if events is None:
        events = 2_000 if text else 100_000
    worker_args: list[str] = []
    if text:
        worker_args = ["--model", "minilm", "--input-schema", TEXT_EVENT_SCHEMA, "--output-schema",
                       TEXT_EMBEDDING_SCHEMA, "--copy-fields", TEXT_COPY_FIELDS]
    else:
        console.print("[bold]demo[/bold]: training the demo model if needed ...")
        ensure_trained(DEFAULT_MODEL_DIR)
    run_id = uuid.uuid4().hex[:8]
    input_topic, output_topic, group = f"demo-events-{run_id}", f"demo-predictions-{run_id}", f"demo-{run_id}"
    logs = Path(tempfile.mkdtemp(prefix="stream-demo-"))
    where = "given cluster" if bootstrap else broker_kind
    with _broker_or_cluster(broker_kind, bootstrap) as servers:
        console.print(f"broker: {where} at {servers}")
        client = kafka_admin_env_config(os.environ)  # KAFKA_* (security settings) for the demo's own clients
        create_topics(servers, [input_topic, output_topic], partitions, client_config=client)
        # Tansu answers a new group's first join after ~half the session timeout: keep it short.
        env = {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}
        procs = [
            WorkerProcess(["--bootstrap-servers", servers, "--input-topic", input_topic, "--output-topic",
                           output_topic, "--group-id", group, *worker_args], logs / f"worker-{i}.log", env)
            for i in range(workers)
        ]
        ok = False
        try:
            reader = OutputReader(servers, output_topic, client_config=client)
            expected = set((generate_texts if text else generate_events)(events, seed=seed).event_ids)
            started = time.time()
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          console=console) as progress:
                produce_task = progress.add_task("producing ", total=events)
                if text:
                    delivered = produce_texts(servers, input_topic, events, seed=seed, config=client,
                                              on_progress=lambda n: progress.update(produce_task, completed=n))
                    failed = events - delivered
                else:
                    produced = produce_events(servers, input_topic, events, seed=seed, config=client,
                                              on_progress=lambda n: progress.update(produce_task, completed=n))
                    delivered, failed = produced.delivered, produced.failed
                read_task = progress.add_task("predictions", total=events)
                deadline = time.monotonic() + max(120.0, events / (20.0 if text else 500.0))
                while time.monotonic() < deadline and reader.missing(expected):
                    reader.read_until(expected, timeout_s=1.0)
                    progress.update(read_task, completed=len(expected) - reader.missing(expected))
                    if any(p.proc.poll() is not None for p in procs):
                        break
            finished = time.time()
            codes = [p.terminate() for p in procs]
            reader.poll(1.0)  # anything published during shutdown
            committed = committed_offsets(servers, group, input_topic, client)
            ends = end_offsets(servers, input_topic, client_config=client)
            commit_problems = check_committed(committed, ends)
            missing, dupes, unexpected = reader.missing(expected), reader.duplicates(), reader.unexpected(expected)
            summaries = [p.summary() for p in procs]
            batches = sum(s["batches"] for s in summaries if s)
            batched = sum(s["consumed"] for s in summaries if s)
            lat = reader.latencies_ms()
            table = Table(title=f"demo: {events:,} events, {workers} workers, {partitions} partitions, "
                                f"{where} broker")
            table.add_column("figure")
            table.add_column("value", justify="right")
            table.add_row("events produced", f"{delivered:,}")
            table.add_row("predictions read", f"{len(reader.predictions):,}")
            table.add_row("missing / duplicates / unexpected", f"{missing} / {dupes} / {unexpected}")
            table.add_row("throughput (first produce to last prediction)",
                          f"{len(reader.predictions) / max(finished - started, 1e-9):,.0f} events/s")
            if len(lat):
                table.add_row("e2e latency p50 / p99 (event ts -> reader)",
                              f"{np.percentile(lat, 50):,.0f} ms / {np.percentile(lat, 99):,.0f} ms")
            table.add_row("mean batch size", f"{batched / batches:.1f}" if batches else "n/a")
            table.add_row("worker exit codes", " ".join(map(str, codes)))
            table.add_row("committed offsets == end offsets", "yes" if not commit_problems else "NO")
            console.print(table)
            console.print(_samples(reader, text, seed))
            reader.close()
            ok = (failed == 0 and missing == 0 and dupes == 0 and unexpected == 0
                  and not commit_problems and all(c == 0 for c in codes))
            for problem in commit_problems:
                console.print(f"[red]{problem}[/red]")
        finally:
            for p in procs:
                p.kill()
            if not ok:
                for p in procs:
                    console.print(f"[dim]--- {p.log_path} (last lines)[/dim]\n" + p.output()[-3000:])
    console.print("[bold green]demo OK[/bold green]" if ok else "[bold red]demo FAILED[/bold red]")
    return 0 if ok else 1


def _samples(reader: OutputReader, text: bool, seed: int) -> Table:
    picks = reader.predictions[:: max(len(reader.predictions) // 5, 1)][:5]
    samples = Table(title="sample predictions")
    if not text:
        for col in ("event_id", "fraud_score", "is_fraud", "batch_size", "model", "input"):
            samples.add_column(col)
        for pred in picks:
            r = pred.record
            _, partition, offset = pred.source
            samples.add_row(str(r["event_id"]), f"{r['fraud_score']:.4f}", str(r["is_fraud"]),
                            str(r["batch_size"]), f"{r['model_name']} v{r['model_version']}", f"p{partition}@{offset}")
        return samples
    # each sample text beside the most similar other text of the run (cosine: the dot product of unit vectors)
    by_id = {p.event_id: np.asarray(p.record["embedding"], dtype=np.float32) for p in reader.predictions}
    ids = sorted(by_id, key=lambda e: int(e.rsplit("-", 1)[1]))
    matrix = np.stack([by_id[e] for e in ids])
    texts = dict(zip(ids, generate_texts(len(ids), seed=seed).texts, strict=False))
    first = picks[0].record if picks else {}
    samples.title = f"sample embeddings ({first.get('model_name')} {first.get('model_version')})"
    for col in ("text", "nearest other text", "cosine", "norm"):
        samples.add_column(col, no_wrap=True)
    for pred in picks:
        scores = matrix @ by_id[pred.event_id]
        scores[ids.index(pred.event_id)] = -2.0
        best = int(np.argmax(scores))
        samples.add_row(_clip(texts.get(pred.event_id, "?")), _clip(texts.get(ids[best], "?")),
                        f"{scores[best]:.3f}", f"{float(np.linalg.norm(by_id[pred.event_id])):.4f}")
    return samples


def _clip(text: str, width: int = 26) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
