"""``python -m stream topics create | list | describe | delete``: topic administration against any Kafka (the
``KAFKA_*`` / ``KAFKA_ADMIN_*`` variables carry security settings, as for the worker)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from confluent_kafka import KafkaException

from stream.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser("topics", help="create, list, describe or delete topics",
                       description="Topic administration. Security settings come from KAFKA_* and KAFKA_ADMIN_* "
                                   "variables (e.g. KAFKA_SECURITY_PROTOCOL=SASL_SSL), as for the worker.")
    tsub = t.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    bootstrap = {"required": True, "help": "the brokers (host:port,...)"}
    tc = tsub.add_parser("create", help="create topics (an existing topic is fine)")
    tc.add_argument("--bootstrap-servers", **bootstrap)
    tc.add_argument("--partitions", type=int, default=8, help="partitions of each new topic (8)")
    tc.add_argument("--replication-factor", type=int, default=-1,
                    help="default: the cluster's default.replication.factor")
    tc.add_argument("topics", nargs="+", metavar="TOPIC", help="the topics' names")
    tl = tsub.add_parser("list", help="the topics, with their partition counts")
    tl.add_argument("--bootstrap-servers", **bootstrap)
    tl.add_argument("--all", action="store_true", help="the internal ones too (__consumer_offsets, ...)")
    td = tsub.add_parser("describe", help="each partition's leader, replicas, in-sync replicas and offsets")
    td.add_argument("--bootstrap-servers", **bootstrap)
    td.add_argument("topics", nargs="+", metavar="TOPIC", help="the topics' names")
    tx = tsub.add_parser("delete", help="delete topics and every record in them")
    tx.add_argument("--bootstrap-servers", **bootstrap)
    tx.add_argument("topics", nargs="+", metavar="TOPIC", help="the topics' names")


def run(args: argparse.Namespace) -> int:
    from stream.kafka import topics
    from stream.kafka_env import kafka_admin_env_config

    config = kafka_admin_env_config(os.environ)
    bootstrap = args.bootstrap_servers
    command = args.topics_command
    if command == "create":
        status = topics.create_topics(bootstrap, args.topics, args.partitions,
                                      replication_factor=args.replication_factor, client_config=config)
        for name, state in status.items():
            print(f"{name}: {state}")
        return 0
    client = topics.admin(bootstrap, **config)
    try:
        metadata = client.list_topics(timeout=15)
    except KafkaException as exc:
        raise ConfigError(f"no answer from {bootstrap}: {exc.args[0].str() if exc.args else exc}") from None
    if command == "list":
        for name in sorted(metadata.topics):
            if args.all or not name.startswith("__"):
                print(f"{name}\tpartitions={len(metadata.topics[name].partitions)}")
        return 0
    missing = [t for t in args.topics if t not in metadata.topics]
    if missing:
        print(f"no such topic: {', '.join(missing)} (python -m stream topics list --bootstrap-servers {bootstrap} "
              "lists them)", file=sys.stderr)
        return 1
    if command == "describe":
        for name in args.topics:
            _describe(bootstrap, config, name, metadata.topics[name])
        return 0
    futures = client.delete_topics(list(dict.fromkeys(args.topics)), operation_timeout=30)
    failed = 0
    for name, future in futures.items():
        try:
            future.result(timeout=30)
            print(f"{name}: deleted")
        except KafkaException as exc:
            failed += 1
            print(f"{name}: not deleted: {exc.args[0].str() if exc.args else exc}", file=sys.stderr)
    return 1 if failed else 0


def _describe(bootstrap: str, config: dict[str, str], name: str, topic: Any) -> None:
    from stream.kafka.topics import watermarks

    marks = watermarks(bootstrap, name, sorted(topic.partitions), config)
    print(f"{name}\tpartitions={len(topic.partitions)}")
    for p in sorted(topic.partitions):
        part = topic.partitions[p]
        low, high = marks[p]
        print(f"  partition={p}\tleader={part.leader}\treplicas={','.join(map(str, part.replicas))}\t"
              f"isr={','.join(map(str, part.isrs))}\toffsets={low}..{high}\trecords={high - low}")
