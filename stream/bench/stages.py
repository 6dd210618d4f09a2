"""The stages against a simulated device: the proof, without a GPU, that host work overlaps the device.

On MiniLM's real host path (decode, tokenize, lay out; encode and publish 384 floats a text) against the
benchmark's broker, all at one batch size, in rounds:

* **tokenizing alone**: `MiniLMHandler.tokenize` over the texts, batch after batch, in this process (what the
  host path's largest step can do with the machine to itself);
* **host ceiling H**: ``python -m stream worker --model stream.bench.simulated:SimulatedDevice`` with a free model
  (``predict`` returns zeros at once) draining the texts: the rate the host path sustains;
* **simulated device D**: the same handler whose ``predict`` sleeps a set time per padded token without holding the
  GIL, as a kernel the host waits for would; D is its model-alone rate (its passes over batches laid out before),
  set to about H/2 and to about H from that round's H. A worker whose stages overlap reaches about min(D, H); one
  whose single thread did everything in turn would reach 1 / (1/D + 1/H): 0.67 D at D = H/2, 0.5 H at D = H.

The targets (issue 46): at D = H/2 the worker >= 0.9 D; at D = H, >= 0.75 H; and H >= 0.8x tokenizing alone.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from stream.bench.simulated import SimulatedDevice, write_spec
from stream.models.demo import TEXT_COPY_FIELDS, TEXT_EMBEDDING_SCHEMA, TEXT_EVENT_SCHEMA

TARGETS = {"half": 0.9, "full": 0.75, "host": 0.8}


@dataclass
class StagesBenchConfig:
    texts: int = 100_000  # pre-produced once, drained by every worker of every round
    batch: int = 128
    rounds: int = 3
    tokenize_texts: int = 20_480  # tokenizing alone runs over the first this many


def quick_stages_config() -> StagesBenchConfig:
    """Small counts (CI): checks that the section runs, not its figures."""
    return StagesBenchConfig(texts=1_024, batch=128, rounds=1, tokenize_texts=512)


def tokenize_alone(handler: SimulatedDevice, texts: list[str], batch: int, parallel: bool = True) -> float:
    """Texts/s of ``handler.tokenize`` over ``texts`` in batches of ``batch``; ``parallel`` False: the tokenizer on
    one thread (TOKENIZERS_PARALLELISM=false), as the figure's context."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    try:
        handler.tokenize(texts[:batch])  # warm-up
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            handler.tokenize(texts[i:i + batch])
        return len(texts) / (time.perf_counter() - started)
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def padded_tokens_per_text(handler: SimulatedDevice, ids: list[list[int]], batch: int) -> float:
    """The padded tokens a text costs the device in the handler's passes, at ``batch``."""
    return sum(len(handler.layout(ids[i:i + batch])["ids"]) for i in range(0, len(ids), batch)) / len(ids)


def run_stages_bench(bench: Any, cfg: StagesBenchConfig, console_print: Callable[..., None] = print,
                     model_alone: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any]:
    """The section's figures; ``bench`` is the `stream.bench.runner.Bench` whose broker holds the topics."""
    from producers.texts import generate_texts, produce_texts
    from stream.bench.text import model_alone as text_model_alone

    measure = model_alone or text_model_alone
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker's --torch-threads 1: no OpenMP pool spinning beside the tokenizer
    try:
        handler = SimulatedDevice(None)
        handler.load(torch.device("cpu"))
        texts = generate_texts(cfg.texts, seed=2027).texts
        sample = texts[: cfg.tokenize_texts]
        ids = handler.tokenize(sample)
        per_text = padded_tokens_per_text(handler, ids, cfg.batch)
        report: dict[str, Any] = {
            "config": asdict(cfg), "padded_tokens_per_text": per_text, "targets": TARGETS,
            "tokenize_alone": tokenize_alone(handler, sample, cfg.batch),
            "tokenize_alone_one_thread": tokenize_alone(handler, sample, cfg.batch, parallel=False),
            "rounds": []}
        topic = bench.topic("stages-in")
        produced = produce_texts(bench.bootstrap, topic, cfg.texts, seed=2027)
        if produced != cfg.texts:
            raise RuntimeError(f"pre-producing texts: {produced} of {cfg.texts} acknowledged")
        for r in range(cfg.rounds):
            console_print(f"bench: stages, round {r + 1} of {cfg.rounds}: the free model (host ceiling) ...")
            free = _drain(bench, f"stages-free-{r}", 0.0, topic, cfg.batch)
            entry: dict[str, Any] = {"host": _figures(free)}
            host = free.rate
            for name, fraction in (("half", 0.5), ("full", 1.0)):
                ns = 1e9 / (host * fraction * per_text)
                device = SimulatedDevice(write_spec(bench.work / f"device-{r}-{name}.json", ns))
                device.load(torch.device("cpu"))
                alone = measure(device, ids, cfg.batch, torch.device("cpu"))
                console_print(f"bench: stages, round {r + 1}: simulated device at {alone['rate']:,.0f} texts/s "
                              f"(D = {fraction:g} H) ...")
                drain = _drain(bench, f"stages-{name}-{r}", ns, topic, cfg.batch)
                entry[name] = {"ns_per_token": ns, "device_alone": alone["rate"], "worker": _figures(drain),
                               "over_device": drain.rate / alone["rate"], "over_host": drain.rate / host}
            entry["host_over_tokenize"] = host / report["tokenize_alone"]
            report["rounds"].append(entry)
        report["summary"] = summarize_stages(report)
        return report
    finally:
        torch.set_num_threads(previous)


def _drain(bench: Any, name: str, ns_per_token: float, topic: str, batch: int) -> Any:
    spec = write_spec(Path(bench.work) / f"{name}.json", ns_per_token)
    return bench.worker_drain(name, [
        "--model", "stream.bench.simulated:SimulatedDevice", "--model-dir", str(spec), "--device", "cpu",
        "--input-schema", TEXT_EVENT_SCHEMA, "--output-schema", TEXT_EMBEDDING_SCHEMA, "--copy-fields",
        TEXT_COPY_FIELDS, "--max-batch-size", str(batch), "--max-wait-ms", "1000", "--torch-threads", "1"],
        input_topic=topic, model_dir=False)


def _figures(drain: Any) -> dict[str, Any]:
    return {"events": drain.events, "seconds": drain.seconds, "rate": drain.rate,
            "mean_batch_size": drain.mean_batch_size, "stage_busy_s": drain.stage_busy_s,
            "cpu_cores": drain.cpu_cores}


def summarize_stages(report: dict[str, Any]) -> dict[str, Any]:
    """Per ratio: the median over the rounds, the lowest and highest, and whether the median meets its target."""
    ratios = {"half": [r["half"]["over_device"] for r in report["rounds"]],
              "full": [r["full"]["over_host"] for r in report["rounds"]],
              "host": [r["host_over_tokenize"] for r in report["rounds"]]}
    out: dict[str, Any] = {
        name: {"median": statistics.median(values), "min": min(values), "max": max(values),
               "target": TARGETS[name], "met": statistics.median(values) >= TARGETS[name]}
        for name, values in ratios.items()}
    out["host_cpu"] = host_cpu(report)
    return out


def host_cpu(report: dict[str, Any]) -> dict[str, float] | None:
    """Where the host ceiling's CPU goes, medians over the rounds' free-model drains: the cores the worker and
    the broker used, and their CPU microseconds a text beside tokenizing's own (``tokenize_alone_one_thread``:
    one core's worth)."""
    drains = [r["host"] for r in report["rounds"] if (r["host"].get("cpu_cores") or {}).get("workers")]
    if not drains:
        return None
    worker = statistics.median(d["cpu_cores"]["workers"] for d in drains)
    broker = [d["cpu_cores"]["broker"] for d in drains if "broker" in d["cpu_cores"]]
    rate = statistics.median(d["rate"] for d in drains)
    out = {"worker_cores": worker, "worker_us_per_text": statistics.median(
               d["cpu_cores"]["workers"] / d["rate"] * 1e6 for d in drains),
           "tokenize_us_per_text": 1e6 / report["tokenize_alone_one_thread"], "rate": rate}
    if broker:
        out["broker_cores"] = statistics.median(broker)
        out["broker_us_per_text"] = statistics.median(
            d["cpu_cores"]["broker"] / d["rate"] * 1e6 for d in drains if "broker" in d["cpu_cores"])
    return out


def format_host_cpu(section: dict[str, Any]) -> str | None:
    cpu = section.get("summary", {}).get("host_cpu")
    if not cpu:
        return None
    broker = (f"; the broker {cpu['broker_cores']:.2f} cores, {cpu['broker_us_per_text']:.0f} µs a text"
              if "broker_cores" in cpu else "")
    return (f"host ceiling drains (medians): the worker {cpu['worker_cores']:.2f} cores, "
            f"{cpu['worker_us_per_text']:.0f} µs of CPU a text (tokenizing alone: {cpu['tokenize_us_per_text']:.0f} "
            f"µs a text on one thread){broker}")


def format_stages_table(section: dict[str, Any]) -> list[list[str]]:
    """Rows: one per figure and round, the median and spread last."""
    rows = [["round", "host ceiling H (texts/s)", "D = H/2: device alone", "worker", "worker / D",
             "D = H: device alone", "worker", "worker / H", "H / tokenizing alone"]]
    for i, r in enumerate(section["rounds"]):
        rows.append([str(i + 1), f"{r['host']['rate']:,.0f}", f"{r['half']['device_alone']:,.0f}",
                     f"{r['half']['worker']['rate']:,.0f}", f"{r['half']['over_device']:.2f}",
                     f"{r['full']['device_alone']:,.0f}", f"{r['full']['worker']['rate']:,.0f}",
                     f"{r['full']['over_host']:.2f}", f"{r['host_over_tokenize']:.2f}"])
    s = section["summary"]

    def spread(name: str) -> str:
        return f"{s[name]['median']:.2f} ({s[name]['min']:.2f}-{s[name]['max']:.2f}; >= {s[name]['target']:g})"

    rows.append(["median (range; target)", "", "", "", spread("half"), "", "", spread("full"), spread("host")])
    return rows
