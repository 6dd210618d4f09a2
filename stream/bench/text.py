"""The benchmark's model-bound section: ``--model minilm`` (all-MiniLM-L6-v2) on seeded synthetic texts of a
long-tailed length mix (`producers.texts`), at a few batch sizes, on the CPU and on CUDA when present.

For each device and batch size, all on the same texts:

* **model alone**: the handler's passes over batches tokenized and laid out beforehand (the limit: no Kafka, no
  Avro, no tokenizing), with length bucketing (what the worker does) and with plain padding (each batch padded to
  its longest text; on a subset when slow): their ratio is what bucketing gains;
* **worker drain**: ``python -m stream worker --model minilm --max-batch-size B`` draining the pre-produced texts
  from the broker (``--stop-at-end``; a backlog, so every batch is full but possibly the first, closed early while
  the model is idle: the mean batch size is recorded), the same
  intra-op threads as the model alone; its rate over the model alone's is the figure held to 0.9, and over the
  lower of the model alone and the broker's ceiling. On the CPU, at the largest batch size, one more drain with
  ``--malloc-mmap-threshold-kib 128`` (the default for other models) shows what the model's own allocator setting
  is worth;
* **broker ceiling**: a pass-through of the same texts (`stream.bench.contenders passthrough --value-bytes`) that
  writes, per text, a value as big as an embedding record: what the broker carries with no model and no Avro;
* **sentence-transformers**: its own ``encode`` of the same texts from the same ``model.zip``, at the same batch
  size and intra-op threads (the reference a user would otherwise run);
* on CUDA, per ``--dtype``: the model alone over texts it has not seen (first pass: every shape new) and again
  (second pass), sentence-transformers in that precision, and the worker; and with ``--cuda-graphs``, the model
  alone and the worker on a fixed shape set replayed as CUDA graphs;
* **the stages against a simulated device** (`stream.bench.stages`): the worker's host ceiling and its rate beside
  a device that takes a set time per token, without a GPU.
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from producers.texts import generate_texts, produce_texts_in_parallel
from stream.bench.stages import (
    StagesBenchConfig,
    broker_ceiling,
    output_value_bytes,
    quick_stages_config,
    run_stages_bench,
    simulated_drain,
)
from stream.models.demo import TEXT_COPY_FIELDS, TEXT_EMBEDDING_SCHEMA, TEXT_EVENT_SCHEMA

CUDA_VARIANTS = ("padded", "packed", "graphs", "packed-graphs")


@dataclass
class TextBenchConfig:
    # pre-produced and drained per batch size: a multiple of each batch size, so that the last batch is full too
    # (the worker's adaptive policy closes one early only when the model is idle and nothing is waiting)
    texts: int = 3_072
    batches: tuple[int, ...] = (32, 128)
    plain_texts: int = 1_000  # plain padding is slow on the CPU: measured on the first this many texts
    # intra-op threads, the model alone's and the worker's: on this 2-core machine, 1 leaves a core to the client
    # threads and the co-located broker, 2 takes both
    torch_threads: tuple[int, ...] = (1, 2)
    cuda_texts: int = 51_200  # on CUDA, the model alone's and sentence-transformers' (more texts: it is fast)
    # on CUDA, pre-produced and drained by each worker: enough that a drain lasts at least 10 s (on an H200 a drain
    # of 51,200 lasted 0.7 s, mostly the window's own edges, the first fetch and the last commit; of 1,000,000,
    # 6.7 s; of 2,000,000, 16-18 s)
    cuda_drain_texts: int = 2_000_000
    cuda_batches: tuple[int, ...] = (128, 512)
    seed: int = 2027
    mmap_check: bool = True  # CPU, largest batch: also a drain with the default 128 KiB mmap threshold
    reference: bool = True  # sentence-transformers' own encode of the same texts
    cuda_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    # on CUDA, per precision (packed-graphs not in float32, where packing has no flash kernel): padded passes,
    # --packing, --cuda-graphs and both; the model alone for each, the worker for those in cuda_drains (None: all)
    cuda_variants: tuple[str, ...] = CUDA_VARIANTS
    cuda_drains: tuple[str, ...] | None = None
    host_ceiling: bool = True  # on CUDA, per batch size: the free model's drain (the host path's own ceiling)
    cpu: bool = True  # the CPU's runs too (False: CUDA's only, where a device is lent for minutes)
    worker_rounds: int = 1  # worker drains per row (the median one's figures kept, every round's beside them)
    stages: StagesBenchConfig | None = field(default_factory=StagesBenchConfig)


def quick_text_config() -> TextBenchConfig:
    """Small counts (CI): checks that the section runs, not its figures."""
    return TextBenchConfig(texts=160, batches=(32,), plain_texts=64, torch_threads=(1,), cuda_texts=2_048,
                           cuda_drain_texts=4_096, cuda_batches=(128,), mmap_check=False, stages=quick_stages_config())


def model_alone(handler: Any, ids: list[list[int]], batch: int, device: torch.device,
                bucketing: bool | None = None) -> dict[str, Any]:
    """The handler's passes over pre-tokenized ``ids`` in batches of ``batch`` (laid out beforehand, copied to the
    device inside the timing as the worker does): texts/s, padded tokens over real ones."""
    layouts = [handler.layout(ids[i:i + batch], bucketing) for i in range(0, len(ids), batch)]
    with torch.inference_mode():
        handler.predict(handler.collate(layouts[0], device))  # warm-up (allocator, kernels)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for layout in layouts:
            out = handler.predict(handler.collate(layout, device))
        if device.type == "cuda":
            out.cpu()
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    padded = sum(len(layout["ids"]) for layout in layouts)
    real = sum(len(r) for r in ids)
    return {"texts": len(ids), "seconds": seconds, "rate": len(ids) / seconds, "padding_ratio": padded / real,
            "passes": sum(len(layout.get("passes", layout.get("packs", []))) for layout in layouts)}


def reference_encode(texts: list[str], batch: int, device: torch.device, dtype: str = "float32") -> dict[str, Any]:
    """sentence-transformers' own ``encode`` of ``texts`` in batches of ``batch``, from the same ``model.zip`` the
    handler reads (installed package), in ``dtype``: texts/s (after one warm-up batch)."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    from stream.models.minilm import DTYPES, read_model_files

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    with tempfile.TemporaryDirectory() as folder:
        with zipfile.ZipFile(_model_zip()) as archive:
            archive.extractall(folder)
        read_model_files(Path(folder))  # the layout the handler reads, checked the same way
        # the model is a local folder: never ask the hub (and no process-wide HF_HUB_OFFLINE, which huggingface_hub
        # reads once, at import: it stayed on for the gateway tests run later in the same pytest process)
        model = SentenceTransformer(folder, device=str(device), local_files_only=True)
        model.to(DTYPES[dtype])
        model.encode(texts[:batch], batch_size=batch, convert_to_numpy=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        model.encode(texts, batch_size=batch, convert_to_numpy=True)
        seconds = time.perf_counter() - started
    return {"texts": len(texts), "seconds": seconds, "rate": len(texts) / seconds, "dtype": dtype}


def _model_zip() -> str:
    import importlib.metadata

    from stream.models.minilm import PACKAGE, PACKAGE_ZIP

    return str(importlib.metadata.distribution(PACKAGE).locate_file(PACKAGE_ZIP))


@dataclass(frozen=True)
class _Run:
    device: torch.device
    threads: int
    dtype: str = "float32"
    cuda_graphs: bool = False
    packing: bool = False

    @property
    def variant(self) -> str:
        return "-".join(n for n, on in (("packed", self.packing), ("graphs", self.cuda_graphs)) if on) or "padded"


def _runs(cfg: TextBenchConfig) -> list[_Run]:
    runs = [_Run(torch.device("cpu"), t) for t in cfg.torch_threads] if cfg.cpu else []
    if torch.cuda.is_available():
        cuda, threads = torch.device("cuda"), cfg.torch_threads[0]
        for variant in cfg.cuda_variants:
            for dtype in cfg.cuda_dtypes:
                if variant == "packed-graphs" and dtype == "float32":
                    continue  # no flash kernel in float32: packing falls back to a padded copy per layer
                runs.append(_Run(cuda, threads, dtype, "graphs" in variant, "packed" in variant))
    return runs


def parse_variants(value: str) -> tuple[str, ...]:
    """A comma-separated list of `CUDA_VARIANTS` (the flags' parser)."""
    variants = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in variants if v not in CUDA_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"{', '.join(unknown) or repr(value)}: the variants are {', '.join(CUDA_VARIANTS)}")
    return variants


def run_text_bench(bench: Any, cfg: TextBenchConfig, console_print: Any = print,
                   on_entry: Any = None) -> dict[str, Any]:
    """The section's figures; ``bench`` is the `stream.bench.runner.Bench` whose broker holds the topics. One entry
    per device and (CPU) intra-op thread count, (CUDA) precision and variant; ``on_entry(report)`` after each."""
    from stream.models.minilm import MiniLMHandler

    report: dict[str, Any] = {"config": asdict(cfg), "devices": []}
    report["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none on this machine"
    topics: dict[str, str] = {}
    ceilings: dict[str, dict[str, Any]] = {}
    host_ceilings: dict[int, dict[str, Any]] = {}
    for run in _runs(cfg):
        device, threads = run.device, run.threads
        count = cfg.texts if device.type == "cpu" else cfg.cuda_texts
        batches = cfg.batches if device.type == "cpu" else cfg.cuda_batches
        first = device.type not in topics  # plain padding and the allocator check: once per device
        what = (f"minilm on {device} ({run.dtype}{', CUDA graphs' if run.cuda_graphs else ''}"
                f"{', packed' if run.packing else ''}), {threads} thread(s)")
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            handler = MiniLMHandler(dtype=run.dtype, cuda_graphs=run.cuda_graphs, packing=run.packing)
            handler.load(device)
            texts = generate_texts(count, seed=cfg.seed).texts
            ids = handler.tokenize(texts)
            lengths = np.array([len(r) for r in ids])
            entry: dict[str, Any] = {
                "device": str(device), "texts": count, "torch_threads": threads, "dtype": run.dtype,
                "cuda_graphs": run.cuda_graphs, "packing": run.packing,
                "tokens": {"median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
                           "p99": float(np.percentile(lengths, 99)), "max": int(lengths.max()),
                           "truncated": handler.truncated},
                "batches": []}
            for batch in batches:
                console_print(f"bench: {what}, model alone at batch {batch} ...")
                row: dict[str, Any] = {"batch": batch, "model_alone": model_alone(handler, ids, batch, device)}
                if device.type == "cuda":  # the same shapes again: what per-shape costs (cuDNN, graphs) left
                    row["model_alone_second_pass"] = model_alone(handler, ids, batch, device)
                if first:
                    plain_ids = ids if device.type == "cuda" else ids[: cfg.plain_texts]
                    plain = model_alone(handler, plain_ids, batch, device, bucketing=False)
                    subset = (model_alone(handler, plain_ids, batch, device) if plain_ids is not ids
                              else row["model_alone"])
                    row.update(plain_padding=plain, bucketed_same_texts_as_plain=subset,
                               bucketing_gain=subset["rate"] / plain["rate"])
                if cfg.reference and not run.cuda_graphs and not run.packing:
                    console_print(f"bench: {what}, sentence-transformers' encode at batch {batch} ...")
                    row["sentence_transformers"] = reference_encode(texts, batch, device, run.dtype)
                    row["model_over_sentence_transformers"] = (_alone(row)
                                                               / row["sentence_transformers"]["rate"])
                entry["batches"].append(row)
        finally:
            torch.set_num_threads(previous)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        drained = count if device.type == "cpu" else cfg.cuda_drain_texts
        entry["drain_texts"] = drained
        if first:
            topics[device.type] = bench.topic(f"text-{device.type}-in")
            # CUDA's millions in parallel (one Python process encodes each record: minutes of a lent device's time)
            processes = 1 if drained < 200_000 else max(1, (os.cpu_count() or 2) // 2)
            produced = produce_texts_in_parallel(bench.bootstrap, topics[device.type], drained, seed=cfg.seed,
                                                 processes=processes)
            if produced != drained:
                raise RuntimeError(f"pre-producing texts: {produced} of {drained} acknowledged")
            # The broker's own ceiling for these records; the worker is held to the lower of it and the model alone.
            value_bytes = output_value_bytes(handler)
            console_print(f"bench: broker pass-through of the {device.type} texts, {value_bytes} B values ...")
            ceilings[device.type] = broker_ceiling(bench, topics[device.type], drained, value_bytes,
                                                   f"-text-{device.type}")
            if device.type == "cuda" and cfg.host_ceiling:
                # What the host path drains with a free model at each batch size (this machine's cores, this
                # broker): the worker cannot pass it whatever the device does.
                for batch in batches:
                    console_print(f"bench: the free model (host ceiling) at batch {batch} ...")
                    free = simulated_drain(bench, f"text-free-{batch}", 0.0, topics[device.type], batch)
                    host_ceilings[batch] = _drain_figures(free)
        topic = topics[device.type]
        entry["broker_ceiling"] = ceilings[device.type]
        if device.type == "cuda" and cfg.cuda_drains is not None and run.variant not in cfg.cuda_drains:
            report["devices"].append(entry)  # the model alone only
            if on_entry is not None:
                on_entry(report)
            continue
        for row in entry["batches"]:
            if device.type == "cuda" and row["batch"] in host_ceilings:
                row["host_ceiling"] = host_ceilings[row["batch"]]
            batch = row["batch"]
            console_print(f"bench: {what}, worker drain at batch {batch} ...")
            tag = (f"{device.type}-{run.dtype}{'-graphs' if run.cuda_graphs else ''}"
                   f"{'-packed' if run.packing else ''}-{threads}t-{batch}")
            drains = [bench.worker_drain(f"worker-minilm-{tag}-{r}", _worker_args(run, batch), input_topic=topic,
                                         model_dir=False) for r in range(cfg.worker_rounds)]
            drains.sort(key=lambda d: d.steady_rate or d.rate)
            drain = drains[(len(drains) - 1) // 2]  # the median round (the lower middle one of an even count)
            row["worker"] = _drain_figures(drain)
            row["worker_rounds"] = [_drain_figures(d) for d in drains]
            alone = _alone(row)
            row["worker_over_model"] = drain.rate / alone
            if drain.steady_rate is not None:
                row["worker_steady_over_model"] = drain.steady_rate / alone
            row["worker_over_bound"] = drain.rate / min(alone, ceilings[device.type]["rate"])
        if device.type == "cpu" and first and cfg.mmap_check:
            # The worker's allocator setting for this model (stream.pipeline.malloc.mmap_threshold) against the
            # default one.
            row = entry["batches"][-1]
            console_print(f"bench: minilm on cpu, worker drain at batch {row['batch']} with the default 128 KiB "
                          "mmap threshold ...")
            drain = bench.worker_drain(
                f"worker-minilm-mmap128k-{row['batch']}",
                [*_worker_args(run, row["batch"]), "--malloc-mmap-threshold-kib", "128"],
                input_topic=topic, model_dir=False)
            row["worker_mmap_128k"] = _drain_figures(drain)
        report["devices"].append(entry)
        if on_entry is not None:
            on_entry(report)
    if cfg.stages is not None:
        report["stages"] = run_stages_bench(bench, cfg.stages, model_alone, console_print)
    return report


def _alone(row: dict[str, Any]) -> float:
    """The model alone's rate at a row's batch size: the better of its passes (on CUDA the second, warm)."""
    return float(max(row["model_alone"]["rate"], row.get("model_alone_second_pass", {}).get("rate", 0.0)))


def _drain_figures(drain: Any) -> dict[str, Any]:
    """A drain's figures: ``rate`` over its whole window (first record consumed to last commit), ``steady_rate``
    between 20 % and 95 % of it (None when too short to say), ``ready_s`` the worker's cold start (process start
    to /readyz 200: model loaded and warmed, group joined), ``device_ms_per_batch`` from CUDA events over the
    records' batches (since 2026-12-07; before, the warm-up's batches were counted in too), ``device_warm_s`` the
    warm-up's."""
    device = drain.device_busy_s
    return {"events": drain.events, "seconds": drain.seconds, "rate": drain.rate, "steady_rate": drain.steady_rate,
            "ready_s": drain.ready_s, "peak_rss_mib": drain.peak_rss_mib, "mean_batch_size": drain.mean_batch_size,
            "stage_busy_s": drain.stage_busy_s, "stage_cpu_s": drain.stage_cpu_s, "device_busy_s": device,
            "device_warm_s": drain.device_warm_s,
            "device_ms_per_batch": device * 1000.0 / drain.batches if device is not None and drain.batches else None}


def _worker_args(run: _Run, batch: int) -> list[str]:
    return ["--model", "minilm", "--device", run.device.type, "--input-schema", TEXT_EVENT_SCHEMA,
            "--output-schema", TEXT_EMBEDDING_SCHEMA, "--copy-fields", TEXT_COPY_FIELDS, "--max-batch-size",
            str(batch), "--max-wait-ms", "1000", "--torch-threads", str(run.threads),
            # every setting the run measures named, not left to the worker's defaults (on CUDA: bfloat16, packed;
            # at fd6f6a4 the float32 and padded rows' workers ran those defaults)
            "--dtype", run.dtype, "--packing" if run.packing else "--no-packing",
            *(["--cuda-graphs"] if run.cuda_graphs else [])]


def format_text_table(section: dict[str, Any]) -> list[list[str]]:
    rows = [["device", "threads", "dtype", "batch", "model alone (texts/s)", "second pass", "worker (texts/s)",
             "worker / model", "broker ceiling", "worker / lower",
             "sentence-transformers", "model / s-t", "plain padding (texts/s)", "bucketing gain"]]
    for entry in section["devices"]:
        threads = str(entry["torch_threads"]) if entry["device"] == "cpu" else "-"
        dtype = (entry.get("dtype", "float32") + (", graphs" if entry.get("cuda_graphs") else "")
                 + (", packed" if entry.get("packing") else ""))
        for b in entry["batches"]:
            plain, second, st = b.get("plain_padding"), b.get("model_alone_second_pass"), b.get("sentence_transformers")
            rows.append([entry["device"], threads, dtype, str(b["batch"]), f"{b['model_alone']['rate']:,.1f}",
                         f"{second['rate']:,.1f}" if second else "-",
                         f"{b['worker']['rate']:,.1f}" if "worker" in b else "-",
                         f"{b['worker_over_model']:.2f}" if "worker_over_model" in b else "-",
                         f"{entry['broker_ceiling']['rate']:,.1f}" if "broker_ceiling" in entry else "-",
                         f"{b['worker_over_bound']:.2f}" if "worker_over_bound" in b else "-",
                         f"{st['rate']:,.1f}" if st else "-",
                         f"{b['model_over_sentence_transformers']:.2f}" if "model_over_sentence_transformers" in b
                         else "-",
                         f"{plain['rate']:,.1f}" if plain else "-",
                         f"{b['bucketing_gain']:.2f}x" if plain else "-"])
    return rows
