"""Why a request to the gateway gets no predictions: one error root, `GatewayError`, and a subclass per answer.

Each protocol maps these to its own status codes and body shape with one table (`stream.gateway.app`,
`stream.gateway.openai`, `stream.gateway.kserve`); nothing else decides a status. An error names the event of the
request it is about (``index``) and says whether any of the request's events had reached the input topic
(``sent``): a request is all or nothing, but events already on the topic are still predicted, so a caller must not
send them again (OpenAI's SDKs are told with ``x-should-retry: false``).
"""

from __future__ import annotations

from stream.errors import StreamError


class GatewayError(StreamError):
    """A request the gateway answers with an error. ``retry_after_s``: when a caller may try again (a 503's and a
    429's ``Retry-After``)."""

    retry_after_s: int | None = None

    def __init__(self, message: str, *, index: int | None = None, sent: bool = False,
                 problems: list[str] | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index  # the event of the request it is about (None: the request as a whole)
        self.sent = sent  # some of the request's events are on the input topic (they will be predicted)
        self.problems = problems or []  # one line per field: which, and why
        self.field = field  # the request's field it is about, when one (OpenAI's ``param``)

    def at(self, index: int, *, sent: bool | None = None) -> GatewayError:
        """This error, naming the event at ``index`` of the request (and whether events were sent)."""
        self.index = index
        if sent is not None:
            self.sent = sent
        return self

    def __str__(self) -> str:
        return self.message


class BadRequest(GatewayError):
    """The request is malformed: not JSON, a field of the wrong type, a shape that does not fit (400)."""


class EmptyInput(BadRequest):
    """A text that is empty or blank."""


class NotFound(GatewayError):
    """The request names a model this gateway does not serve (404)."""


class Unavailable(GatewayError):
    """A route this gateway does not serve with its input schema (the embeddings routes without a text field)."""


class Refused(GatewayError):
    """An event the input schema or the model's contract refuses (``problems``: which field, why); nothing of the
    request was sent (422)."""


class Oversized(GatewayError):
    """The body, or an event encoded, is larger than the gateway or the broker takes (413); nothing was sent."""


class TooManyEvents(GatewayError):
    """More events in one request than ``--max-pending`` (or ``--max-texts``) allows (413 or 400, by protocol)."""


class Overloaded(GatewayError):
    """``--max-pending`` events already wait for their predictions, or the bodies being read fill
    ``--max-buffered-bytes``: nothing was sent; come back shortly (503 or 429, with ``Retry-After``)."""

    retry_after_s = 1


class NoWorkers(GatewayError):
    """No worker serves the input topic: nothing was sent (503 with ``Retry-After``)."""

    retry_after_s = 5


class NotSent(GatewayError):
    """The broker did not take an event (the gateway's log has its error); it will not be predicted (503)."""

    retry_after_s = 1


class BodyTimeout(GatewayError):
    """The request's body did not arrive within ``--body-timeout-s`` (408)."""


class RequestTimeout(GatewayError):
    """No prediction within ``--timeout-ms``. With ``offset`` set the event is durable in the input topic at
    ``partition``/``offset`` and will still be predicted into the output topic (504)."""

    def __init__(self, timeout_s: float, partition: int | None, offset: int | None) -> None:
        where = (f"the event is at partition {partition}, offset {offset} of the input topic and will still be "
                 "predicted into the output topic" if offset is not None
                 else "the broker had not acknowledged the event")
        super().__init__(f"no prediction within {timeout_s * 1000:.0f} ms; {where}", sent=True)
        self.timeout_s = timeout_s
        self.partition = partition
        self.offset = offset


class DeadLettered(GatewayError):
    """A worker could not predict the event and sent it to the dead-letter topic (``stage``: decode or model)."""

    def __init__(self, stage: str, reason: str, detail: str, partition: int | None, offset: int | None) -> None:
        super().__init__(f"dead-lettered at the {stage} stage ({reason}): {detail}", sent=True)
        self.stage = stage
        self.reason = reason
        self.detail = detail
        self.partition = partition
        self.offset = offset


class DeadLetteredAtDecode(DeadLettered):
    """The workers' decode stage could not take the event (the door checks what it checks, so this is a writer
    schema the workers read otherwise, or a worker with another model)."""


class DeadLetteredAtModel(DeadLettered):
    """The model failed on the event."""


def dead_lettered(stage: str, reason: str, detail: str, partition: int | None, offset: int | None) -> DeadLettered:
    cls = DeadLetteredAtDecode if stage == "decode" else DeadLetteredAtModel
    return cls(stage, reason, detail, partition, offset)


class BadReply(GatewayError):
    """A worker's reply could not be read, or the prediction does not have what the protocol answers with: the
    deployment's fault, not the caller's (500)."""
