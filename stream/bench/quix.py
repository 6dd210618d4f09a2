"""Quix Streams as a benchmark contender, in a virtual environment of its own.

Quix Streams 3.28.1 pins ``confluent-kafka<2.13`` and ``pydantic<2.14``, older than the worker's, so the
benchmark makes a venv for it in the cache (``python -m venv`` + ``pip install quixstreams==3.28.1``) whose
``.pth`` file appends this environment's site-packages after its own: torch, numpy and fastavro come from here,
confluent-kafka and pydantic from Quix's pins. The contenders run as ``<quix venv>/bin/python -m
stream.bench.quix NAME ...`` with the repository on ``PYTHONPATH`` and print the contenders' JSON line:

- ``quix-apply``: ``sdf.apply`` per record (decode, a forward pass of one, encode) and ``sdf.to_topic``, the
  shape Quix's documentation shows;
- ``quix-sink``: a ``BatchingSink`` whose ``write`` takes each checkpoint's batch of a partition, decodes it,
  runs one forward pass and produces the predictions (flushed before the checkpoint commits its offsets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

QUIX_VERSION = "3.28.1"
ROOT = Path(__file__).resolve().parents[2]


def quix_venv() -> Path:
    from stream.local.cache import cache_dir

    return cache_dir() / f"quixstreams-{QUIX_VERSION}" / "venv"


def ensure_quix_python() -> Path:
    """The Quix venv's interpreter, made once (about a minute: Quix and its pinned dependencies from PyPI)."""
    from stream.local.cache import fill_once

    venv = quix_venv()
    python = venv / "bin" / "python"

    def fill() -> str:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"quixstreams=={QUIX_VERSION}"],
                              capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"installing quixstreams {QUIX_VERSION} failed:\n{proc.stdout[-2000:]}"
                               f"{proc.stderr[-2000:]}")
        return QUIX_VERSION

    fill_once(venv, fill)
    # This environment's packages after the venv's own (rewritten each time: this environment may have moved).
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (Path(own) / "zz_stream_bench.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return python


def command(name: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run contender ``name`` in the Quix venv."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [str(ensure_quix_python()), "-m", "stream.bench.quix", name, *args], env


# ---------------------------------------------------------------------------------------------- in the Quix venv
def _application(args: argparse.Namespace) -> Any:
    from quixstreams import Application

    # As the other contenders: fetch.queue.backoff.ms as the worker's, an idempotent acks=all producer with a
    # 5 ms linger and lz4; Quix's own defaults otherwise (a checkpoint every 5 s).
    return Application(broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
                       auto_create_topics=False, loglevel="WARNING",
                       consumer_extra_config={"fetch.queue.backoff.ms": 10},
                       producer_extra_config={"linger.ms": 5, "compression.type": "lz4"})


def quix_apply(args: argparse.Namespace) -> dict[str, Any]:
    from quixstreams import message_context

    from stream.bench.contenders import _model, _predict_records

    handler = _model(args)
    app = _application(args)
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(args.output, key_serializer="bytes", value_serializer="bytes")
    state: dict[str, Any] = {"first": None}

    def predict(value: bytes) -> bytes:
        if state["first"] is None:
            state["first"] = time.time()
        ctx = message_context()
        return _predict_records(handler, [value], [(ctx.topic, ctx.partition, ctx.offset)])[0]

    sdf = app.dataframe(source).apply(predict)
    sdf.to_topic(sink)
    app.run(count=args.events, collect=False)
    return {"events": args.events, "first_ts": state["first"], "last_ts": time.time()}


def quix_sink(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Producer
    from quixstreams.sinks import BatchingSink, SinkBatch

    from stream.bench.contenders import _model, _predict_records

    handler = _model(args)
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "compression.type": "lz4",
                         "enable.idempotence": True, "acks": "all"})
    state: dict[str, Any] = {"first": None, "written": 0}

    class PredictionSink(BatchingSink):  # type: ignore[misc]
        def write(self, batch: SinkBatch) -> None:
            items = list(batch)
            payloads = _predict_records(handler, [item.value for item in items],
                                        [(batch.topic, batch.partition, item.offset) for item in items])
            for item, payload in zip(items, payloads, strict=True):
                producer.produce(args.output, payload, item.key)
            if producer.flush(60) != 0:
                raise RuntimeError("predictions not delivered within 60 s")
            state["written"] += len(items)

    def first_seen(value: bytes) -> None:
        if state["first"] is None:
            state["first"] = time.time()

    app = _application(args)
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="bytes")
    sdf = app.dataframe(source).update(first_seen)
    sdf.sink(PredictionSink())
    app.run(count=args.events, collect=False)
    return {"events": state["written"], "first_ts": state["first"], "last_ts": time.time()}


CONTENDERS = {"quix-apply": quix_apply, "quix-sink": quix_sink}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.quix")
    parser.add_argument("name", choices=sorted(CONTENDERS))
    for flag in ("--bootstrap", "--input", "--output", "--group", "--model-dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--events", type=int, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(CONTENDERS[args.name](args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
