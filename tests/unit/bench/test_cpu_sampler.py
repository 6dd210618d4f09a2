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
            start, used_before = time.time(), cpu_seconds(busy.pid)
            time.sleep(1.5)
            end, used_after = time.time(), cpu_seconds(busy.pid)
        cores = sampler.cores(start, end)
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert set(cores) == {"busy", "idle"}
    # Against what the spinner really got, read at the window's ends (a fifth of a core or less when CI runs the
    # image's build beside this): the samples (every 0.05 s) are interpolated between.
    assert used_before is not None and used_after is not None
    got = (used_after - used_before) / (end - start)
    assert got > 0.05 and abs(cores["busy"] - got) < max(0.05, got / 2), (cores, got)
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
    # The slope of the segment around the window, however much of a core the spinner got (a CI run beside the
    # image's build gave it a fifth of one): compared with the samples themselves, not with a share of a core.
    _, (tick, at_tick), (last, at_exit) = sampler.samples  # the start's was taken before the watch
    slope = (at_exit["busy"] - at_tick["busy"]) / (last - tick)
    assert short["busy"] == pytest.approx(slope) and at_once["busy"] == pytest.approx(slope), (short, at_once, slope)
    assert tail["busy"] == pytest.approx(slope), tail  # cut at the exit's sample, not divided by the 5 s past it
    assert tick <= start and end <= last


def test_cpu_seconds_of_a_process_that_is_gone_is_none() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid) is None
    assert (cpu_seconds(os.getpid()) or 0.0) > 0.0
