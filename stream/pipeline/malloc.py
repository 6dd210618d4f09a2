"""glibc's allocator tuned for a long-running worker (`tune_malloc`), before its threads start; no torch here."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's mallopt parameters
MALLOC_ARENA_MAX = 2
MALLOC_MMAP_THRESHOLD = 128 * 1024
# A transformer's activations are megabytes to tens of megabytes a pass, allocated and freed at the same sizes pass
# after pass: mmap'd, each pass pays for faulting them in again (--model minilm drained 20 % slower on the CPU).
MODEL_BOUND_MMAP_THRESHOLD = 32 * 1024 * 1024


def mmap_threshold(model: str, kib: int | None) -> int:
    """The worker's glibc mmap threshold in bytes: ``--malloc-mmap-threshold-kib`` when given, else 32 MiB for
    the built-in transformer (``minilm``) and 128 KiB for every other model."""
    if kib is not None:
        return kib * 1024
    return MODEL_BOUND_MMAP_THRESHOLD if model == "minilm" else MALLOC_MMAP_THRESHOLD


def tune_malloc(environ: Mapping[str, str] | None = None, threshold: int = MALLOC_MMAP_THRESHOLD) -> bool:
    """Keep a long-running worker's native heap from creeping (glibc only; call before threads start).

    Two glibc defaults make RSS grow for millions of records while the Python heap stays flat: up to
    8 arenas per core, each keeping its own freed pages (librdkafka's and torch's threads), and an mmap
    threshold that rises after each large free, so batch-sized buffers end up in the heap instead of being
    returned. Fixed values: 2 arenas, and buffers of ``threshold`` bytes or more (128 KiB by default; see
    `mmap_threshold`) always mmap'd. Skipped (False) when the operator set their own (MALLOC_ARENA_MAX,
    MALLOC_MMAP_THRESHOLD_, or malloc in GLIBC_TUNABLES)."""
    env = os.environ if environ is None else environ
    if (sys.platform != "linux" or "MALLOC_ARENA_MAX" in env or "MALLOC_MMAP_THRESHOLD_" in env
            or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENA_MAX)) and bool(mallopt(_M_MMAP_THRESHOLD, threshold))
