"""The model-handler protocol, built-in handler lookup, device placement and the batched forward pass."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from stream.errors import ConfigError, DeviceMemoryError, ModelError, UnrecoverableModelError
from stream.models.spec import NUMERIC_DTYPES, InputSpec, OutputSpec
from stream.pipeline.inputs import input_rows

log = logging.getLogger(__name__)


@runtime_checkable
class ModelHandler(Protocol):
    """What the worker needs from a model. Implementations must not keep per-batch state.

    ``inputs`` and ``outputs`` declare what the model takes and gives; the worker checks them against the input
    and output schemas at start-up (after ``load``, which may set them from the model's files)."""

    name: str
    version: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]

    def load(self, device: torch.device) -> None:
        """Load weights onto ``device``; raise UnrecoverableModelError if that is impossible."""

    # Optional: ``prepare(inputs) -> dict`` runs first, on the host (tokenizing, say), on one of the worker's
    # prepare threads, several batches at a time: it must be safe to call from several threads at once. Its numeric
    # numpy arrays are what the engine stages in page-locked memory for ``collate`` on CUDA; an int under the key
    # ``"truncated"`` is the count of the batch's inputs the model cut to fit (stream_inputs_truncated_total); an
    # int array under ``"tokens"`` (one per input, taken out before ``collate``) is how many tokens the model took
    # of each: a caller that waits gets it with its reply (``stream.usage.tokens``; the gateway's OpenAI usage).

    def collate(self, inputs: Mapping[str, Any], device: torch.device) -> Any:
        """The batch's inputs by name (numeric ones as numpy arrays of ``(n, *shape)``, strings and bytes as lists)
        -> what ``predict`` takes, on ``device``.

        On CUDA the engine calls this on its copy stream with views of page-locked memory for the numeric inputs
        that it keeps intact until the copy is done: copy with ``non_blocking=True`` and the copy overlaps the
        previous batch's work.
        """

    def predict(self, inputs: Any) -> Any:
        """One forward pass over the whole batch (called under ``torch.inference_mode``)."""

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        """Raw model output -> one host array per declared output, each with one row per input. A tensor that
        ``predict`` returned on a CUDA device arrives here already copied to host memory. The arrays are encoded
        and published as they are while the next batches already run: never hand out memory that a later batch's
        ``predict`` or ``postprocess`` writes again (a buffer reused across batches: return a copy of it)."""

    # Optional: ``warm_inputs() -> list of batches`` (each the handler's inputs by name): batches that between them
    # make the model meet every shape it will use, run by the worker before it joins its group (`InferenceEngine.
    # warm`), so that kernel loading, library handles, new shapes and the allocator's growth happen before the
    # worker says ready, not in the first batches of records.


def select_device(spec: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu`` / ``cuda[:i]`` as given (checked)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {spec}: CUDA is not available on this machine")
    return device


@dataclass(frozen=True)
class TextOptions:
    """Settings of the built-in text model (``--max-tokens``, ``--dtype``, ``--fixed-shapes``, ``--cuda-graphs``,
    ``--packing``); None: not given."""

    max_tokens: int | None = None
    dtype: str | None = None
    fixed_shapes: bool | None = None
    cuda_graphs: bool | None = None
    packing: bool | None = None


def create_handler(name: str, model_dir: Path | None, text: TextOptions | None = None) -> ModelHandler:
    """A built-in handler by name (``demo``, ``minilm``), a model file (``export:PATH.pt2``,
    ``torchscript:PATH.pt``), or ``package.module:ClassName`` taking ``model_dir``."""
    text = text or TextOptions()
    if name == "minilm":
        from stream.models.minilm import DEFAULT_MAX_TOKENS, MiniLMHandler

        return MiniLMHandler(model_dir, max_tokens=text.max_tokens or DEFAULT_MAX_TOKENS,
                             dtype=text.dtype or "auto", fixed_shapes=bool(text.fixed_shapes),
                             cuda_graphs=bool(text.cuda_graphs), packing=text.packing)
    given = [flag for flag, value in (("--max-tokens", text.max_tokens), ("--dtype", text.dtype),
                                      ("--fixed-shapes", text.fixed_shapes), ("--cuda-graphs", text.cuda_graphs),
                                      ("--packing", text.packing is not None))
             if value]
    if given:
        raise ConfigError(f"{' and '.join(given)} apply to --model minilm only")
    if name == "demo":
        from stream.models.demo import DemoFraudHandler

        return DemoFraudHandler(model_dir)
    kind, _, path = name.partition(":")
    if kind in ("export", "torchscript") and path:
        from stream.models.exported import ExportedHandler

        return ExportedHandler(kind, Path(path))
    if ":" in name:
        module_name, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--model {name}: cannot import {cls_name} from {module_name}: {exc}") from exc
        handler = cls(model_dir)
        if not isinstance(handler, ModelHandler):
            raise ConfigError(f"--model {name}: {cls_name} does not implement the ModelHandler protocol")
        return handler
    raise ConfigError(f"--model {name!r}: unknown model (built-in: demo, minilm; export:PATH.pt2, "
                      "torchscript:PATH.pt, or package.module:ClassName)")


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in what ``collate`` returned: a tensor, or a dict, list or tuple of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


@dataclass(frozen=True)
class BatchResult:
    outputs: dict[str, np.ndarray]
    seconds: float


@dataclass
class Prepared:
    """A batch's inputs after the handler's host-side ``prepare`` (`InferenceEngine.prepare`)."""

    inputs: Mapping[str, Any]
    truncated: int = 0  # the batch's inputs the handler cut to fit
    error: ModelError | None = None  # prepare failed: raised by the batch's result
    tokens: np.ndarray | None = None  # the tokens the model takes of each input, when the handler says


@dataclass
class InFlight:
    """A batch handed to the device: ``InferenceEngine.result`` waits for it and returns its outputs."""

    n: int
    started: float
    raw: Any = None  # the model's output; on CUDA a host tensor being filled by an asynchronous copy
    done: Any = None  # CUDA: event recorded on the compute stream after that copy
    begun: Any = None  # CUDA: timing event recorded on the compute stream before the batch's work
    error: BaseException | None = None  # raised by result(): the submit failed
    waited: float = 0.0  # seconds result() spent waiting for the device (CUDA), not working
    finished: float | None = None  # when the forward pass was over (CPU: at the end of submit; CUDA: in wait)


@dataclass(frozen=True)
class Call:
    """A call into the model under way: what it is, on a batch of how many inputs, for how long, on which thread."""

    what: str
    n: int
    seconds: float
    thread: int

    def describe(self) -> str:
        batch = f" on a batch of {self.n}" if self.n else ""
        return f"the model's {self.what}{batch} has not returned for {self.seconds:.0f} s"


class ModelCalls:
    """The calls into the model under way, one at most per thread: the handler's prepare, its collate and predict,
    the wait for the device, its postprocess. A call that never returns (a hung device, a deadlock in a model's
    code) leaves the worker polling, holding its partitions and looking alive; `longest` is how the worker tells
    (`--model-timeout-s`). Threads write their own entry; a reader copies the dict (one C call under the GIL)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._running: dict[int, tuple[str, int, float]] = {}

    @contextmanager
    def running(self, what: str, n: int) -> Iterator[None]:
        thread = threading.get_ident()
        self._running[thread] = (what, n, self._clock())
        try:
            yield
        finally:
            del self._running[thread]

    def longest(self) -> Call | None:
        """The call under way the longest, if any."""
        running = dict(self._running)
        if not running:
            return None
        thread, (what, n, started) = min(running.items(), key=lambda item: item[1][2])
        return Call(what, n, self._clock() - started, thread)


class _PinnedStaging:
    """A ring of page-locked input buffers (one per numeric input in each slot). A slot is reused only after the
    device has finished copying out of it, so the host can fill the next batch while the copy engine and the
    model work on earlier ones."""

    def __init__(self, slots: int = 3) -> None:
        self._buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._copied: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def fill(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """Copy the numeric inputs into the next free slot; returns (the inputs, numeric ones as host views of
        page-locked memory, others as they were; the slot)."""
        slot = self._next
        self._next = (slot + 1) % len(self._buffers)
        copied = self._copied[slot]
        if copied is not None:
            copied.synchronize()  # normally long done: the ring is deeper than the pipeline
        staged: dict[str, Any] = {}
        for name, array in inputs.items():
            if not isinstance(array, np.ndarray) or array.dtype.name not in NUMERIC_DTYPES:
                staged[name] = array
                continue
            buffer = self._buffers[slot].get(name)
            n = len(array)
            if (buffer is None or buffer.shape[0] < n or tuple(buffer.shape[1:]) != array.shape[1:]
                    or buffer.numpy().dtype != array.dtype):
                rows = max(n, 2 * buffer.shape[0] if buffer is not None else 0)
                buffer = torch.from_numpy(np.empty((rows, *array.shape[1:]), dtype=array.dtype)).pin_memory()
                self._buffers[slot][name] = buffer
            view: np.ndarray = buffer.numpy()[:n]
            np.copyto(view, array, casting="no")
            staged[name] = view
        return staged, slot

    def copied(self, slot: int, event: torch.cuda.Event) -> None:
        self._copied[slot] = event


class InferenceEngine:
    """Runs a handler on a device, one forward pass per micro-batch, and checks its output shape.

    On CUDA a batch is submitted without waiting for it: its features are staged in page-locked memory, copied to
    the device on a copy stream (overlapping the model's work on the batch before), the forward pass runs on a
    compute stream, and its output comes back to page-locked host memory asynchronously. ``result`` waits for it.
    On the CPU, ``submit`` runs the model at once.

    ``prepare`` (the handler's host side) is safe from several threads at once; ``submit`` is called by the device
    stage's thread and, for the retries and halves of a failed batch, by the finish stage's: a lock keeps their
    copies and launches apart.
    """

    def __init__(self, handler: ModelHandler, device: torch.device) -> None:
        self.handler = handler
        self.device = device
        try:
            handler.load(device)
        except UnrecoverableModelError:
            raise
        except Exception as exc:
            raise UnrecoverableModelError(f"model {handler.name} cannot load on {device}: {exc}") from exc
        self._prepare = getattr(handler, "prepare", None)
        self._submitting = threading.Lock()
        self.calls = ModelCalls()
        self.asynchronous = device.type == "cuda"
        # CUDA: the compute stream's time on batches (an event before each batch's work, its done event after),
        # summed as each batch is waited for; written by the thread that waits (one at a time). The warm-up's
        # batches are left out of it (their time: warm_device_s).
        self.device_busy_s = 0.0
        self.warm_device_s = 0.0
        if self.asynchronous:
            self._copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self._compute_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self._staging = _PinnedStaging()
        log.info("model %s %s loaded on %s", handler.name, handler.version, device)

    def run(self, inputs: Mapping[str, Any] | np.ndarray) -> BatchResult:
        return self.result(self.submit(inputs))

    def warm(self, limit_s: float, stop: Callable[[], bool] = lambda: False,
             progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[int, int, float]:
        """The handler's warm-up batches (``warm_inputs``) through the same path as records' batches (staging,
        streams, the device); (batches run, batches in all, seconds). Stops early, saying so in the log, past
        ``limit_s`` or when ``stop()``; a batch that fails raises its error (the model cannot serve)."""
        make = getattr(self.handler, "warm_inputs", None)
        batches = list(make()) if make is not None else []
        started = time.perf_counter()
        busy_before = self.device_busy_s
        done = 0
        try:
            for inputs in batches:
                if stop():
                    break
                if time.perf_counter() - started > limit_s:
                    log.warning("warm-up stopped after %.0f s, %d of %d batches run: the shapes left will be met "
                                "by the first batches of records", limit_s, done, len(batches))
                    break
                self.run(inputs)
                done += 1
                progress(done, len(batches))
            if self.device.type == "cuda":
                with self.calls.running("wait for the device after its warm-up", 0):
                    torch.cuda.synchronize(self.device)
        finally:
            # Not records' batches: their first passes (kernels loaded, handles made, the allocator grown, graphs
            # captured) counted in would overstate the device's time a batch of records.
            self.warm_device_s += self.device_busy_s - busy_before
            self.device_busy_s = busy_before
        seconds = time.perf_counter() - started
        warmed = getattr(self.handler, "warmed", None)
        if warmed is not None and done == len(batches):
            warmed()
        return done, len(batches), seconds

    def prepare(self, inputs: Mapping[str, Any]) -> Prepared:
        """The handler's host-side ``prepare`` of a batch (its inputs as they are when it has none). Never raises
        a model error: a failure is kept and raised by the batch's ``result``."""
        if self._prepare is None:
            return Prepared(inputs)
        try:
            with self.calls.running("prepare", input_rows(inputs)):
                prepared = self._prepare(inputs)
        except Exception as exc:
            return Prepared(inputs, error=self._classify(exc, input_rows(inputs)))
        if not isinstance(prepared, Mapping):
            return Prepared(prepared)
        truncated = prepared.get("truncated", 0)
        tokens = prepared.get("tokens")
        if tokens is not None:
            prepared = {k: v for k, v in prepared.items() if k != "tokens"}
            tokens = np.array(tokens, dtype=np.int64)  # a copy: the handler's array may be reused
            if tokens.shape != (input_rows(inputs),):
                tokens = None  # not one count per input: not reported
        return Prepared(prepared, truncated if isinstance(truncated, int) else 0, tokens=tokens)

    def submit(self, inputs: Mapping[str, Any] | np.ndarray, prepared: Prepared | None = None) -> InFlight:
        """Start a forward pass over ``inputs`` (the handler's inputs by name, one row per record; an array alone
        for a handler of one input), prepared now unless ``prepared`` is given. Never raises a model error: a
        failure is kept in the returned handle and raised by ``result``."""
        if isinstance(inputs, np.ndarray):
            if len(self.handler.inputs) != 1:
                raise TypeError(f"model {self.handler.name} takes {len(self.handler.inputs)} inputs: pass them by name")
            inputs = {self.handler.inputs[0].name: inputs}
        flight = InFlight(input_rows(inputs), time.perf_counter())
        if prepared is None:
            prepared = self.prepare(inputs)
        if prepared.error is not None:
            flight.error = prepared.error
            return flight
        try:
            with self._submitting, self.calls.running("predict", flight.n), torch.inference_mode():
                if self.asynchronous:
                    self._submit_cuda(prepared.inputs, flight)
                else:
                    flight.raw = self.handler.predict(self.handler.collate(prepared.inputs, self.device))
                    flight.finished = time.perf_counter()
        except Exception as exc:
            flight.error = self._classify(exc, flight.n)
        return flight

    def wait(self, flight: InFlight) -> None:
        """Wait until the device has finished ``flight`` (at once on the CPU, where submit ran it)."""
        if flight.done is not None and flight.error is None:
            waiting = time.perf_counter()
            try:
                with self.calls.running("wait for the device", flight.n):
                    flight.done.synchronize()
                if flight.begun is not None:  # both recorded and complete: reading them waits for nothing
                    self.device_busy_s += flight.begun.elapsed_time(flight.done) / 1000.0
            except Exception as exc:
                flight.error = self._classify(exc, flight.n)
            flight.done = flight.begun = None
            flight.finished = time.perf_counter()
            flight.waited += flight.finished - waiting

    def _submit_cuda(self, inputs: Mapping[str, Any], flight: InFlight) -> None:
        staged, slot = self._staging.fill(inputs)
        copy_stream, compute_stream = self._copy_stream, self._compute_stream
        with torch.cuda.stream(copy_stream):
            collated = self.handler.collate(staged, self.device)
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            copied.record(copy_stream)
        self._staging.copied(slot, copied)
        compute_stream.wait_event(copied)
        with torch.cuda.stream(compute_stream):
            begun = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begun.record(compute_stream)
            for tensor in _tensors(collated):
                if tensor.device.type == "cuda":
                    tensor.record_stream(compute_stream)  # allocated on the copy stream, read on this one
            raw = self.handler.predict(collated)
            if isinstance(raw, torch.Tensor) and raw.device.type == "cuda":
                raw = raw.to("cpu", non_blocking=True)  # into page-locked memory; valid once `done` fires
            # blocking: the thread that waits for it sleeps instead of spinning a core
            done = torch.cuda.Event(blocking=True, enable_timing=True)  # type: ignore[no-untyped-call]
            done.record(compute_stream)
        flight.raw, flight.done, flight.begun = raw, done, begun

    def result(self, flight: InFlight) -> BatchResult:
        """Wait for a submitted batch; its outputs, or ModelError / UnrecoverableModelError."""
        n = flight.n
        self.wait(flight)
        if flight.error is not None:
            raise flight.error
        try:
            with self.calls.running("postprocess", n), torch.inference_mode():
                outputs = self.handler.postprocess(flight.raw)
        except Exception as exc:
            error = self._classify(exc, n)
            if error is exc:
                raise
            raise error from exc
        seconds = (flight.finished if flight.finished is not None else time.perf_counter()) - flight.started
        for spec in self.handler.outputs:
            column = outputs.get(spec.name)
            if column is None or len(column) != n:
                got = "missing" if column is None else f"{len(column)} rows"
                raise ModelError(f"model {self.handler.name} output {spec.name!r}: expected {n} rows, got {got}")
        return BatchResult(outputs, seconds)

    def release_cached_memory(self) -> None:
        """On CUDA, give the caching allocator's free blocks back (before the halves of a batch that did not fit
        run); nothing on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _classify(self, exc: Exception, n: int) -> ModelError:
        if isinstance(exc, ModelError):  # UnrecoverableModelError included
            return exc
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return DeviceMemoryError(f"out of device memory on a batch of {n}: {exc}")
        if isinstance(exc, RuntimeError) and ("CUDA error" in str(exc) or "device-side assert" in str(exc)):
            # The CUDA context is unusable after these: no retry can succeed in this process.
            return UnrecoverableModelError(f"device failure on {self.device}: {exc}")
        return ModelError(f"model {self.handler.name} failed on a batch of {n}: {exc}")
