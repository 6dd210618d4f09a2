"""One request path for every protocol the gateway speaks: events in, their predictions out, all or nothing.

1. `Door.admit`: each event checked against the input schema and encoded (`stream.gateway.events`), then the
   workers' own decode stage run on the encoded events (`stream.pipeline.contract`; once for all the requests
   of one turn of the event loop): an event the workers would dead-letter for its shape or values (a vector of
   the wrong length, NaN, a null or empty input, a size) is refused here, naming the event and the field, and
   nothing of the request is sent.
2. The protocol checks whatever else could fail once the predictions are back (the outputs asked for, the
   parameters, the request's id), before anything is sent.
3. `Door.predict`: every event sent at once or none (`stream.gateway.client.PredictionClient.send`: room under
   ``--max-pending`` and a worker serving, checked first), each with the request's W3C trace context
   (`trace_context`) as headers (the workers carry it onto its prediction, dead letter and reply); then every
   prediction awaited; the first failure fails the request, naming its event. Events already on the topic are
   still predicted: the error says so (``sent``).

Each protocol turns a `stream.gateway.errors.GatewayError` into its answer with one table.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from stream.codec.registry import RegistryUnavailable
from stream.errors import DecodeError
from stream.gateway.client import Prediction
from stream.gateway.errors import BadReply, GatewayError, NotSent, Oversized, Refused, TooManyEvents
from stream.gateway.events import EventEncoder
from stream.ops.tracing import request_trace_headers
from stream.pipeline.contract import DecodeStage

BATCH_AFTER_S = 0.002  # requests closer together than this share the decode stage's runs
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
MAX_TRACESTATE = 512  # W3C: vendors must propagate at least 512 characters; a longer one is dropped here
Context = Sequence[tuple[str, bytes]]


def trace_context(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """A request's W3C trace context (``traceparent``, and ``tracestate`` with it) as record headers; an invalid
    ``traceparent`` (W3C: version ff, an all-zero id, not lower-case hex) is dropped with its ``tracestate``, as a
    tracer would restart the trace. A gateway that traces (`stream.ops.tracing`) gives its request span's instead."""
    own = request_trace_headers()
    if own is not None:
        return own
    parent = headers.get("traceparent")
    if parent is None:
        return []
    parent = parent.strip()
    found = _TRACEPARENT.fullmatch(parent)
    if found is None or parent.startswith("ff") or not found[1].strip("0") or not found[2].strip("0"):
        return []
    out = [("traceparent", parent.encode())]
    state = headers.get("tracestate")
    if state and len(state) <= MAX_TRACESTATE and state.isascii():
        out.append(("tracestate", state.strip().encode()))
    return out


@dataclass(frozen=True)
class Admitted:
    """A request's events as `Door.admit` passed them: framed for the input topic, and each one's record key."""

    values: list[bytes]
    keys: list[bytes | None]


class Queue(Protocol):
    """What the door needs of the durable queue (`stream.gateway.client.PredictionClient`)."""

    max_pending: int

    def check_room(self, count: int) -> None: ...

    def send(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None, context: Context = ()
             ) -> list[Future[Prediction]]: ...


class Door:
    def __init__(self, encoder: EventEncoder, stage: DecodeStage | None, queue: Queue) -> None:
        self.encoder = encoder
        self.stage = stage
        self.queue = queue
        # Requests whose events wait for the decode stage: it runs once for all those of one turn of the event
        # loop (its fixed cost, tens of microseconds, is paid once a batch, as in the worker).
        self._waiting: list[tuple[list[bytes], asyncio.Future[list[tuple[int, DecodeError]]]]] = []
        self._last_run = -float("inf")

    @property
    def max_events(self) -> int:
        return self.queue.max_pending

    async def admit(self, events: Sequence[Any]) -> Admitted:
        """The events framed for the input topic, each one checked as the workers' decode stage will check it,
        with their record keys (`EventEncoder.key_of`); `Refused`, `Oversized` or `TooManyEvents` naming the
        first that fails (nothing sent)."""
        if len(events) > self.queue.max_pending:
            raise TooManyEvents(f"{len(events)} events in one request, over --max-pending "
                                f"({self.queue.max_pending})")
        self.queue.check_room(len(events))  # under load, a request that will be refused costs no more than this
        values = []
        for i, event in enumerate(events):
            try:
                values.append(self.encoder.encode(event))
            except GatewayError as exc:
                raise exc.at(i) from None
        if self.stage is not None and values:
            errors = await self._decode_stage(values)
            if errors:
                i, error = errors[0]
                if error.reason == "oversized":
                    raise Oversized(f"the event is {len(values[i])} bytes encoded, over --max-input-bytes "
                                    f"{self.encoder.max_input_bytes}", index=i)
                raise Refused(f"the workers would dead-letter this event ({error.reason}): {error.detail}",
                              index=i, problems=[error.detail])
        return Admitted(values, [self.encoder.key_of(event) for event in events])

    def _decode_stage(self, values: list[bytes]) -> asyncio.Future[list[tuple[int, DecodeError]]]:
        """The decode stage's errors for ``values``: at once when no other request ran it in the last
        `BATCH_AFTER_S` (a quiet gateway gains nothing by waiting), else with the other requests of this turn of
        the event loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[tuple[int, DecodeError]]] = loop.create_future()
        self._waiting.append((values, future))
        now = loop.time()
        if len(self._waiting) == 1:
            if now - self._last_run >= BATCH_AFTER_S:
                self._run_stage()
            else:
                loop.call_soon(self._run_stage)
        self._last_run = now
        return future

    def _run_stage(self) -> None:
        """The decode stage over every waiting request's events at once; each request gets its own errors."""
        waiting, self._waiting = self._waiting, []
        assert self.stage is not None
        starts = list(itertools.accumulate((len(values) for values, _ in waiting), initial=0))
        try:
            errors = self.stage.run([v for values, _ in waiting for v in values]).errors
        except Exception as exc:  # the registry away (a writer schema to fetch), or the gateway's own fault
            failure = NotSent("the schema registry cannot be reached: try again shortly") if isinstance(
                exc, RegistryUnavailable) else exc
            for _, future in waiting:
                if not future.done():
                    future.set_exception(failure)
            return
        per: list[list[tuple[int, DecodeError]]] = [[] for _ in waiting]
        for position, error in errors:
            k = bisect.bisect_right(starts, position) - 1
            per[k].append((position - starts[k], error))
        for (_, future), found in zip(waiting, per, strict=True):
            if not future.done():
                future.set_result(found)

    async def predict(self, admitted: Admitted, context: Context = ()) -> list[Prediction]:
        """Every admitted event's prediction, in order; the first failure raised, naming its event. ``context``:
        headers every event carries (the request's trace context)."""
        futures = self.queue.send(admitted.values, admitted.keys, context)
        predictions = []
        for i, future in enumerate(futures):
            # In order, one at a time (no gather: for the usual one event, its bookkeeping cost more than the
            # wait): the request waits for its slowest event either way, and fails on the first in order that fails.
            try:
                result = await asyncio.wrap_future(future)
            except GatewayError as exc:
                raise exc.at(i, sent=True) from None
            except Exception as exc:
                raise BadReply(f"{type(exc).__name__}: {exc}").at(i, sent=True) from None
            if not isinstance(result, Prediction):
                raise BadReply(f"not a prediction: {type(result).__name__}").at(i, sent=True)
            predictions.append(result)
        return predictions
