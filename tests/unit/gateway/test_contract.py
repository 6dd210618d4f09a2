"""The gateway refuses exactly the events the workers would dead-letter at their decode stage: generated events
through the gateway's door and, the same bytes, through a worker's batch processor (`stream.pipeline.processing`,
wired as the worker wires it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stream.codec.registry import FolderRegistry
from stream.gateway import _decode_stage, _input_schema
from stream.gateway.door import Door
from stream.gateway.errors import Refused
from stream.gateway.events import EventEncoder
from stream.gateway.settings import load_gateway_settings
from stream.models.demo import DemoFraudHandler
from tests.unit.gateway.fakes import FakeQueue, event
from tests.unit.pipeline.test_processing import batch_of, make

FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                   st.floats(min_value=-1e40, max_value=1e40),
                   st.sampled_from([0.0, -0.0, 1e-45, 3.4028235e38, 3.4028236e38, 3.5e38]))
SOURCE = FolderRegistry.from_dir(None)
SETTINGS = load_gateway_settings({"input_topic": "in", "bootstrap_servers": "b"}, environ={})
SCHEMA = _input_schema(SOURCE, SETTINGS)
DOOR = Door(EventEncoder(SCHEMA, 998_976), _decode_stage(SETTINGS, SOURCE, SCHEMA, 998_976), FakeQueue())
ENCODER = EventEncoder(SCHEMA, 998_976)  # the schema's check and the encoding, without the decode stage's


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(features=st.lists(FLOATS, min_size=0, max_size=40))
def test_the_door_and_the_workers_decode_stage_agree_on_every_event(model_dir: Path, features: list[float]) -> None:
    given_event: dict[str, Any] = event(features=features)
    try:
        value = ENCODER.encode(given_event)
    except Refused:
        assume(False)  # the schema itself refuses it: nothing a worker could be given
    refused: Refused | None = None
    try:
        asyncio.run(DOOR.admit([given_event]))
    except Refused as exc:
        refused = exc
    processor, pub = make(model_dir, handler=DemoFraudHandler(model_dir))  # no poison mark: the model takes all
    processor.process(batch_of([value], pub)[0])
    if refused is not None:
        assert pub.topics() == ["dlq"], f"the door refused what the worker takes: {refused}"
    else:
        assert pub.topics() == ["out"], f"the worker dead-lettered what the door let through: {pub.sent}"
