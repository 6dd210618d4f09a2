"""Whether any worker serves the gateway's input topic, so that readiness tells the truth and a request that no
worker would take is answered 503 at once instead of waiting out ``--timeout-ms``.

Two signs count, either is enough: a consumer group (``--worker-group``, else any group) has a member holding
partitions of the input topic, as the brokers describe it; or a reply arrived on this gateway's reply partition.
Each stays true for ``grace_s`` after it was last seen, so that a rebalance does not flap readiness. What the
brokers cannot say does not close the door: brokers that do not describe groups faithfully (asked about a group
that does not exist, Apache Kafka says it is dead; the embedded Tansu says it is empty, and lists no groups
without commits) or a principal not allowed to describe them make the answer "unknown", and the gateway then
serves as if a worker were there, saying why in its log.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger(__name__)
GRACE_S = 10.0
MAX_GROUPS = 50  # groups described per check without --worker-group (more: in turns, and "unknown")
_DENIED = frozenset({KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                     KafkaError.TOPIC_AUTHORIZATION_FAILED})


class WorkerPresence:
    """Fed by `check` (the gateway's broker thread, every few seconds) and `replied` (its reply thread)."""

    def __init__(self, admin: Any, topic: str, group: str | None, grace_s: float = GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._admin = admin
        self.topic = topic
        self.group = group
        self.grace_s = grace_s
        self._clock = clock
        self._member_seen = -float("inf")
        self._reply_seen = -float("inf")
        self.unknown: str | None = None  # why the brokers cannot tell, when they cannot
        self._told: set[str] = set()
        self._lock = threading.Lock()
        self._turn = 0  # which MAX_GROUPS of many groups this check describes
        self._faithful: str | None = None  # "yes", or why the brokers' group descriptions cannot be used (`_probe`)

    def replied(self) -> None:
        self._reply_seen = self._clock()

    def serving(self) -> bool:
        now = self._clock()
        return (self.unknown is not None or now - self._member_seen <= self.grace_s
                or now - self._reply_seen <= self.grace_s)

    def why_not(self) -> str:
        group = f"group {self.group}" if self.group else "any consumer group"
        return (f"no worker serves {self.topic}: no member of {group} holds its partitions, and no reply came in "
                f"the last {self.grace_s:.0f} s")

    def check(self, timeout_s: float = 5.0) -> None:
        """Ask the brokers which groups' members hold the topic's partitions."""
        try:
            if self._faithful is None:
                self._faithful = self._probe(timeout_s)
            if self._faithful not in (None, "yes"):
                self.unknown = self._faithful
                self._tell()
                return
            unknown = None
            if self.group:
                groups = [self.group]
            else:
                groups, every = self._groups(timeout_s)
                if not every:
                    unknown = "more consumer groups than it describes at once (pass --worker-group)"
            found = False
            for group_id, future in self._admin.describe_consumer_groups(
                    groups, request_timeout=timeout_s).items() if groups else ():
                try:
                    description = future.result()
                except KafkaException as exc:
                    if exc.args[0].code() in _DENIED:
                        unknown = f"not allowed to describe group {group_id} (grant Describe on it)"
                    continue
                members = list(description.members or [])
                if not members and str(getattr(description.state, "name", "")).upper() == "STABLE":
                    # A stable group has members: a broker that says otherwise does not report them.
                    unknown = "the brokers describe consumer groups without their members"
                for member in members:
                    assignment = getattr(member, "assignment", None)
                    if any(tp.topic == self.topic for tp in getattr(assignment, "topic_partitions", None) or []):
                        found = True
            with self._lock:
                if found:
                    self._member_seen = self._clock()
                self.unknown = None if found else unknown
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() in _DENIED:
                self.unknown = "not allowed to list or describe consumer groups (grant Describe on them)"
            else:
                log.debug("could not describe the consumer groups: %s", exc)
        self._tell()

    def _tell(self) -> None:
        if self.unknown and self.unknown not in self._told:
            self._told.add(self.unknown)
            log.warning("readiness cannot tell whether a worker serves %s: %s; requests are sent regardless",
                        self.topic, self.unknown)

    def _probe(self, timeout_s: float) -> str | None:
        """"yes" when the brokers call a group that does not exist dead, as Apache Kafka does; else why their
        descriptions cannot be used; None: no answer yet."""
        missing = f"gateway-probe-{uuid.uuid4().hex}"
        [future] = self._admin.describe_consumer_groups([missing], request_timeout=timeout_s).values()
        try:
            state = str(getattr(future.result().state, "name", "")).upper()
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return "yes"
            return "not allowed to describe consumer groups (grant Describe on them)" if code in _DENIED else None
        if state == "DEAD":
            return "yes"
        return f"the brokers do not describe consumer groups as they are (one that does not exist is {state.lower()})"

    def _groups(self, timeout_s: float) -> tuple[list[str], bool]:
        """The groups to describe this time, and whether they are all of them."""
        listed = self._admin.list_consumer_groups(request_timeout=timeout_s).result()
        groups = sorted(g.group_id for g in listed.valid if not g.group_id.startswith("gateway-"))
        if len(groups) <= MAX_GROUPS:
            return groups, True
        start = (self._turn * MAX_GROUPS) % len(groups)
        self._turn += 1
        return (groups + groups)[start:start + MAX_GROUPS], False
