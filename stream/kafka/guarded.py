"""Calls that may never return (a transactional producer's, against a coordinator that stopped answering; a
start-up's request to brokers or a schema registry that do not answer) run on a thread of their own, so that their
caller waits a bounded time, or until it is told to stop, and can give up on them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from stream.errors import StoppedAtStartUp

T = TypeVar("T")

_Job = tuple[Callable[[], None], threading.Event, list[BaseException]] | None  # None: the thread ends


class GuardedCalls:
    """Runs calls on a thread of its own for a caller that waits a bounded time; a thread whose call does not
    return in time is abandoned (it stays blocked in the call) and the next call gets a new one."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] | None = None
        self._thread: threading.Thread | None = None

    def run(self, call: Callable[[], None], timeout_s: float) -> bool:
        """Run ``call``; re-raise what it raised. False when it has not returned within ``timeout_s``."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="txn-guard", daemon=True)
            self._thread.start()
        done, raised = threading.Event(), list[BaseException]()
        self._jobs.put((call, done, raised))
        if not done.wait(timeout_s):
            return False
        if raised:
            raise raised[0]
        return True

    def abandon(self) -> threading.Thread:
        """Give up on the thread whose call is stuck; returns it (alive until its call returns, then it ends)."""
        thread, jobs = self._thread, self._jobs
        assert thread is not None and jobs is not None
        self._thread = self._jobs = None
        jobs.put(None)  # ends it once its call returns
        return thread

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while (job := jobs.get()) is not None:
            call, done, raised = job
            try:
                call()
            except BaseException as exc:  # handed to the waiting caller
                raised.append(exc)
            done.set()


def unless_stopped(call: Callable[[], T], stopping: Callable[[], bool], what: str,
                   serve: Callable[[float], object] | None = None, slice_s: float = 0.1) -> T:
    """``call()`` on a daemon thread of its own while this thread looks at ``stopping`` every ``slice_s``, serving
    meanwhile (``serve(slice_s)``: an admin client's poll, so that its callbacks run) or waiting: its result (its
    exception raised here), or `StoppedAtStartUp` (``what``) as soon as ``stopping()``; the call is left to end
    alone. A schema registry that does not answer holds each request for its timeout, with retries: a worker
    told to stop meanwhile took 43 s to exit, past Kubernetes' 30 s grace."""
    done = threading.Event()
    result: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the waiting thread
            raised.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"start-up: {what}", daemon=True).start()
    while not done.is_set():
        if stopping():
            raise StoppedAtStartUp(what)
        if serve is None:
            done.wait(slice_s)
        else:
            serve(slice_s)
    if raised:
        raise raised[0]
    return result[0]
