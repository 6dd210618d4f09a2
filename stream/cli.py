"""``python -m stream``: worker, broker, broker-node, registry, topics, train-model, demo, gateway, compare, read,
top, and the benchmarks (their flags and runners in `stream.bench.cli`). Thin: parse, set up logging, call one
function."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream.errors import ConfigError, StreamError
from stream.logs import setup_logging as _setup_logging

log = logging.getLogger("stream")
DESCRIPTION = ("Kafka micro-batch inference: workers read events from an input topic in batches, run a PyTorch model "
               "on them and publish one prediction per event, committing only what was published; a gateway "
               "answers HTTP callers through the same topics. Local brokers, a schema registry, topic tools and "
               "the benchmarks come with it.")


# The worker's flags by group, in the order --help shows them; each flag's help and default are its WorkerSettings
# field's (`stream.flags`).
WORKER_FLAG_GROUPS = {
    "Kafka": ["bootstrap_servers", "input_topic", "output_topic", "group_id", "dlq_topic", "start_from",
              "commit_interval_ms", "reply_topics", "copy_headers"],
    "batching": ["max_batch_size", "max_wait_ms", "batch_policy", "max_batch_tokens", "max_batch_bytes",
                 "max_inflight_batches"],
    "model": ["model", "model_dir", "device", "max_tokens", "dtype", "fixed_shapes", "cuda_graphs", "packing"],
    "schemas": ["schema_registry_url", "schemas_dir", "input_schema", "output_schema", "input_map", "copy_fields",
                "subject_name_strategy", "provenance_headers"],
    "guarantees and failures": ["guarantee", "transaction_interval_ms", "transactional_id", "max_input_bytes",
                                "model_retries", "retry_backoff_ms", "dlq_max_fraction", "dlq_window",
                                "stall_timeout_s", "model_timeout_s", "shutdown_timeout_s", "stop_at_end",
                                "shadow"],
    "metrics and health": ["metrics_port", "metrics_host", "metrics_port_file", "log_level", "max_traced_per_s"],
    "tuning": ["prepare_threads", "torch_threads", "gpu_overlap", "gil_switch_interval_ms",
               "malloc_mmap_threshold_kib", "native_producer", "native_consumer"],
}


def _worker_parser(sub: Any) -> None:
    from stream.config import WorkerSettings
    from stream.flags import add_setting_flags

    p = sub.add_parser("worker", help="run one inference worker (a consumer-group member)",
                       epilog="Every flag also reads STREAM_<FLAG> (STREAM_INPUT_TOPIC, ...); a flag wins.")
    add_setting_flags(p, WorkerSettings.model_fields, WORKER_FLAG_GROUPS,
                      switches={"stop_at_end", "shadow", "fixed_shapes", "cuda_graphs"})
    p.add_argument("--summary-json", type=Path, help="also write the shutdown summary to this file as JSON")


def run_worker(args: argparse.Namespace, early_stop: list[int]) -> int:
    """``early_stop`` collects SIGTERM/SIGINT received before the worker's own handlers exist (while torch
    and the model load): a replica stopped during start-up exits 0 without consuming."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: early_stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: early_stop.append(signum))
    # `kill -USR2 <pid>` prints every thread's stack to stderr (a worker that looks stuck), and it goes on.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    from stream.config import WorkerSettings, load_settings

    # Every setting has a flag of the same name; flags left out (None) fall back to STREAM_* env, then defaults.
    settings = load_settings({f: getattr(args, f, None) for f in WorkerSettings.model_fields})
    _setup_logging(settings.log_level)
    from stream.pipeline.malloc import mmap_threshold, tune_malloc

    threshold = mmap_threshold(settings.model, settings.malloc_mmap_threshold_kib)
    log.debug("glibc malloc tuned (mmap threshold %d bytes): %s", threshold, tune_malloc(threshold=threshold))
    from stream.errors import StoppedAtStartUp
    from stream.pipeline.worker import Worker, exit_now

    try:
        worker = Worker(settings, stopping=lambda: bool(early_stop))
    except StoppedAtStartUp as exc:
        log.info("signal %s during start-up: stopping before %s was done, without consuming",
                 signal.Signals(early_stop[0]).name, exc)
        return 0
    worker.install_signal_handlers()
    if early_stop:
        log.info("signal %s during start-up: stopping before consuming", signal.Signals(early_stop[0]).name)
        worker.request_stop()
    summary = worker.run()
    print(f"worker summary: {summary.line()}", flush=True)
    if args.summary_json is not None:
        args.summary_json.write_text(json.dumps(dataclasses.asdict(summary), indent=2) + "\n")
    if worker.close_abandoned or worker.threads_abandoned:
        # The client's destructor would wait for the close that never returned; the interpreter's end, for a
        # model call that never returned (torch's thread pools).
        exit_now(summary.exit_code)
    return summary.exit_code


def _foreground(start: Callable[[], Any], started: Callable[[Any], str]) -> int:
    """Start a server (a SIGTERM/SIGINT meanwhile ends the start: exit 0), print ``started(server)``, then wait
    until SIGTERM/SIGINT (exit 0) or until the server's process ends (exit 1); the server is stopped by PID either
    way. (A cluster: `stream.local.cluster_supervisor.run_foreground`.)"""
    from stream.local.children import StopSignals

    signals = StopSignals()
    server = start()
    signals.started()
    try:
        print(started(server), flush=True)
        while not signals.received and server.proc.poll() is None:
            time.sleep(0.2)
    finally:
        server.stop()
    return 0 if signals.received else 1


def run_broker(args: argparse.Namespace) -> int:
    _setup_logging()
    from stream.local.broker import start_broker

    if args.restart_delay_s < 0:
        raise StreamError(f"--restart-delay-s must be 0 or more, not {args.restart_delay_s}")
    if args.nodes > 1 or args.sasl:
        if args.kind != "kafka" or args.port is not None:
            raise StreamError("--nodes N and --sasl: Apache Kafka only (--kind kafka), on free ports (no --port)")
        from stream.local.broker import start_kafka_cluster
        from stream.local.children import StopSignals

        signals = StopSignals()
        cluster = start_kafka_cluster(args.nodes, sasl=args.sasl)
        pids = " ".join(f"{n.node_id}:{n.pid}" for n in cluster.nodes)
        if cluster.security is not None:  # the admin's settings, for the operator who started it
            print("\n".join(f"export {k}={v}" for k, v in cluster.security.env(
                "admin", cluster.security.admin_password).items()), flush=True)
        from stream.local.cluster_supervisor import run_foreground

        return run_foreground(cluster, f"kafka cluster of {args.nodes} node{'s' if args.nodes > 1 else ''} "
                                       f"(node:pid {pids}) bootstrap={cluster.bootstrap}"
                                       + (" SASL_SSL (SCRAM-SHA-512), ACLs on" if args.sasl else ""),
                              signals, restart_dead=args.restart_dead_nodes, restart_delay_s=args.restart_delay_s)
    if args.restart_dead_nodes:
        raise StreamError("--restart-dead-nodes: a cluster (--kind kafka --nodes 3); a single broker is the whole "
                          "cluster")
    if args.port is not None:
        from stream.local.broker import check_port_free

        check_port_free(args.port)  # else a broker already there would be taken for the one started
    return _foreground(lambda: start_broker(args.kind, args.port),
                       lambda broker: f"{broker.kind} broker pid={broker.pid} bootstrap={broker.bootstrap}")


def run_broker_node(args: argparse.Namespace) -> int:
    from stream.local.cluster_supervisor import find_cluster, format_status, request

    status_path = find_cluster(args.cluster)
    if args.action == "status":
        print(format_status(json.loads(status_path.read_text())), flush=True)
        return 0
    if args.node is None:
        raise StreamError(f"broker-node {args.action}: which node? (an id, e.g. `broker-node {args.action} 2`)")
    ok, message = request(status_path, args.action, args.node, args.timeout_s)
    print(message, flush=True, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def run_registry(args: argparse.Namespace) -> int:
    _setup_logging()
    from stream.local.broker import check_port_free
    from stream.local.registry_server import start_registry

    if args.port is not None:
        check_port_free(args.port)

    return _foreground(lambda: start_registry(args.port),
                       lambda registry: f"schema registry (Apicurio, in memory) pid={registry.pid} url={registry.url}")


def run_train(args: argparse.Namespace) -> int:
    _setup_logging()
    from stream.models.demo import DEFAULT_MODEL_DIR
    from stream.models.train_demo import train

    out = args.out or DEFAULT_MODEL_DIR
    result = train(out)
    print(f"demo model saved to {out}: held-out ROC AUC {result['auc']:.4f}, "
          f"fraud rate {result['positive_rate']:.3f}")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    _setup_logging("WARNING")
    from stream.local.demo import run_demo as demo

    return demo(broker_kind=args.broker, events=args.events, workers=args.workers, partitions=args.partitions,
                bootstrap=args.bootstrap_servers, model=args.model)


def build_parser() -> argparse.ArgumentParser:
    from stream.bench import cli as bench_cli

    # Nothing here imports torch: `python -m stream --help` and the broker commands start without it.
    parser = argparse.ArgumentParser(
        prog="python -m stream", description=DESCRIPTION,
        epilog="`python -m stream COMMAND --help` for a command's flags; README.md and docs/ for the rest.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _worker_parser(sub)
    b = sub.add_parser("broker", help="run a local broker, or a cluster of Kafka nodes, on 127.0.0.1 in the "
                                       "foreground")
    b.add_argument("--kind", choices=["kafka", "tansu"], default="kafka",
                   help="kafka: Apache Kafka (needs java 17 and mvn; the default); tansu: the embedded broker")
    b.add_argument("--port", type=int, default=None, help="default: a free port")
    b.add_argument("--nodes", type=int, default=1,
                   help="Apache Kafka: this many KRaft nodes in one replicated cluster (1; with 3 or more: "
                        "replication factor 3, min.insync.replicas 2)")
    b.add_argument("--sasl", action="store_true",
                   help="Apache Kafka: a SASL_SSL listener (SCRAM-SHA-512, a certificate made now) and the "
                        "StandardAuthorizer; prints the admin's KAFKA_* settings (the password among them)")
    b.add_argument("--restart-dead-nodes", action="store_true",
                   help="a cluster: restart a node whose process ended, on its own data, --restart-delay-s after "
                        "(default: it stays down; the cluster runs on while a quorum of its nodes does, and "
                        "stops them all, exit 1, when that quorum is lost)")
    b.add_argument("--restart-delay-s", type=float, default=5.0,
                   help="with --restart-dead-nodes (5; doubled while a node fails to start, up to a minute)")
    bn = sub.add_parser("broker-node", help="a running local cluster (broker --nodes N): its nodes' status, or stop, "
                                            "start or restart one by id (e.g. to script kill, wait, restart)")
    bn.add_argument("action", choices=["status", "stop", "start", "restart"], help="what to do")
    bn.add_argument("node", type=int, nargs="?", help="the node's id (1..N); not for status")
    bn.add_argument("--cluster", type=Path, default=None,
                    help="the status file the broker command printed (or its folder); default: the one local "
                         "cluster running")
    bn.add_argument("--timeout-s", type=float, default=120.0,
                    help="how long to wait for start or restart to answer (the node listening again) (120)")
    r = sub.add_parser("registry", help="run a Confluent-compatible schema registry (Apicurio, in memory) on "
                                        "127.0.0.1 in the foreground")
    r.add_argument("--port", type=int, default=None, help="default: a free port")
    m = sub.add_parser("train-model", help="train the demo fraud model (safetensors + config.json)")
    m.add_argument("--out", type=Path, default=None, help="default: artifacts/demo-fraud")
    d = sub.add_parser("demo", help="the whole pipeline end to end on a local broker, verified")
    d.add_argument("--broker", choices=["kafka", "tansu"], default="tansu",
                   help="the local broker to start: tansu (embedded, the default) or kafka (java 17 and mvn)")
    d.add_argument("--bootstrap-servers", default=None, help="use this cluster instead of starting a broker")
    d.add_argument("--events", type=int, default=None, help="default 100,000 (--model minilm: 2,000)")
    d.add_argument("--model", choices=["demo", "minilm"], default="demo",
                   help="minilm: seeded synthetic texts to sentence embeddings (needs the text extra)")
    d.add_argument("--workers", type=int, default=2, help="worker replicas in the group (2)")
    d.add_argument("--partitions", type=int, default=8, help="partitions of the input topic (8)")
    bench_cli.add_parsers(sub)
    from stream import gateway
    from stream.ops import compare, read, topics

    topics.add_parser(sub)
    gateway.add_parser(sub)
    compare.add_parser(sub)
    read.add_parser(sub)
    top = sub.add_parser("top", help="a live view of running replicas from their metrics endpoints (Ctrl-C ends it)")
    top.add_argument("targets", nargs="+", metavar="ENDPOINT",
                     help="each replica's --metrics-port: PORT (on 127.0.0.1), HOST:PORT or a URL")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (1)")
    top.add_argument("--once", action="store_true", help="print one table (rates over one interval) and exit")
    _describe(sub)
    return parser


def _describe(sub: Any) -> None:
    """Each command's one line (its entry in the list) as its own --help's description where it has none."""
    lines = {a.dest: a.help for a in sub._choices_actions}
    for name, command in sub.choices.items():
        if command.description is None and lines.get(name):
            command.description = lines[name][0].upper() + lines[name][1:] + "."
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _describe(action)


def run_gateway(args: argparse.Namespace) -> int:
    from stream import gateway

    # Two arenas and buffers of 128 KiB or more mmap'd: the bodies and TLS buffers of callers that come and go
    # are given back instead of keeping the heap at its high-water mark.
    from stream.pipeline.malloc import tune_malloc

    tune_malloc()

    return gateway.run(args)


def run_compare(args: argparse.Namespace) -> int:
    from stream.ops import compare

    return compare.run(args)


def run_read(args: argparse.Namespace) -> int:
    from stream.ops import read

    return read.run(args)


def run_topics(args: argparse.Namespace) -> int:
    from stream.ops import topics

    return topics.run(args)


def run_top(args: argparse.Namespace) -> int:
    from stream.ops.top import run

    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, not {args.interval}")
    return run(args.targets, args.interval, args.once)


def main(argv: list[str] | None = None, early_signals: list[int] | None = None) -> int:
    args = build_parser().parse_args(argv)
    early = early_signals if early_signals is not None else []
    if args.command != "worker":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if early:
            return 128 + early[0]
    runners = {"worker": lambda a: run_worker(a, early), "broker": run_broker, "broker-node": run_broker_node,
               "registry": run_registry, "topics": run_topics, "train-model": run_train, "demo": run_demo,
               "top": run_top, "gateway": run_gateway, "compare": run_compare, "read": run_read}
    if args.command.startswith("bench"):
        from stream.bench.cli import RUNNERS

        runners.update(RUNNERS)
    try:
        return runners[args.command](args)
    except StreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
