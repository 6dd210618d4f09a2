from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerInfo
from tests.integration.harness import Pipeline


@pytest.fixture
def pipeline(broker: BrokerInfo, unique_name: Callable[[str], str], model_dir: Path,
             tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(broker, unique_name, model_dir, tmp_path)
    yield p
    p.cleanup()
