"""Process-wide settings the worker changes while it runs (and restores): the GIL's switch interval, the cycle
collector's threshold, objects loaded at start-up moved out of the collector's reach, torch's thread count."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Young-generation threshold of the cycle collector while the worker runs. Every consumed record on the
# confluent-kafka path is a `Message`, an object the collector tracks: at the default threshold (700) it ran
# ~1,100 young collections per million records, each walking the records still held in batches, with the GIL
# held. Records are freed by reference counting; a collection every 50,000 tracked allocations still bounds
# cyclic garbage.
GC_THRESHOLD = 50_000


@contextmanager
def tuned(gil_switch_interval_ms: float) -> Iterator[None]:
    """While the worker runs: the processing thread holds the GIL for most of its work and the poll thread waits
    for it; Python lets a holder keep it for 5 ms once another thread asks, the worker for
    ``gil_switch_interval_ms``. Both settings are process-wide, so restored on the way out."""
    previous = sys.getswitchinterval()
    previous_gc = gc.get_threshold()
    sys.setswitchinterval(gil_switch_interval_ms / 1000.0)
    gc.set_threshold(GC_THRESHOLD, *previous_gc[1:])
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
        gc.set_threshold(*previous_gc)


def freeze_loaded() -> None:
    """torch, the model and the clients are loaded: move those objects out of the collector's reach, so a full
    collection walks only what the pipeline allocates (they took tens of ms with torch's objects in)."""
    gc.collect()
    gc.freeze()


def set_torch_threads(threads: int) -> None:
    """Intra-op threads for CPU inference. OpenMP's count is per thread: call it on the thread that runs the
    model too, or that thread gets a pool of one thread per core whose idle workers spin."""
    torch.set_num_threads(threads)
