"""The stages against a simulated device: the proof, without a GPU, that host work overlaps the device.

On MiniLM's real host path (decode, tokenize, lay out; encode and publish 384 floats a text) against the
benchmark's broker, all at one batch size, in rounds:

* **tokenizing alone**: `MiniLMHandler.tokenize_flat` (what ``prepare`` tokenizes with: the C WordPiece for ASCII
  texts) over the texts, batch after batch, in this process; and the tokenizers library's alone, as the handler
  tokenized every text before the C WordPiece;
* **host ceiling H**: ``python -m stream worker --model stream.bench.simulated:SimulatedDevice`` with a free model
  (``predict`` returns zeros at once) draining the texts: the rate the host path sustains; and the same with the
  tokenizers library for every text (``"tokenizer": "library"``), the host ceiling before the C WordPiece;
* **simulated device D**: the same handler whose ``predict`` sleeps a set time per padded token without holding the
  GIL, as a kernel the host waits for would; D is its model-alone rate (its passes over batches laid out before),
  set to about H/2 and to about H from that round's H. A worker whose stages overlap reaches about min(D, H); one
  whose single thread did everything in turn would reach 1 / (1/D + 1/H): 0.67 D at D = H/2, 0.5 H at D = H;
* **broker pass-through**: ``stream.bench.contenders passthrough`` over the same texts, producing a value as big
  as the worker's (384 floats and the copied fields) per text and committing: what a bare consume-produce loop
  gets through this broker, to read H against (no target; the text section's broker ceiling, per round here).

The targets (issue 46): at D = H/2 the worker >= 0.9 D; at D = H, >= 0.75 H; and H >= 0.8x tokenizing alone
(set when tokenizing was the library's; both are reported: H against the handler's tokenizing, and the library
host ceiling against the library's tokenizing). H against the pass-through has no target: it shows how much of
what the broker lets through the worker's own path leaves.
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
from stream.pipeline.malloc import MODEL_BOUND_MMAP_THRESHOLD

TARGETS: dict[str, float | None] = {"half": 0.9, "full": 0.75, "host": 0.8, "library_host": 0.8, "gain": None,
                                    "broker": None}


@dataclass
class StagesBenchConfig:
    # pre-produced once, drained by every worker of every round; enough that a drain lasts several seconds at the
    # host ceiling (since the tokenizer in C a drain of 100,000 took 1.4-1.7 s, and the up to one commit interval
    # (1 s) between the last prediction and the commit that ends a drain's window weighed up to 40 % of it)
    texts: int = 300_000
    batch: int = 128
    rounds: int = 3
    tokenize_texts: int = 20_480  # tokenizing alone runs over the first this many


def quick_stages_config() -> StagesBenchConfig:
    """Small counts (CI): checks that the section runs, not its figures."""
    return StagesBenchConfig(texts=1_024, batch=128, rounds=1, tokenize_texts=512)


def tokenize_alone(handler: SimulatedDevice, texts: list[str], batch: int, parallel: bool = True) -> float:
    """Texts/s of ``handler.tokenize_flat`` over ``texts`` in batches of ``batch``; ``parallel`` False: the
    tokenizers library on one thread (TOKENIZERS_PARALLELISM=false; the C WordPiece always runs on one)."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    try:
        handler.tokenize_flat(texts[:batch])  # warm-up
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            handler.tokenize_flat(texts[i:i + batch])
        return len(texts) / (time.perf_counter() - started)
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def padded_tokens_per_text(handler: SimulatedDevice, ids: list[list[int]], batch: int) -> float:
    """The padded tokens a text costs the device in the handler's passes, at ``batch``."""
    return sum(len(handler.layout(ids[i:i + batch])["ids"]) for i in range(0, len(ids), batch)) / len(ids)


def run_stages_bench(bench: Any, cfg: StagesBenchConfig, model_alone: Callable[..., dict[str, Any]],
                     console_print: Callable[..., None] = print) -> dict[str, Any]:
    """The section's figures; ``bench`` is the `stream.bench.runner.Bench` whose broker holds the topics."""
    from producers.texts import generate_texts, produce_texts

    measure = model_alone  # `stream.bench.text.model_alone` (passed in: text imports this module)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker's --torch-threads 1: no OpenMP pool spinning beside the tokenizer
    try:
        handler = SimulatedDevice(None)
        handler.load(torch.device("cpu"))
        library = SimulatedDevice(write_spec(bench.work / "library.json", 0.0, tokenizer="library"))
        library.load(torch.device("cpu"))
        texts = generate_texts(cfg.texts, seed=2027).texts
        sample = texts[: cfg.tokenize_texts]
        ids = handler.tokenize(sample)
        value_bytes = output_value_bytes(handler)
        per_text = padded_tokens_per_text(handler, ids, cfg.batch)
        report: dict[str, Any] = {
            "config": asdict(cfg), "padded_tokens_per_text": per_text, "targets": TARGETS,
            "tokenize_alone": tokenize_alone(handler, sample, cfg.batch),
            "tokenize_alone_one_thread": tokenize_alone(handler, sample, cfg.batch, parallel=False),
            "library_tokenize_alone": tokenize_alone(library, sample, cfg.batch),
            "library_tokenize_alone_one_thread": tokenize_alone(library, sample, cfg.batch, parallel=False),
            "rounds": []}
        topic = bench.topic("stages-in")
        produced = produce_texts(bench.bootstrap, topic, cfg.texts, seed=2027)
        if produced != cfg.texts:
            raise RuntimeError(f"pre-producing texts: {produced} of {cfg.texts} acknowledged")
        for r in range(cfg.rounds):
            console_print(f"bench: stages, round {r + 1} of {cfg.rounds}: the free model (host ceiling) ...")
            free = simulated_drain(bench, f"stages-free-{r}", 0.0, topic, cfg.batch)
            console_print(f"bench: stages, round {r + 1}: the free model with the tokenizers library ...")
            slow = simulated_drain(bench, f"stages-free-library-{r}", 0.0, topic, cfg.batch, tokenizer="library")
            console_print(f"bench: stages, round {r + 1}: broker pass-through, {value_bytes} B values ...")
            ceiling = broker_ceiling(bench, topic, cfg.texts, value_bytes, f"-stages-{r}")
            entry: dict[str, Any] = {"host": _figures(free), "host_library": _figures(slow),
                                     "broker_ceiling": ceiling}
            host = free.rate
            for name, fraction in (("half", 0.5), ("full", 1.0)):
                ns = 1e9 / (host * fraction * per_text)
                device = SimulatedDevice(write_spec(bench.work / f"device-{r}-{name}.json", ns))
                device.load(torch.device("cpu"))
                alone = measure(device, ids, cfg.batch, torch.device("cpu"))
                console_print(f"bench: stages, round {r + 1}: simulated device at {alone['rate']:,.0f} texts/s "
                              f"(D = {fraction:g} H) ...")
                drain = simulated_drain(bench, f"stages-{name}-{r}", ns, topic, cfg.batch)
                entry[name] = {"ns_per_token": ns, "device_alone": alone["rate"], "worker": _figures(drain),
                               "over_device": drain.rate / alone["rate"], "over_host": drain.rate / host}
            entry["host_over_tokenize"] = host / report["tokenize_alone"]
            entry["library_host_over_tokenize"] = slow.rate / report["library_tokenize_alone"]
            entry["host_over_library_host"] = host / slow.rate
            entry["host_over_broker"] = host / ceiling["rate"]
            report["rounds"].append(entry)
        report["summary"] = summarize_stages(report)
        return report
    finally:
        torch.set_num_threads(previous)


def output_value_bytes(handler: Any) -> int:
    """About the size of one embedding record the worker writes: its floats and a few copied fields."""
    return 4 * int(handler.outputs[0].size) + 64


def broker_ceiling(bench: Any, topic: str, count: int, value_bytes: int, tag: str) -> dict[str, Any]:
    """The broker's own ceiling for ``count`` texts of ``topic``: a pass-through that writes a ``value_bytes``
    value per text (no decode, no model)."""
    ceiling = bench.contender("passthrough", count, input_topic=topic, tag=tag,
                              extra=("--value-bytes", str(value_bytes)))
    return {"events": ceiling.events, "seconds": ceiling.seconds, "rate": ceiling.rate, "value_bytes": value_bytes}


def simulated_drain(bench: Any, name: str, ns_per_token: float, topic: str, batch: int,
                    tokenizer: str = "native") -> Any:
    """A worker draining ``topic`` with MiniLM's host path and a simulated device (``ns_per_token`` 0: the free
    model, the host path's own ceiling)."""
    spec = write_spec(Path(bench.work) / f"{name}.json", ns_per_token, tokenizer)
    return bench.worker_drain(name, text_worker_args(free_model(spec), batch), input_topic=topic, model_dir=False)


def free_model(spec: Path) -> list[str]:
    """The ``--model`` flags of a simulated device whose ``--model-dir`` file is ``spec`` (`write_spec`), with
    ``--model minilm``'s allocator setting (`stream.pipeline.malloc.mmap_threshold` keys it on the model's name):
    with the 128 KiB default every batch's megabytes of tokens, outputs and encoded predictions were mapped and
    faulted in afresh, which MiniLM's host path does not pay."""
    return ["--model", "stream.bench.simulated:SimulatedDevice", "--model-dir", str(spec),
            "--malloc-mmap-threshold-kib", str(MODEL_BOUND_MMAP_THRESHOLD // 1024)]


def text_model_args(model: list[str]) -> list[str]:
    """A worker's flags for the demo's texts with ``model`` (its ``--model`` flags) on the CPU at one torch thread:
    flags that every revision since the simulated device takes, so that `stream.bench.ab` can pass them to another
    revision's worker too."""
    return [*model, "--device", "cpu", "--input-schema", TEXT_EVENT_SCHEMA, "--output-schema", TEXT_EMBEDDING_SCHEMA,
            "--copy-fields", TEXT_COPY_FIELDS, "--torch-threads", "1"]


def text_worker_args(model: list[str], batch: int) -> list[str]:
    """`text_model_args` and the benchmark's batching: ``batch`` texts, closed after at most a second."""
    return [*text_model_args(model), "--max-batch-size", str(batch), "--max-wait-ms", "1000"]


def _figures(drain: Any) -> dict[str, Any]:
    return {"events": drain.events, "seconds": drain.seconds, "rate": drain.rate,
            "mean_batch_size": drain.mean_batch_size, "stage_busy_s": drain.stage_busy_s,
            "stage_cpu_s": drain.stage_cpu_s,
            "cpu_cores": drain.cpu_cores}


def summarize_stages(report: dict[str, Any]) -> dict[str, Any]:
    """Per ratio: the median over the rounds, the lowest and highest, and whether the median meets its target
    (None where it has none: ``gain``, the host ceiling over the library tokenizer's; ``broker``, over the broker
    pass-through)."""
    ratios = {"half": [r["half"]["over_device"] for r in report["rounds"]],
              "full": [r["full"]["over_host"] for r in report["rounds"]],
              "host": [r["host_over_tokenize"] for r in report["rounds"]],
              "library_host": [r["library_host_over_tokenize"] for r in report["rounds"]],
              "gain": [r["host_over_library_host"] for r in report["rounds"]],
              "broker": [r["host_over_broker"] for r in report["rounds"]]}
    out: dict[str, Any] = {}
    for name, values in ratios.items():
        target = TARGETS[name]
        out[name] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                     "target": target, "met": None if target is None else statistics.median(values) >= target}
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
           "tokenize_us_per_text": 1e6 / report["tokenize_alone_one_thread"],
           "library_tokenize_us_per_text": 1e6 / report["library_tokenize_alone_one_thread"], "rate": rate}
    slow = [r["host_library"] for r in report["rounds"] if (r["host_library"].get("cpu_cores") or {}).get("workers")]
    if slow:
        out["library_worker_us_per_text"] = statistics.median(
            d["cpu_cores"]["workers"] / d["rate"] * 1e6 for d in slow)
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
            f"{cpu['worker_us_per_text']:.0f} µs of CPU a text (tokenizing alone: {cpu['tokenize_us_per_text']:.1f} "
            f"µs a text on one thread; the tokenizers library's {cpu['library_tokenize_us_per_text']:.0f}){broker}"
            + (f"; with the library tokenizer the worker {cpu['library_worker_us_per_text']:.0f} µs a text"
               if "library_worker_us_per_text" in cpu else ""))


def format_stages_table(section: dict[str, Any]) -> list[list[str]]:
    """Rows: one per figure and round, the median and spread last."""
    rows = [["round", "host ceiling H (texts/s)", "D = H/2: device alone", "worker", "worker / D",
             "D = H: device alone", "worker", "worker / H", "H / tokenizing alone", "H, library tokenizer",
             "that / library tokenizing alone", "H / that", "broker pass-through", "H / that"]]
    for i, r in enumerate(section["rounds"]):
        rows.append([str(i + 1), f"{r['host']['rate']:,.0f}", f"{r['half']['device_alone']:,.0f}",
                     f"{r['half']['worker']['rate']:,.0f}", f"{r['half']['over_device']:.2f}",
                     f"{r['full']['device_alone']:,.0f}", f"{r['full']['worker']['rate']:,.0f}",
                     f"{r['full']['over_host']:.2f}", f"{r['host_over_tokenize']:.2f}",
                     f"{r['host_library']['rate']:,.0f}", f"{r['library_host_over_tokenize']:.2f}",
                     f"{r['host_over_library_host']:.2f}", f"{r['broker_ceiling']['rate']:,.0f}",
                     f"{r['host_over_broker']:.2f}"])
    s = section["summary"]

    def spread(name: str) -> str:
        target = s[name]["target"]
        return (f"{s[name]['median']:.2f} ({s[name]['min']:.2f}-{s[name]['max']:.2f}"
                + (f"; >= {target:g})" if target is not None else ")"))

    rows.append(["median (range; target)", "", "", "", spread("half"), "", "", spread("full"), spread("host"), "",
                 spread("library_host"), spread("gain"), "", spread("broker")])
    return rows
