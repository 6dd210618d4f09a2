from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerInfo
from tests.engine import build_image, running_engine
from tests.image import ROOT
from tests.integration.harness import Pipeline

WORKER_IMAGE = "stream-inference:0.1.0"  # the tag users build, and deploy/compose/host-network.yml runs


@pytest.fixture
def pipeline(broker: BrokerInfo, unique_name: Callable[[str], str], model_dir: Path,
             tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(broker, unique_name, model_dir, tmp_path)
    yield p
    p.cleanup()


@pytest.fixture(scope="session")
def engine() -> Iterator[str]:
    """A Docker engine (`tests.engine`): the caller's, or one started here and stopped at the end."""
    with running_engine() as host:
        yield host


@pytest.fixture(scope="session")
def cpu_image(engine: str) -> str:
    """The Dockerfile's cpu target, built as a user builds it."""
    build_image("cpu", WORKER_IMAGE, ROOT)
    return WORKER_IMAGE
