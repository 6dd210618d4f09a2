"""The stages a closed batch moves through, each on thread(s) of its own with bounded queues between them, so that
the worker runs at its slowest stage's rate instead of at the sum of them:

    poll thread --offer--> prepare: a pool of --prepare-threads (decode, bind the model's inputs, the handler's
                           host-side prepare, e.g. tokenizing)
                --> device: one thread (collate, copy, submit; on the CPU the forward pass itself)
                --> finish: one thread (wait for the outputs, isolate poison records, encode, publish, serve the
                           producer's delivery reports; exactly-once: the transactions)

Order: the prepare threads work on several batches at once, but the device thread takes batches in the order the
poll thread offered them and the finish thread publishes in that order, so each partition's predictions follow
its input order. Bounds: a batch holds one of ``max_inflight_batches`` slots from the offer until the device
thread takes it (waiting for a prepare thread, in one, or prepared and waiting for the device); the device hands
batches on through a queue of `FINISH_QUEUE`; when no slot is free the poll thread's offer fails and, sustained, it
pauses the input. Failure and stopping: after a failure nothing more is prepared, submitted or published; after a
batch abandoned while stopping nothing after it is published; batches of a rewound epoch are dropped by every
stage. ``finish`` lets every stage finish what it holds, in order, then ends the threads.

Each stage adds its working time to ``stream_stage_busy_seconds_total{stage}`` (the finish thread's wait for the
device is not work) and the CPU time its own thread used meanwhile to ``stream_stage_cpu_seconds_total{stage}``
(the difference is time spent waiting for the GIL, for a core, or for threads it handed work to, such as torch's
intra-op pool on the CPU), and each queue's depth is a gauge: the stage whose busy time per second nears its
thread count binds the worker.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from stream.kafka.deadline import Deadline
from stream.kafka.publish import Publisher
from stream.ops.metrics import StreamMetrics
from stream.pipeline import faults
from stream.pipeline.processing import Abandoned, BatchProcessor, Begun, Dispatched
from stream.pipeline.runtime import set_torch_threads
from stream.pipeline.transactions import Transactions

log = logging.getLogger(__name__)
_SERVE_EVERY_S = 0.002  # an idle finish thread serves delivery reports this often
_SEND_WINDOW_S = 0.001  # how long a finish thread that runs out of work flushes the batch it just produced
_GIVE_UP_CHECK_S = 0.1  # how often `finish` asks whether to stop waiting for the threads
FINISH_QUEUE = 2  # batches submitted to the device and waiting for the finish thread
STAGES = ("prepare", "device", "finish")


class _StageClock:
    """A stage's two counters of one span of work: its wall time (busy, less ``waited`` for the device) and the
    CPU time its thread used meanwhile."""

    def __init__(self, busy: Counter, cpu: Counter) -> None:
        self._busy, self._cpu = busy, cpu

    @staticmethod
    def start() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def stop(self, started: tuple[float, float], waited: float = 0.0) -> None:
        self._busy.inc(max(0.0, time.perf_counter() - started[0] - waited))
        self._cpu.inc(time.thread_time() - started[1])  # a wait for the device uses none


@dataclass(eq=False)
class _Job:
    """A batch on its way through the stages."""

    batch: Dispatched
    prepared: threading.Event = field(default_factory=threading.Event)
    begun: Begun | None = None  # set by its prepare thread
    error: BaseException | None = None  # raised by its prepare, handled by the finish thread in order


class ProcessingStages:
    def __init__(self, processor: BatchProcessor, publisher: Publisher, transactions: Transactions, *,
                 max_inflight_batches: int, prepare_threads: int, torch_threads: int, overlap: bool,
                 exactly_once: bool, fail: Callable[[BaseException], None], failed: Callable[[], bool],
                 metrics: StreamMetrics | None = None, on_idle: Callable[[], None] | None = None) -> None:
        self._processor = processor
        self._publisher = publisher
        self._transactions = transactions
        self._torch_threads = torch_threads
        self._overlap = overlap  # False: the device thread waits for each forward pass before submitting the next
        self._exactly_once = exactly_once
        self._fail = fail
        self._failed = failed
        self._metrics = metrics if metrics is not None else StreamMetrics()
        self._on_idle = on_idle  # called as the last batch in flight is settled (wakes the poll thread)
        self._slots = threading.BoundedSemaphore(max_inflight_batches)
        self._to_prepare: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._in_order: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._to_finish: queue.Queue[Begun | _Job | None] = queue.Queue(maxsize=FINISH_QUEUE)
        self._lock = threading.Lock()
        self._active = 0  # batches offered and not yet settled (published, dropped or abandoned)
        self._prepared_waiting = 0  # prepared batches the device thread has not taken yet
        busy, cpu = self._metrics.stage_busy_seconds, self._metrics.stage_cpu_seconds
        self._clocks = {stage: _StageClock(busy.labels(stage), cpu.labels(stage)) for stage in STAGES}
        threads = self._metrics.stage_threads
        for stage, count in zip(STAGES, (prepare_threads, 1, 1), strict=True):
            threads.labels(stage).set(count)
        depth = self._metrics.stage_queue_batches
        depth.labels("prepare").set_function(self.queued)
        depth.labels("device").set_function(lambda: self._prepared_waiting)
        depth.labels("finish").set_function(self._to_finish.qsize)
        self._threads = [threading.Thread(target=self._prepare_loop, name=f"prepare-{i}", daemon=True)
                         for i in range(prepare_threads)]
        self._threads += [threading.Thread(target=self._device_loop, name="device", daemon=True),
                          threading.Thread(target=self._finish_loop, name="finish", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    # -- the poll thread ------------------------------------------------------------------------------------
    def offer(self, close_batch: Callable[[], Dispatched], wait_s: float) -> bool:
        """Queue the batch ``close_batch`` closes if a slot frees within ``wait_s`` (0: only if one is free now).
        Blocks on the slot, never spins: a spinning poll thread steals the GIL from the stages."""
        acquired = self._slots.acquire(timeout=wait_s) if wait_s > 0 else self._slots.acquire(blocking=False)
        if not acquired:
            return False
        job = _Job(close_batch())
        job.batch.queued_at = time.monotonic()
        with self._lock:
            self._active += 1
        self._in_order.put(job)
        self._to_prepare.put(job)
        return True

    def busy_seconds(self) -> dict[str, float]:
        """Seconds each stage's threads have worked so far."""
        return self._totals("stream_stage_busy_seconds_total")

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each stage's threads have used while they worked."""
        return self._totals("stream_stage_cpu_seconds_total")

    def _totals(self, metric: str) -> dict[str, float]:
        sample = self._metrics.registry.get_sample_value
        return {stage: sample(metric, {"stage": stage}) or 0.0 for stage in STAGES}

    def queued(self) -> int:
        """Closed batches waiting for a prepare thread."""
        return self._to_prepare.qsize()

    def idle(self) -> bool:
        """No batch anywhere in the stages."""
        return self._active == 0

    def finish(self, deadline: Deadline, give_up: Callable[[], bool] | None = None) -> list[threading.Thread]:
        """Let the stages finish what they hold, in order, then end their threads; wait for them until
        ``deadline`` passes or ``give_up`` (asked every `_GIVE_UP_CHECK_S` meanwhile) says so. The threads left."""
        for _ in range(len(self._threads) - 2):
            self._to_prepare.put(None)
        self._in_order.put(None)
        for thread in self._threads:
            while True:
                thread.join(timeout=min(_GIVE_UP_CHECK_S, deadline.left(0.01)))
                if not thread.is_alive() or deadline.passed() or (give_up is not None and give_up()):
                    break
        return [thread for thread in self._threads if thread.is_alive()]

    # -- accounting -----------------------------------------------------------------------------------------
    def _settle(self, n: int) -> None:
        """``n`` batches left the stages; the last one out wakes the poll thread (the adaptive batch policy)."""
        with self._lock:
            self._active -= n
            idle = self._active == 0
        if idle and self._on_idle is not None:
            self._on_idle()

    def _dropped(self, batch: Dispatched) -> bool:
        """Nothing more is published after a failure, and a rewound epoch's batches will be consumed again."""
        return self._failed() or self._transactions.stale(batch.epoch)

    # -- prepare threads ------------------------------------------------------------------------------------
    def _prepare_loop(self) -> None:
        clock = self._clocks["prepare"]
        queue_wait = self._metrics.queue_wait_seconds
        while (job := self._to_prepare.get()) is not None:
            queue_wait.observe(time.monotonic() - job.batch.queued_at)
            if not self._dropped(job.batch):
                started = clock.start()
                try:
                    job.begun = self._processor.prepare(job.batch)
                except BaseException as exc:  # handled in order, by the finish thread
                    job.error = exc
                clock.stop(started)
            with self._lock:
                self._prepared_waiting += 1
            job.prepared.set()

    # -- the device thread ----------------------------------------------------------------------------------
    def _device_loop(self) -> None:
        set_torch_threads(self._torch_threads)
        clock = self._clocks["device"]
        engine = self._processor.engine
        while (job := self._in_order.get()) is not None:
            job.prepared.wait()
            with self._lock:
                self._prepared_waiting -= 1
            self._slots.release()
            begun = job.begun
            if begun is None or self._dropped(job.batch):
                if job.error is None:
                    self._settle(1)  # nothing to publish: dropped, or failed before it was prepared
                    continue
                self._hand_on(job)  # its error, in order
                continue
            started = clock.start()
            try:
                self._processor.submit(begun)
                if not self._overlap and begun.flight is not None:
                    engine.wait(begun.flight)  # the next batch is submitted once this one is done
            except BaseException as exc:
                self._fail(exc)
            clock.stop(started)
            self._hand_on(begun)
        self._hand_on(None)

    def _hand_on(self, item: Begun | _Job | None) -> None:
        self._to_finish.put(item)  # blocks while the finish thread is FINISH_QUEUE batches behind

    # -- the finish thread ----------------------------------------------------------------------------------
    def _finish_loop(self) -> None:
        set_torch_threads(self._torch_threads)  # the retries and halves of a failed batch run the model here
        publisher, txns = self._publisher, self._transactions
        clock = self._clocks["finish"]
        done = 0  # batches finished and not settled yet: settled once the next arrives or they are sent
        abandoned = False  # a batch was left undone while stopping (processing.Abandoned)
        while True:
            try:
                item = self._to_finish.get_nowait()
            except queue.Empty:
                if done:
                    # Nothing next: make sure what was produced goes out now (Publisher.send_now). Still not idle
                    # for the adaptive batch policy, so records arriving meanwhile join the next batch.
                    self._run(lambda: publisher.send_now(_SEND_WINDOW_S))
                    self._settle(done)
                    done = 0
                    continue
                try:
                    item = self._to_finish.get(timeout=_SERVE_EVERY_S)
                except queue.Empty:  # idle: acknowledge what was delivered meanwhile
                    if self._failed():
                        # At once, not when the next batch comes (a hung device may never hand one on): a failing
                        # worker holds no transaction open. The shutdown serves what is still to be delivered.
                        self._run(lambda: txns.abort(publisher))
                        continue
                    self._run(publisher.serve)
                    continue
            if done:
                self._settle(done)
                done = 0
            if item is None:
                if self._failed():
                    txns.abort(publisher)
                elif txns.is_open():  # a batch joined it as the stages were told to finish
                    self._run(lambda: txns.commit(publisher))
                return
            done = 1
            if self._failed():
                txns.abort(publisher)  # nothing after a failure may be published
                continue  # drain without work
            if abandoned or txns.stale(item.batch.epoch):
                continue  # stopping after an abandoned batch, or consumed before a rewind: consumed again later
            started = clock.start()
            flight = item.flight if isinstance(item, Begun) else None
            waited = flight.waited if flight is not None else 0.0
            try:
                if isinstance(item, _Job):
                    assert item.error is not None
                    raise item.error
                if self._exactly_once:
                    txns.process(item, self._processor, publisher)
                    if txns.due() or self._active == 1:  # nothing behind it to join the transaction: commit
                        txns.commit(publisher)
                else:
                    self._processor.complete(item)
                    faults.reach("after-produce")
            except Abandoned as exc:
                abandoned = True
                log.warning("%s: this batch and the ones after it are left uncommitted", exc)
            except BaseException as exc:
                self._fail(exc)
            waited = (flight.waited if flight is not None else 0.0) - waited  # the device's time, not this thread's
            clock.stop(started, waited)

    def _run(self, call: Callable[[], None]) -> None:
        """Run ``call``; an exception from it fails the worker instead of the thread."""
        try:
            call()
        except BaseException as exc:
            self._fail(exc)
