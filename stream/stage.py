"""The processing stage: a thread that takes closed batches from a bounded queue and runs them through the
`BatchProcessor` (decode, model, encode, publish), serving the producer's delivery reports in between.

The queue holds at most ``max_inflight_batches`` batches (slots released as the thread takes them) plus room
for the stop sentinel. Publishing order is the queue's order; after a failure nothing more is published, after a
batch abandoned while stopping nothing more is committed, and batches of a rewound epoch are dropped. On a GPU
the thread keeps one batch ahead: the next batch is decoded, copied and queued on the device while the host
waits for, encodes and publishes the one before (never under exactly-once).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from stream import faults
from stream.deadline import Deadline
from stream.processing import Abandoned, BatchProcessor, Begun, Dispatched
from stream.publish import Publisher
from stream.runtime import set_torch_threads
from stream.transactions import Transactions

log = logging.getLogger(__name__)
_SERVE_EVERY_S = 0.002  # an idle processor serves delivery reports this often
_SEND_WINDOW_S = 0.001  # how long a processor that runs out of work flushes the batch it just produced


class ProcessingStage:
    def __init__(self, processor: BatchProcessor, publisher: Publisher, transactions: Transactions, *,
                 max_inflight_batches: int, torch_threads: int, pipelined: bool, exactly_once: bool,
                 fail: Callable[[BaseException], None], failed: Callable[[], bool],
                 on_idle: Callable[[], None] | None = None,
                 queue_wait: Callable[[float], None] | None = None) -> None:
        self._processor = processor
        self._publisher = publisher
        self._transactions = transactions
        self._torch_threads = torch_threads
        self._pipelined = pipelined and not exactly_once
        self._exactly_once = exactly_once
        self._fail = fail
        self._failed = failed
        self._slots = threading.BoundedSemaphore(max_inflight_batches)
        self._queue: queue.Queue[Dispatched | None] = queue.Queue(maxsize=max_inflight_batches + 1)
        self._busy = False  # written by the stage's thread only
        self._on_idle = on_idle  # called by the stage's thread as it runs out of work (wakes the poll thread)
        self._queue_wait = queue_wait  # given each batch's seconds in the queue as the thread takes it
        self._thread = threading.Thread(target=self._loop, name="processor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the poll thread ------------------------------------------------------------------------------------
    def offer(self, close_batch: Callable[[], Dispatched], wait_s: float) -> bool:
        """Queue the batch ``close_batch`` closes if a slot frees within ``wait_s`` (0: only if one is free now).
        Blocks on the slot, never spins: a spinning poll thread steals the GIL from the processor."""
        acquired = self._slots.acquire(timeout=wait_s) if wait_s > 0 else self._slots.acquire(blocking=False)
        if not acquired:
            return False
        batch = close_batch()
        batch.queued_at = time.monotonic()
        self._queue.put_nowait(batch)
        return True

    def queued(self) -> int:
        """Closed batches waiting for the stage's thread."""
        return self._queue.qsize()

    def idle(self) -> bool:
        """No batch queued and none being processed."""
        return not self._busy and self._queue.empty()

    def finish(self, deadline: Deadline) -> None:
        """Let the thread finish what is queued, then stop it."""
        try:
            self._queue.put(None, timeout=deadline.left(0.01))
        except queue.Full:
            log.error("processor did not drain its queue within the shutdown timeout")
        self._thread.join(timeout=deadline.left(0.01))

    # -- the stage's thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        set_torch_threads(self._torch_threads)
        publisher = self._publisher
        ahead: Begun | None = None
        sent = False  # a batch was published since the stage last waited for work
        abandoned = False  # a batch was left undone while stopping (processing.Abandoned)
        while True:
            if ahead is None:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    if sent:
                        # Nothing next: make sure the last batch goes out now (Publisher.send_now). Still busy for
                        # the adaptive batch policy, so records arriving meanwhile join the next batch.
                        sent = False
                        self._run(lambda: publisher.send_now(_SEND_WINDOW_S))
                        continue
                    if self._busy:
                        self._busy = False
                        if self._on_idle is not None:
                            self._on_idle()  # an adaptive batch waiting for the model to go idle closes now
                    try:
                        item = self._queue.get(timeout=_SERVE_EVERY_S)
                    except queue.Empty:  # idle: acknowledge what was delivered meanwhile
                        self._run(publisher.serve)
                        continue
            else:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:  # nothing to overlap with: finish the batch on the device now
                    self._complete(ahead)
                    ahead = None
                    continue
            if item is None:
                if ahead is not None:
                    self._complete(ahead)
                if self._failed():
                    self._transactions.abort(publisher)
                elif self._transactions.is_open():  # a batch joined it as the stop sentinel was queued
                    self._run(lambda: self._transactions.commit(publisher))
                return
            self._busy = True
            sent = True
            self._slots.release()
            if self._queue_wait is not None:
                self._queue_wait(time.monotonic() - item.queued_at)
            if self._failed():
                ahead = None
                self._transactions.abort(publisher)  # nothing after a failure may be published
                continue  # drain without work
            if abandoned:
                continue  # stopping, and an earlier batch was left undone: nothing after it may be committed
            if self._transactions.stale(item.epoch):
                continue  # consumed before a rewind: it will be consumed again
            try:
                if self._exactly_once:
                    txns = self._transactions
                    txns.process(item, self._processor, publisher)
                    if txns.due() or self._queue.empty():  # nothing to join it now: commit
                        txns.commit(publisher)
                elif self._pipelined:
                    begun = self._processor.begin(item)
                    if ahead is not None:
                        previous, ahead = ahead, None
                        self._complete(previous)
                    ahead = begun
                else:
                    self._processor.process(item)
                    faults.reach("after-produce")
            except Abandoned as exc:
                abandoned = True
                log.warning("%s: this batch and the ones after it are left uncommitted", exc)
            except BaseException as exc:
                self._fail(exc)

    def _run(self, call: Callable[[], None]) -> None:
        """Run ``call``; an exception from it fails the worker instead of the thread."""
        try:
            call()
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, begun: Begun) -> None:
        if self._failed():
            return  # nothing after a failure may be published
        try:
            self._processor.complete(begun)
            faults.reach("after-produce")
        except BaseException as exc:
            self._fail(exc)
