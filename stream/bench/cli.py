"""``python -m stream bench``, ``bench-text`` and ``bench-gpu``: their flags and what each runs and prints (the
benchmarks themselves are `stream.bench.runner`, `stream.bench.text` and `stream.bench.gpu`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream.bench import BEFORE_FIELD_PLANS

BROKER_HELP = "the local broker to start: kafka (java 17 and mvn; the default) or tansu (embedded)"


def _quiet() -> None:
    from stream.logs import setup_logging as _setup_logging

    _setup_logging("WARNING")


def add_parsers(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmark the worker against its limit and its peers")
    bench.add_argument("--broker", choices=["kafka", "tansu"], default="kafka", help=BROKER_HELP)
    bench.add_argument("--bootstrap-servers", default=None, help="use this cluster instead of starting a broker")
    bench.add_argument("--events", type=int, default=1_000_000, help="pre-produced events for the drain runs")
    bench.add_argument("--quick", action="store_true", help="small counts (CI): checks it runs, not the figures")
    bench.add_argument("--results", type=Path, default=None, help="default: results/bench-<time>")
    bench.add_argument("--before", default=BEFORE_FIELD_PLANS, metavar="REV",
                       help=f"compare the demo layout's drain with this git revision's worker, interleaved (default "
                            f"{BEFORE_FIELD_PLANS}, the last before the field plans; 'none': no comparison)")
    bench.add_argument("--before-rounds", type=int, default=None, help="drains of each in that comparison (3)")
    bench.add_argument("--text", action=argparse.BooleanOptionalAction, default=True,
                       help="the model-bound section (--model minilm against the model alone; needs the text extra)")
    text = sub.add_parser("bench-text", help="the benchmark's model-bound section alone: --model minilm against the "
                                             "model alone, CPU (and CUDA when present)")
    text.add_argument("--broker", choices=["kafka", "tansu"], default="kafka", help=BROKER_HELP)
    text.add_argument("--bootstrap-servers", default=None, help="use this cluster instead of starting a broker")
    text.add_argument("--texts", type=int, default=None, help="texts per CPU drain (3,000)")
    text.add_argument("--batches", default=None, help="CPU batch sizes, comma-separated (32,128)")
    text.add_argument("--torch-threads", default=None,
                      help="intra-op thread counts, comma-separated, each for the model alone and the worker (1,2)")
    text.add_argument("--stages-rounds", type=int, default=None,
                      help="rounds of the stages against a simulated device (3; 0: none)")
    text.add_argument("--stages-texts", type=int, default=None, help="texts each of those drains (300,000)")
    text.add_argument("--cuda-texts", type=int, default=None,
                      help="texts of the model alone's and sentence-transformers' CUDA passes (51,200)")
    text.add_argument("--cuda-drain-texts", type=int, default=None,
                      help="texts per CUDA worker drain (2,000,000: at least 10 s on an H200)")
    text.add_argument("--cuda-variants", type=_variant_list, default=None,
                      help="on CUDA, per precision: padded, packed, graphs, packed-graphs (all)")
    text.add_argument("--cuda-drains", type=_variant_list, default=None,
                      help="the variants the worker drains too (those of --cuda-variants); the others: model alone")
    text.add_argument("--no-host-ceiling", action="store_true",
                      help="on CUDA, leave out the free model's drain at each batch size")
    text.add_argument("--no-cpu", action="store_true", help="leave the CPU's runs out (CUDA's only)")
    text.add_argument("--cuda-dtypes", default=None, type=_dtype_list,
                      help="precisions on CUDA, comma-separated (float32,bfloat16,float16)")
    text.add_argument("--no-cuda-graphs", action="store_true", help="on CUDA, leave the --cuda-graphs runs out")
    text.add_argument("--no-cuda-packing", action="store_true", help="on CUDA, leave the --packing runs out")
    text.add_argument("--worker-rounds", type=int, default=None,
                      help="worker drains per row, the median kept (1; 3 for figures to report)")
    text.add_argument("--cuda-batches", default=None, help="CUDA batch sizes, comma-separated (128,512)")
    text.add_argument("--no-reference", action="store_true", help="leave sentence-transformers' encode out")
    text.add_argument("--quick", action="store_true", help="small counts (CI): checks it runs, not the figures")
    text.add_argument("--results", type=Path, default=None, help="default: results/bench-text-<time>")
    gpu = sub.add_parser("bench-gpu", help="the worker in a model-bound configuration on CUDA vs the model alone")
    gpu.add_argument("--broker", choices=["kafka", "tansu"], default="kafka", help=BROKER_HELP)
    gpu.add_argument("--bootstrap-servers", default=None, help="use this cluster instead of starting a broker")
    gpu.add_argument("--width", type=int, default=8192, help="hidden layer width of the benchmark MLP")
    gpu.add_argument("--depth", type=int, default=8, help="hidden layers of the benchmark MLP")
    gpu.add_argument("--batch", type=int, default=1024, help="--max-batch-size of the worker, batch of the model")
    gpu.add_argument("--events", type=int, default=500_000, help="pre-produced events for each worker drain")
    gpu.add_argument("--results", type=Path, default=None, help="default: results/bench-gpu-<time>")


def run_bench_command(args: argparse.Namespace) -> int:
    _quiet()
    from rich.console import Console
    from rich.table import Table

    from stream.bench.bench_config import BenchConfig
    from stream.bench.report import (
        format_before,
        format_broker_alone,
        format_latency,
        format_methods,
        format_table,
    )
    from stream.bench.runner import run_bench
    from stream.bench.text import quick_text_config

    cfg = BenchConfig(events=args.events)
    if args.quick:
        cfg = BenchConfig(events=min(args.events, 20_000), naive_events=300, faust_events=3_000,
                          latency_seconds=2.0, warmup_seconds=1.0, generic_events=20_000, before_rounds=1,
                          text=quick_text_config(), end_to_end_records=500)
    if not args.text:
        cfg.text = None
    cfg.before = None if args.before.lower() == "none" else args.before
    if args.before_rounds is not None:
        cfg.before_rounds = args.before_rounds
    if args.results is not None:
        cfg.results = args.results
    console = Console(width=None if sys.stdout.isatty() else 200)  # logs keep whole table rows
    report = run_bench(cfg, args.broker, args.bootstrap_servers, console_print=console.print)
    for title, rows in (("drain throughput", format_table(report)),
                        (f"worker end-to-end latency under load (% of {report['capacity']:,.0f} events/s: the smaller "
                         "of the default drain and the live rate)", format_latency(report))):
        table = Table(title=title)
        for col in rows[0]:
            table.add_column(col, justify="right")
        for row in rows[1:]:
            table.add_row(*row)
        console.print(table)
    if "text" in report:
        _print_text_section(console, report["text"])
    console.print("how each drain was measured:\n  " + "\n  ".join(format_methods(report)))
    for line in (format_before(report), format_broker_alone(report)):
        if line:
            console.print(line)
    v = report["versions"]
    console.print(f"{v['cpu_cores']} cores, Python {v['python']}, torch {v['torch']}, librdkafka {v['librdkafka']}, "
                  f"broker {v['broker']}; results in {cfg.results}")
    return 0


def _print_text_section(console: Any, section: dict[str, Any]) -> None:
    from rich.table import Table

    from stream.bench.text import format_text_table

    rows = format_text_table(section)
    table = Table(title="model-bound: --model minilm (all-MiniLM-L6-v2) against the model alone, same texts and "
                        "batch size")
    for col in rows[0]:
        table.add_column(col, justify="right")
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    for entry in section["devices"]:
        t = entry["tokens"]
        console.print(f"{entry['device']}: {entry['texts']:,} texts (drains: {entry.get('drain_texts', 0):,}), "
                      f"tokens median {t['median']:.0f}, p90 "
                      f"{t['p90']:.0f}, p99 {t['p99']:.0f}, max {t['max']} ({t['truncated']} cut), "
                      f"{entry['torch_threads']} torch threads")
        for b in entry["batches"]:
            w = b.get("worker")
            if w is not None:
                steady = [r["steady_rate"] for r in b.get("worker_rounds", [w]) if r.get("steady_rate")]
                console.print(
                    f"{entry['device']} {entry.get('dtype', '')}{' packed' if entry.get('packing') else ''}, batch "
                    f"{b['batch']}: worker steady "
                    + (f"{w['steady_rate']:,.0f} texts/s ({b['worker_steady_over_model']:.2f}x the model alone)"
                       if w.get("steady_rate") else "- (drain too short)")
                    + (f", rounds {min(steady):,.0f}-{max(steady):,.0f}" if len(steady) > 1 else "")
                    + (f", ready {w['ready_s']:.1f} s after start" if w.get("ready_s") is not None else "")
                    + (f", device {w['device_ms_per_batch']:.2f} ms a batch" if w.get("device_ms_per_batch") else "")
                    + (f", {w['seconds']:.1f} s drain" if w.get("seconds") else ""))
            if "host_ceiling" in b:
                h = b["host_ceiling"]
                console.print(f"{entry['device']}, batch {b['batch']}: the free model (host ceiling) "
                              f"{h['rate']:,.0f} texts/s, steady "
                              + (f"{h['steady_rate']:,.0f}" if h.get("steady_rate") else "-"))
            if "worker_mmap_128k" in b:
                console.print(f"{entry['device']}, batch {b['batch']}: worker with --malloc-mmap-threshold-kib 128 "
                              f"{b['worker_mmap_128k']['rate']:,.1f} texts/s (with the model's 32 MiB: "
                              f"{b['worker']['rate']:,.1f})")
    console.print(f"CUDA: {section['cuda']}")
    stages = section.get("stages")
    if stages is not None:
        from stream.bench.stages import format_host_cpu, format_stages_table

        rows = format_stages_table(stages)
        table = Table(title=f"the stages against a simulated device: MiniLM's host path, batch "
                            f"{stages['config']['batch']}, {stages['config']['texts']:,} texts a drain")
        for col in rows[0]:
            table.add_column(col, justify="right")
        for row in rows[1:]:
            table.add_row(*row)
        console.print(table)
        console.print(f"tokenizing alone: {stages['tokenize_alone']:,.0f} texts/s "
                      f"({stages['tokenize_alone_one_thread']:,.0f} on one thread); the tokenizers library's "
                      f"{stages['library_tokenize_alone']:,.0f} "
                      f"({stages['library_tokenize_alone_one_thread']:,.0f} on one thread); "
                      f"{stages['padded_tokens_per_text']:.1f} padded tokens a text")
        if (cpu := format_host_cpu(stages)) is not None:
            console.print(cpu)


def _variant_list(value: str) -> tuple[str, ...]:
    from stream.bench.text import parse_variants

    try:
        return parse_variants(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _dtype_list(value: str) -> tuple[str, ...]:
    dtypes = tuple(d.strip() for d in value.split(","))
    unknown = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if unknown or not dtypes:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or value!r}: precisions are float32, bfloat16, "
                                         "float16")
    return dtypes


def run_bench_text_command(args: argparse.Namespace) -> int:
    _quiet()
    from rich.console import Console

    from stream.bench.runner import run_text_only
    from stream.bench.text import TextBenchConfig, quick_text_config

    cfg = quick_text_config() if args.quick else TextBenchConfig()
    if args.texts is not None:
        cfg.texts = args.texts
    if args.batches is not None:
        cfg.batches = tuple(int(b) for b in args.batches.split(","))
    if args.torch_threads is not None:
        cfg.torch_threads = tuple(int(t) for t in args.torch_threads.split(","))
    if args.cuda_texts is not None:
        cfg.cuda_texts = args.cuda_texts
    if args.cuda_dtypes is not None:
        cfg.cuda_dtypes = args.cuda_dtypes
    if args.cuda_drain_texts is not None:
        cfg.cuda_drain_texts = args.cuda_drain_texts
    if args.cuda_variants is not None:
        cfg.cuda_variants = args.cuda_variants
    cfg.cuda_variants = tuple(v for v in cfg.cuda_variants if not (args.no_cuda_graphs and "graphs" in v)
                              and not (args.no_cuda_packing and "packed" in v))
    cfg.cuda_drains = args.cuda_drains
    cfg.host_ceiling = cfg.host_ceiling and not args.no_host_ceiling
    cfg.cpu = cfg.cpu and not args.no_cpu
    if args.worker_rounds is not None:
        cfg.worker_rounds = max(1, args.worker_rounds)
    if args.cuda_batches is not None:
        cfg.cuda_batches = tuple(int(b) for b in args.cuda_batches.split(","))
    cfg.reference = cfg.reference and not args.no_reference
    if args.stages_rounds == 0:
        cfg.stages = None
    elif cfg.stages is not None:
        cfg.stages.rounds = args.stages_rounds or cfg.stages.rounds
        cfg.stages.texts = args.stages_texts or cfg.stages.texts
    results = args.results or Path("results") / time.strftime("bench-text-%Y%m%d-%H%M%S")
    console = Console(width=None if sys.stdout.isatty() else 200)
    report = run_text_only(cfg, results, args.broker, args.bootstrap_servers, console_print=console.print)
    _print_text_section(console, report["text"])
    console.print(f"results in {results}")
    return 0


def run_bench_gpu_command(args: argparse.Namespace) -> int:
    _quiet()
    from rich.console import Console
    from rich.table import Table

    from stream.bench.gpu import GpuBenchConfig, format_gpu_table, run_gpu_bench

    cfg = GpuBenchConfig(width=args.width, depth=args.depth, batch=args.batch, events=args.events)
    if args.results is not None:
        cfg.results = args.results
    console = Console(width=None if sys.stdout.isatty() else 200)
    report = run_gpu_bench(cfg, args.broker, args.bootstrap_servers, console_print=console.print)
    rows = format_gpu_table(report)
    table = Table(title=f"model-bound: {cfg.width}x{cfg.depth} MLP, batches of {cfg.batch}")
    for col in rows[0]:
        table.add_column(col, justify="right")
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    s, v = report["standalone"], report["versions"]
    overlap = s["h2d_overlap"]["overlapped_fraction"]
    console.print(f"per batch: model {s['model_ms_per_batch']:.2f} ms, host-to-device copy "
                  f"{s['h2d_ms_per_batch']:.3f} ms, "
                  + (f"{overlap:.0%} of copy time under a running kernel" if overlap is not None else "no copy seen")
                  + f"; max |error| vs float64 {s['max_abs_error_vs_float64']:.1e}")
    console.print(f"{v['gpu']}, CUDA {v['cuda']}, torch {v['torch']}, {v['cpu_cores']} cores, broker "
                  f"{v['broker']}; results in {cfg.results}")
    return 0



RUNNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "bench": run_bench_command, "bench-text": run_bench_text_command, "bench-gpu": run_bench_gpu_command}
