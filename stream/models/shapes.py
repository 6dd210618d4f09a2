"""A fixed, small set of input shapes for a handler whose batches come in ever new shapes, and CUDA graphs captured
once per shape of that set.

A stream never stops bringing new shapes (every batch's longest text, every bucket's row count), and some costs
are paid per new shape: cuDNN's attention builds a graph for each one (a 10x slowdown in bfloat16, measured), and a
CUDA graph can only replay the shape it captured. `ShapeSet` rounds lengths up to a multiple (16 tokens) and row
counts up to a few sizes (powers of two and 1.5 times them, from 8), so that a handler sees a few dozen shapes in
all; `CudaGraphs` captures a function once per shape and replays it, which on a small, launch-bound model
replaces hundreds of kernel launches per pass by one.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShapeSet:
    """Lengths rounded up to a multiple of ``length_multiple``; row counts up to one of `row_sizes`."""

    length_multiple: int = 16
    min_rows: int = 8
    max_rows: int = 16_384

    @property
    def row_sizes(self) -> np.ndarray:
        """8, 12, 16, 24, 32, 48, ... up to ``max_rows``: at most a third of a padded pass is padding rows."""
        sizes: set[int] = set()
        size = self.min_rows
        while size <= self.max_rows:
            sizes.add(size)
            if size * 3 // 2 <= self.max_rows:
                sizes.add(size * 3 // 2)
            size *= 2
        return np.asarray(sorted(sizes), dtype=np.int64)

    def lengths(self, lengths: np.ndarray) -> np.ndarray:
        """Each length rounded up to the multiple."""
        m = self.length_multiple
        return -(-lengths // m) * m

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Each row count (at most ``max_rows``) padded up to a row size; 0 stays 0."""
        sizes = self.row_sizes
        padded = sizes[np.minimum(np.searchsorted(sizes, rows), len(sizes) - 1)]
        return np.where(rows > 0, padded, 0)

    @functools.cached_property
    def padded_rows(self) -> np.ndarray:
        """`rows` of every row count from 0 to ``max_rows``, as a table (int64) indexed by the count."""
        return self.rows(np.arange(self.max_rows + 1, dtype=np.int64)).astype(np.int64)

    def fit(self, rows: int) -> int:
        """The largest row size not over ``rows`` (at least the smallest)."""
        sizes = self.row_sizes
        return int(sizes[max(0, int(np.searchsorted(sizes, rows, side="right")) - 1)])


class CudaGraphs:
    """``fn(*inputs) -> output`` captured as one CUDA graph per input shape and replayed.

    The inputs of every shape are views at the start of one flat static buffer per input, and the outputs views
    of one static output buffer: memory for the largest shape once, not once per graph. The graphs' intermediate
    tensors share one memory pool. Both are safe because the graphs run on one stream, one at a time, and the
    caller copies each replay's output (stream-ordered) before the next replay. At most ``limit`` graphs are kept
    (the least recently used one is dropped). Call from one thread.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], input_capacity: list[tuple[int, torch.dtype]],
                 output_capacity: int, output_dtype: torch.dtype, device: torch.device, limit: int = 256) -> None:
        self._fn = fn
        self._inputs = [torch.zeros(n, dtype=dtype, device=device) for n, dtype in input_capacity]
        self._output = torch.zeros(output_capacity, dtype=output_dtype, device=device)
        self._pool = torch.cuda.graph_pool_handle()
        self._side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # warm-ups and captures
        self._graphs: OrderedDict[tuple[tuple[int, ...], ...], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = \
            OrderedDict()
        self._limit = limit
        self.captured = 0  # graphs captured so far (evicted ones included)
        self.frozen = False  # set once the warm-up is over: a capture after it is a shape the warm-up missed
        self.late = 0  # graphs captured while frozen

    def __len__(self) -> int:
        return len(self._graphs)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``fn(*inputs)``, replayed; the returned tensor is overwritten by the next call: copy it first."""
        key = tuple(tuple(t.shape) for t in inputs)
        statics = [buffer[: t.numel()].view(t.shape) for buffer, t in zip(self._inputs, inputs, strict=True)]
        for static, t in zip(statics, inputs, strict=True):
            static.copy_(t, non_blocking=True)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(key, statics)
        else:
            self._graphs.move_to_end(key)
        graph, output = entry
        graph.replay()
        return output

    def _capture(self, key: tuple[tuple[int, ...], ...],
                 statics: list[torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        if self.frozen:
            self.late += 1
            log.warning("a CUDA graph captured after the warm-up, for input shapes %s (%d so far): a shape the "
                        "warm-up did not meet, captured while records wait", key, self.late)
        if len(self._graphs) >= self._limit:
            _, (old, _) = self._graphs.popitem(last=False)
            old.reset()
        stream, side = torch.cuda.current_stream(), self._side
        side.wait_stream(stream)
        with torch.cuda.stream(side):  # warm-up (cuBLAS and cuDNN handles, the allocator) outside the capture
            for _ in range(2):
                result = self._fn(*statics)
        stream.wait_stream(side)
        output = self._output[: result.numel()].view(result.shape)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
            output.copy_(self._fn(*statics))
        stream.wait_stream(side)
        self._graphs[key] = (graph, output)
        self.captured += 1
        log.debug("CUDA graph captured for input shapes %s (%d kept)", key, len(self._graphs))
        return graph, output
