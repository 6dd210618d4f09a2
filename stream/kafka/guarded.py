"""Calls that may never return (a transactional producer's, against a coordinator that stopped answering) run on a
thread of their own, so that their caller waits a bounded time and can give up on them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

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
