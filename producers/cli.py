"""``python -m producers``: publish N demo events, with progress and a delivery summary.

librdkafka producer settings pass through from ``KAFKA_*`` / ``KAFKA_PRODUCER_*`` variables, as for the worker
(``KAFKA_PRODUCER_LINGER_MS=0`` -> ``linger.ms=0``)."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from producers.load import produce_events
from stream.kafka.native import unavailable as native_unavailable
from stream.kafka_env import kafka_env_config


def positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers", description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=positive_int, required=True)
    parser.add_argument("--rate", type=positive_float, default=None, help="events/s (default: as fast as possible)")
    parser.add_argument("--seed", type=int, default=0, help="event stream seed; ids are unique per (seed, index)")
    parser.add_argument("--start", type=positive_int, default=0, help="index of the first event")
    parser.add_argument("--no-native-producer", dest="native", action="store_false",
                        help="produce through confluent-kafka, one produce() call per event (default: the C producer "
                             "of stream.kafka.native where it is built, one call per burst)")
    parser.add_argument("--pregenerate", action="store_true",
                        help="draw and frame every event before sending the first (about 200 bytes of memory an "
                             "event), so that a paced run only stamps and sends: for latency measurements on a "
                             "machine the generator shares with the pipeline")
    args = parser.parse_args(argv)
    native = args.native and native_unavailable() is None
    _, config = kafka_env_config(os.environ)
    config.pop("bootstrap.servers", None)  # the flag wins
    console = Console(stderr=True)
    if console.is_terminal:
        columns = (TextColumn("producing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("produce", total=args.count)
            summary = produce_events(args.bootstrap_servers, args.topic, args.count, seed=args.seed,
                                     start=args.start, rate=args.rate, config=config,
                                     on_progress=lambda n: progress.update(task, completed=n), native=native,
                                     pregenerate=args.pregenerate)
    else:
        summary = produce_events(args.bootstrap_servers, args.topic, args.count, seed=args.seed, start=args.start,
                                 rate=args.rate, config=config, native=native, pregenerate=args.pregenerate)
    print(summary.line(), flush=True)
    return 0 if summary.failed == 0 and summary.delivered == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
