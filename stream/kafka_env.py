"""librdkafka settings from ``KAFKA_*`` variables (Confluent's docker naming rule): ``KAFKA_SECURITY_PROTOCOL`` for
every client, ``KAFKA_CONSUMER_*``, ``KAFKA_PRODUCER_*`` and ``KAFKA_ADMIN_*`` for one."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stream.errors import ConfigError

_TOKEN = re.compile(r"_{1,3}|[^_]+")


def env_to_librdkafka_key(name: str) -> str:
    """``SESSION_TIMEOUT_MS`` -> ``session.timeout.ms`` (Confluent's docker naming rule)."""
    out = []
    for token in _TOKEN.findall(name.lower()):
        out.append({"_": ".", "__": "_", "___": "-"}.get(token, token))
    return "".join(out)


_CLIENTS = ("CONSUMER", "PRODUCER", "ADMIN")


def _kafka_env_parts(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``KAFKA_*`` variables as librdkafka settings, per client: ``""`` for those every client shares, and
    ``CONSUMER`` / ``PRODUCER`` / ``ADMIN`` for ``KAFKA_CONSUMER_*`` and the like."""
    parts: dict[str, dict[str, str]] = {"": {}, **{c: {} for c in _CLIENTS}}
    for name, value in environ.items():
        if not name.startswith("KAFKA_"):
            continue
        rest = name[len("KAFKA_"):]
        client = next((c for c in _CLIENTS if rest.startswith(c + "_")), "")
        parts[client][env_to_librdkafka_key(rest[len(client) + 1:] if client else rest)] = value
    return parts


def kafka_env_config(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(consumer, producer) librdkafka settings from ``KAFKA_*`` variables."""
    parts = _kafka_env_parts(environ)
    return {**parts[""], **parts["CONSUMER"]}, {**parts[""], **parts["PRODUCER"]}


def kafka_admin_env_config(environ: Mapping[str, str]) -> dict[str, str]:
    """The admin client's librdkafka settings: ``KAFKA_*`` shared by every client (security settings among them)
    and ``KAFKA_ADMIN_*``."""
    parts = _kafka_env_parts(environ)
    return {**parts[""], **parts["ADMIN"]}


def check_client_config(kind: str, conf: Mapping[str, Any], source: str) -> None:
    """Raise `ConfigError` where librdkafka refuses ``conf`` for a ``kind`` client ("consumer", "producer" or
    "admin"): a property it does not know, a value it cannot read, or two that contradict each other (a
    ``fetch.max.bytes`` below ``message.max.bytes``), saying so with ``source`` (where the settings came from).
    Checked on a client that connects nowhere (no bootstrap servers, callbacks left out, no log), made and closed
    at once, so that a process fails at its start with the reason instead of with a traceback once it is running."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    trial = {k: v for k, v in conf.items() if k != "bootstrap.servers" and not callable(v)}
    trial["log_level"] = 0
    try:
        if kind == "consumer":
            Consumer({"group.id": "config-check", **trial}).close()
        elif kind == "producer":
            Producer(trial)
        else:
            AdminClient(trial)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        reason = err.str() if isinstance(err, KafkaError) else str(exc)
        raise ConfigError(f"librdkafka refused the {kind}'s settings ({source}): {reason}") from None


def check_client_configs(configs: Mapping[str, Mapping[str, Any]], beside: str = "") -> None:
    """`check_client_config` for each client kind's settings ({"consumer": ..., ...}), each named as coming from
    ``KAFKA_*`` and that kind's ``KAFKA_<KIND>_*`` variables, and ``beside`` (what else they hold)."""
    for kind, conf in configs.items():
        check_client_config(kind, conf, f"KAFKA_* and KAFKA_{kind.upper()}_* variables{beside}")
