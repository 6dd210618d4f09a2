"""The benchmark's per-process CPU figures (``CpuSampler``): read from ``/proc``, over a window of wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stream.bench.probes import CpuSampler, cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


def test_a_busy_process_reads_near_one_core_and_a_sleeping_one_near_none() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        with CpuSampler(every_s=0.05) as sampler:
            sampler.watch("busy", busy.pid)
            sampler.watch("idle", idle.pid)
            sampler.watch("none", None)  # no process (a given cluster's broker): never sampled
            time.sleep(0.5)  # past both interpreters' start-up
            start = time.time()
            time.sleep(1.5)
            end = time.time()
        cores = sampler.cores(start, end)
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert set(cores) == {"busy", "idle"}
    assert 0.3 < cores["busy"] <= 1.1, cores  # one thread spinning, on a machine that may be busy
    assert cores["idle"] < 0.1, cores


def test_a_window_outside_a_process_s_samples_leaves_it_out() -> None:
    with CpuSampler(every_s=0.05) as sampler:
        sampler.watch("me", os.getpid())
        time.sleep(0.3)
    assert sampler.cores(0.0, 1.0) == {}  # no sample in 1970
    assert "me" in sampler.cores(0.0, time.time())


def test_a_window_shorter_than_the_sampling_step_reads_the_slope_around_it() -> None:
    """A latency step's window can fall between two samples (a held-up sampler thread on a loaded machine left
    the CI run at a37c8d1 with no figure at all): it reads the interpolated slope, and the exit's sample closes
    a window that ends after the last tick."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        with CpuSampler(every_s=1.0) as sampler:
            sampler.watch("busy", busy.pid)
            time.sleep(1.3)
            start = time.time()
            time.sleep(0.1)
            end = time.time()
            time.sleep(0.2)
        inside = [t for t, _ in sampler.samples if start <= t <= end]
        short = sampler.cores(start, end)
        at_once = sampler.cores(start, start)
        tail = sampler.cores(sampler.samples[-2][0] + 0.01, sampler.samples[-1][0] + 5.0)
    finally:
        busy.kill()
        busy.wait()
    assert inside == [] and len(sampler.samples) == 3, sampler.samples  # the start's, the tick's, the exit's
    assert 0.3 < short["busy"] <= 1.1 and 0.3 < at_once["busy"] <= 1.1, (short, at_once)
    assert 0.3 < tail["busy"] <= 1.1, tail  # cut at the exit's sample, not divided by the 5 s past it


def test_cpu_seconds_of_a_process_that_is_gone_is_none() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid) is None
    assert (cpu_seconds(os.getpid()) or 0.0) > 0.0
