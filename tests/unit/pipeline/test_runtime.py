"""Process-wide settings the worker changes while it runs, and restores."""

from __future__ import annotations

import gc
import sys

import pytest

from stream.pipeline.runtime import GC_THRESHOLD, tuned


def test_tuned_shortens_the_gil_switch_interval_raises_the_gc_threshold_and_restores_both() -> None:
    before, gc_before = sys.getswitchinterval(), gc.get_threshold()
    with pytest.raises(RuntimeError, match="stop here"), tuned(1.0):
        assert sys.getswitchinterval() == pytest.approx(0.001)
        assert gc.get_threshold() == (GC_THRESHOLD, *gc_before[1:])
        raise RuntimeError("stop here")
    assert sys.getswitchinterval() == before and gc.get_threshold() == gc_before
