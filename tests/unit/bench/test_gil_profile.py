"""stream.bench.gil's reading of py-spy's raw profiles: samples under the pipeline's loops per thread and step,
the innermost known step winning, and µs of GIL-held time a text."""

from __future__ import annotations

import pytest

from stream.bench.gil import RATE_HZ, gil_us_per_text, parse_raw

STACKS = [
    (["thread (0x1): MainThread", "<module> (stream/__main__.py:3)",
      "Worker._poll_loop (stream/pipeline/worker.py:323)", "Intake.take (stream/kafka/intake.py:75)",
      "NativeInput.consume (stream/kafka/native.py:187)", "Queue_consume (_nativeconsume.c)"], 7),
    (["thread (0x1): MainThread", "Worker._poll_loop (stream/pipeline/worker.py:334)",
      "ProcessingStages.offer (stream/pipeline/stage.py:105)", "Spans.close_batch (stream/pipeline/spans.py:77)",
      "Records.concat (stream/kafka/records.py:84)", "memcpy (libc.so.6)"], 5),
    (["thread (0x2): prepare-0", "Thread.run (threading.py:982)",
      "ProcessingStages._prepare_loop (stream/pipeline/stage.py:150)",
      "BatchProcessor.prepare (stream/pipeline/processing.py:170)", "_as_input (stream/pipeline/inputs.py:176)"], 4),
    (["thread (0x2): prepare-1", "ProcessingStages._prepare_loop (stream/pipeline/stage.py:160)"], 2),
    (["thread (0x3): finish", "ProcessingStages._finish_loop (stream/pipeline/stage.py:247)",
      "BatchProcessor.complete (stream/pipeline/processing.py:230)", "free (libc.so.6)"], 3),
    (["thread (0x1): MainThread", "<module> (stream/__main__.py:3)",
      "_find_and_load (<frozen importlib._bootstrap>:1176)"], 9),
]
RAW = "\n".join(f"{';'.join(frames)} {count}" for frames, count in STACKS) + "\nnot a stack line\n"


def test_samples_are_counted_per_thread_and_innermost_known_step() -> None:
    samples = parse_raw(RAW)
    assert samples == {"poll": {"Intake.take": 7, "Records.concat": 5},
                       "prepare": {"_as_input": 4, "prepare loop": 2},
                       "finish": {"BatchProcessor.complete": 3},
                       "other": {"-": 9}}


def test_figures_are_microseconds_of_gil_a_text() -> None:
    figures = gil_us_per_text(parse_raw(RAW), texts=1_000)
    per_sample = 1e6 / RATE_HZ / 1_000
    assert figures["threads"] == pytest.approx({"poll": 12 * per_sample, "prepare": 6 * per_sample,
                                                "finish": 3 * per_sample})
    assert figures["total"] == pytest.approx(21 * per_sample)
    assert next(iter(figures["steps"])) == "poll: Intake.take"
    assert figures["outside_loops_samples"] == 9
