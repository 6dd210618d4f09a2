"""Seeded synthetic texts for ``--model minilm`` (the demo and the benchmark), and a producer for them.

Lengths follow a long-tailed mix like that of messages, reviews and tickets: the word count is log-normal (median
15 words, about 20 tokens; one text in ten over 45 words, one in a few hundred over 256 tokens, which the model
cuts). Pure and seeded: the same (seed, start, count) always gives the same texts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from stream.codec import SchemaRegistry, encode
from stream.models.demo_names import TEXT_EVENT_SCHEMA

_SUBJECTS = ("the customer", "our team", "a new user", "the driver", "my neighbour", "the support agent",
             "the warehouse", "this app", "the hotel", "the courier", "a reviewer", "the bank", "the engineer",
             "the teacher", "your order", "the airline", "the clinic", "the landlord", "the shop", "the library")
_VERBS = ("reported", "asked about", "complained about", "praised", "cancelled", "delivered", "fixed", "ordered",
          "returned", "reviewed", "booked", "described", "lost", "found", "paid for", "shipped", "recommended",
          "updated", "ignored", "repaired")
_ADJECTIVES = ("late", "broken", "excellent", "expensive", "missing", "noisy", "friendly", "slow", "quick",
               "confusing", "cheap", "damaged", "perfect", "strange", "reliable", "cold", "crowded", "clean")
_OBJECTS = ("package", "refund", "invoice", "room", "flight", "phone", "password reset", "subscription",
            "delivery", "meal", "account", "appointment", "battery", "train ticket", "software update", "coffee",
            "parking permit", "insurance claim", "jacket", "laptop")
_TAILS = ("yesterday", "this morning", "after two weeks", "for the third time", "without any explanation",
          "before the weekend", "in Berlin", "at the airport", "on the website", "over the phone",
          "despite the storm", "as promised", "again", "last night", "during the holidays", "in the end")


@dataclass(frozen=True)
class TextBlock:
    event_ids: list[str]
    keys: list[str]
    texts: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def word_counts(count: int, rng: np.random.Generator) -> np.ndarray:
    """Words per text: log-normal, median 15, clipped to 1..600."""
    return np.clip(np.round(rng.lognormal(np.log(15.0), 0.8, count)), 1, 600).astype(np.int64)


def _sentence(rng: np.random.Generator) -> str:
    picks = rng.integers(0, 1 << 30, 5)
    return (f"{_SUBJECTS[picks[0] % len(_SUBJECTS)].capitalize()} {_VERBS[picks[1] % len(_VERBS)]} the "
            f"{_ADJECTIVES[picks[2] % len(_ADJECTIVES)]} {_OBJECTS[picks[3] % len(_OBJECTS)]} "
            f"{_TAILS[picks[4] % len(_TAILS)]}.")


def generate_texts(count: int, *, seed: int = 0, start: int = 0, n_keys: int = 1_000) -> TextBlock:
    """Texts ``start .. start+count-1`` of the stream for ``seed``; ids are unique per (seed, index)."""
    if count < 0 or start < 0:
        raise ValueError("count and start must be >= 0")
    texts: list[str] = []
    keys: list[str] = []
    for index in range(start, start + count):
        rng = np.random.default_rng([seed, index])  # per index: any window of the stream is reproducible
        words: list[str] = []
        target = int(word_counts(1, rng)[0])
        while len(words) < target:
            words += _sentence(rng).split()
        text = " ".join(words[:target])
        texts.append(text if text.endswith(".") else text + ".")
        keys.append(f"conversation-{int(rng.integers(n_keys))}")
    return TextBlock(text_ids(count, seed=seed, start=start), keys, texts)


def text_ids(count: int, *, seed: int = 0, start: int = 0) -> list[str]:
    """The event ids of texts ``start .. start+count-1`` of stream ``seed`` (without making the texts)."""
    return [f"text-{seed}-{i}" for i in range(start, start + count)]


def produce_texts(bootstrap: str, topic: str, count: int, *, seed: int = 0, start: int = 0,
                  config: dict[str, Any] | None = None, on_progress: Callable[[int], None] | None = None,
                  timeout_s: float = 120.0, chunk: int = 2_000, rate: float | None = None,
                  stop: threading.Event | None = None) -> int:
    """Publish texts ``start .. start+count-1`` of stream ``seed`` as ``stream.demo.TextEvent`` records (the
    schema folder's id); the number delivered. Raises RuntimeError on a delivery failure.

    ``rate``: texts/s, in chunks of a tenth of a second's texts (None: as fast as possible, ``chunk`` at a time).
    ``stop``: once set, no further chunk is sent; what was sent is flushed and counted (texts ``start ..
    start+returned-1``)."""
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0")
    schema = SchemaRegistry.from_dir().by_name(TEXT_EVENT_SCHEMA)
    if rate is not None:
        chunk = max(1, int(rate / 10))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                         "enable.idempotence": True, "acks": "all", **(config or {})})
    delivered = 0
    failures: list[str] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            failures.append(str(err))

    started = time.monotonic()
    for first in range(start, start + count, chunk):
        if stop is not None and stop.is_set():
            break
        if rate is not None:
            time.sleep(max(0.0, started + (first - start) / rate - time.monotonic()))
        block = generate_texts(min(chunk, start + count - first), seed=seed, start=first)
        now = int(time.time() * 1000)
        for event_id, key, text in zip(block.event_ids, block.keys, block.texts, strict=True):
            value = encode(schema, {"event_id": event_id, "key": key, "ts_ms": now, "text": text})
            while True:
                try:
                    producer.produce(topic, value, key.encode(), on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        if on_progress is not None:
            on_progress(delivered)
    left = producer.flush(timeout_s)
    if failures or left:
        raise RuntimeError(f"producing texts to {topic}: {len(failures)} failed ({failures[:1]}), {left} undelivered")
    if on_progress is not None:
        on_progress(delivered)
    return delivered


def produce_texts_in_parallel(bootstrap: str, topic: str, count: int, *, seed: int = 0, processes: int = 1) -> int:
    """`produce_texts` of texts ``0 .. count-1`` split between ``processes`` child processes (fresh interpreters:
    none of the caller's state, a CUDA context included, is inherited), each a contiguous range: the same texts, in
    an order interleaved between the ranges. The number delivered; a failed child's error is raised."""
    if processes <= 1 or count < 2 * processes:
        return produce_texts(bootstrap, topic, count, seed=seed)
    import subprocess
    import sys

    step = -(-count // processes)
    code = ("import sys; from producers.texts import produce_texts; "
            "print(produce_texts(sys.argv[1], sys.argv[2], int(sys.argv[4]), seed=int(sys.argv[5]), "
            "start=int(sys.argv[3])))")
    children = [subprocess.Popen([sys.executable, "-c", code, bootstrap, topic, str(start),
                                  str(min(step, count - start)), str(seed)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for start in range(0, count, step)]
    delivered, errors = 0, []
    try:
        for child in children:
            out, err = child.communicate()
            if child.returncode != 0:
                errors.append(f"exit {child.returncode}: {err.strip()[-500:]}")
            else:
                delivered += int(out.split()[-1])
    finally:  # interrupted: none left producing
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    if errors:
        raise RuntimeError(f"producing texts to {topic} in {len(children)} processes: {'; '.join(errors)}")
    return delivered
