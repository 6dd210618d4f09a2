"""What the worker may do on the cluster, checked before it consumes, and named when the brokers refuse it.

On a cluster with an authorizer the worker needs exactly (least privilege; README "Security"):

- READ on the input topic and READ on its consumer group;
- WRITE on the output topic and on the dead-letter topic (the topic exists, or CREATE on it: the worker creates
  a missing one);
- exactly-once: WRITE on its transactional id. Nothing on the cluster: Kafka 3.0 and later take WRITE on a topic
  as leave to write idempotently (KIP-679).

`check_access` asks the brokers which operations the worker's principal is allowed on its topics (Describe with
``include_authorized_operations``) and names every one missing in a single error, so a deployment short of a
topic ACL fails at start-up with exit 2 instead of consuming what it cannot publish. The group is not asked
(describing a group no member has joined answers NOT_COORDINATOR on a fresh cluster): a missing group ACL, like
an ACL removed later, surfaces as an authorization error from a client, which `denied` turns into the same words
and the worker stops on (exit 1).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient  # type: ignore[attr-defined]

from stream.config import WorkerSettings
from stream.errors import KafkaClientError, StreamError
from stream.kafka.client_logs import ConnectionWatch
from stream.kafka.topics import admin, ask_until_answered, create_topics, partitions_of

log = logging.getLogger(__name__)
_TIMEOUT_S = 10.0
AUTHORIZATION_ERRORS = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                                  KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                  KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


class AccessDenied(StreamError):
    """The cluster refuses the worker's principal something it needs: which ACL to grant is in the message."""


def required(settings: WorkerSettings) -> list[tuple[str, str, str]]:
    """(resource type, name, operation) the worker needs: its least-privilege ACLs (docs/operations.md, "Security")."""
    needs = [("topic", settings.input_topic, "READ"), ("group", settings.group_id, "READ"),
             ("topic", settings.output_topic, "WRITE")]
    if settings.dlq_topic:
        needs.append(("topic", settings.dlq_topic, "WRITE"))
    if settings.exactly_once:
        needs.append(("transactional id", settings.transactional_id or "(its --transactional-id)", "WRITE"))
    return needs


def _grant(resource: str, name: str, operation: str) -> str:
    return f"{operation} on {resource} {name!r}"


def check_access(settings: WorkerSettings, admin_config: Mapping[str, Any], connection: ConnectionWatch,
                 stop: threading.Event) -> None:
    """Raise AccessDenied naming every required operation the brokers do not allow (nothing where the cluster
    has no authorizer: it then reports no operations to check). Retried while the brokers cannot be reached."""
    ask_until_answered(lambda client: _check_access(settings, client), admin_config, connection, stop)


def _check_access(settings: WorkerSettings, client: AdminClient) -> None:
    topics = [name for kind, name, _ in required(settings) if kind == "topic"]
    missing: list[str] = []
    allowed: dict[tuple[str, str], set[str] | None] = {}
    for name, future in client.describe_topics(TopicCollection(list(dict.fromkeys(topics))),
                                               include_authorized_operations=True,
                                               request_timeout=_TIMEOUT_S).items():
        allowed[("topic", name)] = _operations(future, f"topic {name!r}")
    for kind, name, operation in required(settings):
        ops = allowed.get((kind, name))
        if ops is not None and operation not in ops and "ALL" not in ops:
            missing.append(_grant(kind, name, operation))
    if missing:
        raise AccessDenied(f"the brokers do not allow this worker's principal {', '.join(missing)}: grant "
                           f"{'it' if len(missing) == 1 else 'them'} (docs/operations.md, section 'Security: the "
                           "least-privilege ACLs')")


def reply_partitions(admin_config: Mapping[str, Any], topic: str) -> int | None:
    """A reply topic's partition count when the worker may write to it, else None (it does not exist, or the
    brokers do not allow this principal WRITE on it: logged, naming the ACL). Asked by the worker's reply router,
    so that a reply topic it may not write to costs callers their answers (504), never the worker."""
    client = admin(admin_config["bootstrap.servers"], **admin_config)
    try:
        future = client.describe_topics(TopicCollection([topic]), include_authorized_operations=True,
                                        request_timeout=_TIMEOUT_S)[topic]
        ops = _operations(future, f"topic {topic!r}")
        if ops is not None and "WRITE" not in ops and "ALL" not in ops:
            log.warning("no reply is sent to %r: the brokers do not allow this worker's principal %s", topic,
                        _grant("topic", topic, "WRITE"))
            return None
        return len(future.result(timeout=_TIMEOUT_S + 5).partitions)
    except (KafkaException, KafkaClientError) as exc:
        log.warning("reply topic %r: %s", topic, exc)
        return None


def _operations(future: Any, what: str) -> set[str] | None:
    """The operations allowed on a resource; an empty set when it may not even be described."""
    try:
        description = future.result(timeout=_TIMEOUT_S + 5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in AUTHORIZATION_ERRORS:
            return set()
        if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None  # not created yet: nothing to ask; the clients wait for it (or fail on it) as before
        raise KafkaClientError(f"describe {what}", err) from exc
    ops = getattr(description, "authorized_operations", None)
    if ops is None:
        return None  # no authorizer (or an old broker): nothing to check
    return {op.name if isinstance(op, AclOperation) else str(op) for op in ops}


def denied(error: KafkaError, settings: WorkerSettings, where: str) -> AccessDenied | None:
    """An authorization error from a client, in the words of `check_access`; None for any other error."""
    code = error.code()
    if code not in AUTHORIZATION_ERRORS:
        return None
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        need = _grant("group", settings.group_id, "READ")
    elif code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        need = _grant("transactional id", settings.transactional_id or "(this worker's)", "WRITE")
    elif code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        need = "IDEMPOTENT_WRITE on the cluster (brokers before Kafka 3.0)"
    elif where == "consumer":
        need = _grant("topic", settings.input_topic, "READ")
    else:
        need = f"WRITE on the topic it writes to ({settings.output_topic!r} or {settings.dlq_topic!r})"
    return AccessDenied(f"the brokers refused the {where} ({error.str()}): grant this worker's principal {need} "
                        "(docs/operations.md, section 'Security: the least-privilege ACLs')")


def ensure_dlq_topic(settings: WorkerSettings, admin_config: Mapping[str, Any], connection: ConnectionWatch,
                     stop: threading.Event) -> None:
    """The dead-letter topic, created with as many partitions as the input when it does not exist (an existing
    one needs no CREATE ACL); retried while the brokers cannot be reached."""
    topic = settings.dlq_topic
    assert topic is not None
    bootstrap = admin_config["bootstrap.servers"]

    def ensure(client: AdminClient) -> None:
        info = client.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
        if info is not None and info.error is None:
            log.info("dead-letter topic %s: exists", topic)
            return
        if info is not None and info.error is not None and info.error.code() in AUTHORIZATION_ERRORS:
            raise AccessDenied(f"this worker may not use the dead-letter topic {topic!r} ({info.error.str()}): "
                               f"grant {_grant('topic', topic, 'WRITE')}")
        try:
            status = create_topics(bootstrap, [topic], len(partitions_of(bootstrap, settings.input_topic,
                                                                         admin_config)), client_config=admin_config)
        except KafkaClientError as exc:
            err = exc.kafka_error
            if isinstance(err, KafkaError) and err.code() in AUTHORIZATION_ERRORS:
                raise AccessDenied(f"the dead-letter topic {topic!r} does not exist and this worker may not "
                                   f"create it ({err.str()}): create it, or grant "
                                   f"{_grant('topic', topic, 'CREATE')}") from exc
            raise
        log.info("dead-letter topic %s: %s", topic, status[topic])

    ask_until_answered(ensure, admin_config, connection, stop)
