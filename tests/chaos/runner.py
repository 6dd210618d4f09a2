"""Chaos runs: worker replicas under load are SIGKILLed (from outside, or by themselves at a chosen phase
of the batch life cycle), restarted, frozen and thawed in turn (SIGSTOP past the session timeout, SIGCONT),
scaled and stopped; then an independent verifier reads the output
and dead-letter topics from the beginning (read_committed) and counts lost, duplicated and out-of-order
predictions, compares committed offsets with end offsets, and looks for hanging transactions.

``python -m tests.chaos.runner --events 1000000 --kills 12`` is the long run (``make chaos``, with 20 s
freezes); the test suite runs short ones (and `tests.chaos.freeze` the freeze/thaw sequence on its own).
One line of figures is printed at the end."""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from producers.events import generate_events
from producers.load import ProduceSummary, produce_events
from stream.children import WorkerProcess
from stream.faults import PHASES
from stream.topics import admin, committed_offsets, create_topics, end_offsets, partitions_of
from stream.verify import check_committed, headers_of, input_source


@dataclass
class ChaosConfig:
    bootstrap: str
    model_dir: Path
    events: int = 20_000
    partitions: int = 6
    replicas: int = 2
    kills: int = 4
    guarantee: str = "at-least-once"
    rate: float = 4_000.0  # events/s offered while killing
    kill_interval_s: float = 2.0
    max_batch_size: int = 128
    seed: int = 1
    scale: tuple[int, ...] = ()  # replica counts to step through after the kills (e.g. 1, 3, 1)
    poison_fraction: float = 0.0  # bad records (every dead-letter category, in turn) per good event
    load_until_kills_done: bool = False  # keep producing (up to ``events``) until the last kill, then stop
    freeze_s: float = 0.0  # after the kills: SIGSTOP each replica in turn this long, then SIGCONT (0: none)
    freeze_gap_s: float = 10.0  # from one thaw to the next freeze
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="stream-chaos-")))
    timeout_s: float = 600.0


@dataclass
class ChaosResult:
    events: int
    kills: int
    freezes: int
    rebalances: int
    lost: int
    duplicates: int
    order_violations: int
    commit_problems: list[str]
    hanging_transactions: list[str]
    aborted_records_seen_uncommitted: int
    worker_failures: list[str]
    dead_lettered: int = 0  # distinct poison records found on the DLQ
    poison_injected: int = 0
    phase_kills: dict[str, int] = field(default_factory=dict)  # self-kills per batch phase

    def ok(self, exactly_once: bool) -> bool:
        return (self.lost == 0 and self.order_violations == 0 and not self.commit_problems
                and not self.hanging_transactions and not self.worker_failures
                and (self.duplicates == 0 or not exactly_once))

    def line(self) -> str:
        return (f"chaos: events={self.events} kills={self.kills} freezes={self.freezes} rebalances={self.rebalances} "
                f"lost={self.lost} "
                f"duplicates={self.duplicates} order_violations={self.order_violations} "
                f"dead_lettered={self.dead_lettered}/{self.poison_injected} "
                f"phase_kills={','.join(f'{k}:{v}' for k, v in self.phase_kills.items())} "
                f"commit_problems={len(self.commit_problems)} hanging_transactions={len(self.hanging_transactions)}")


class Fleet:
    """Replica processes with stable names (and transactional ids), restarted in place."""

    def __init__(self, cfg: ChaosConfig, input_topic: str, output_topic: str, dlq_topic: str, group: str) -> None:
        self.cfg = cfg
        self.args = ["--bootstrap-servers", cfg.bootstrap, "--input-topic", input_topic, "--output-topic",
                     output_topic, "--dlq-topic", dlq_topic, "--group-id", group, "--model-dir", str(cfg.model_dir),
                     "--guarantee", cfg.guarantee, "--max-batch-size", str(cfg.max_batch_size),
                     "--commit-interval-ms", "200", "--max-wait-ms", "10", "--max-input-bytes", "4096",
                     "--model", "tests.handlers:PoisonHandler", "--dlq-max-fraction", "0.5"]
        self.group = group
        self.live: dict[int, WorkerProcess] = {}
        self.finished: list[WorkerProcess] = []
        self.starts = 0

    def start(self, slot: int, env: dict[str, str] | None = None) -> None:
        self.starts += 1
        name = f"{self.group}-r{slot}"
        proc = WorkerProcess([*self.args, "--transactional-id", name] if self.cfg.guarantee == "exactly-once"
                             else self.args, self.cfg.workdir / f"{name}-{self.starts}.log",
                             {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", **(env or {})})
        self.live[slot] = proc

    def reap(self) -> list[int]:
        """Slots whose process exited; returns them (exit codes are checked by the caller)."""
        gone = [slot for slot, p in self.live.items() if p.proc.poll() is not None]
        for slot in gone:
            proc = self.live.pop(slot)
            proc.kill()  # already dead: reaps it and closes its log
            self.finished.append(proc)
        return gone

    def stop(self, slot: int) -> int:
        proc = self.live.pop(slot)
        code = proc.terminate()
        self.finished.append(proc)
        return code

    def kill(self, slot: int) -> None:
        proc = self.live.pop(slot)
        proc.kill()
        self.finished.append(proc)

    def all(self) -> list[WorkerProcess]:
        return [*self.finished, *self.live.values()]


def run_chaos(cfg: ChaosConfig, log: bool = False) -> ChaosResult:
    run = uuid.uuid4().hex[:8]
    input_topic, output_topic, dlq_topic, group = (f"chaos-in-{run}", f"chaos-out-{run}", f"chaos-dlq-{run}",
                                                   f"chaos-{run}")
    create_topics(cfg.bootstrap, [input_topic, output_topic, dlq_topic], cfg.partitions)
    rng = random.Random(cfg.seed)
    fleet = Fleet(cfg, input_topic, output_topic, dlq_topic, group)
    for slot in range(cfg.replicas):
        fleet.start(slot)
    produced: dict[str, ProduceSummary] = {}
    stop_load = threading.Event()
    producer = threading.Thread(target=lambda: produced.update(summary=produce_events(
        cfg.bootstrap, input_topic, cfg.events, seed=cfg.seed, rate=cfg.rate, stop=stop_load)), daemon=True)
    producer.start()
    poison_keys: set[str] = set()
    poisoner = threading.Thread(target=_inject_poison, args=(cfg, input_topic, poison_keys, stop_load), daemon=True)
    poisoner.start()
    kills = 0
    failures: list[str] = []
    # Kill points alternate: a SIGKILL from outside (wherever the replica is), then a replica restarted to
    # SIGKILL itself at the next phase of the batch life cycle, in order, so every phase gets its kill.
    phases = [p for p in PHASES if cfg.guarantee == "exactly-once" or p != "in-transaction"]
    phase_kills: dict[str, int] = dict.fromkeys(phases, 0)
    armed: dict[int, str] = {}
    armed_at: dict[int, float] = {}
    next_phase = 0
    deadline = time.monotonic() + cfg.timeout_s
    while kills < cfg.kills and time.monotonic() < deadline:
        time.sleep(cfg.kill_interval_s * rng.uniform(0.5, 1.5))
        for slot in fleet.reap():
            code = fleet.finished[-1].proc.returncode
            if code == -9 and slot in armed:
                kills += 1
                phase_kills[armed.pop(slot)] += 1
                fleet.start(slot)
            else:
                failures.append(f"replica {slot} exited {code}: {fleet.finished[-1].output()[-1500:]}")
                fleet.start(slot)
        for slot, since in list(armed_at.items()):
            if slot in armed and slot in fleet.live and time.monotonic() - since > 20:
                fleet.kill(slot)  # it never reached its phase (no input left?): kill it from outside
                armed.pop(slot)
                kills += 1
                fleet.start(slot)
        if kills >= cfg.kills or armed:
            continue  # wait for the armed replica to reach its phase
        slot = rng.choice(sorted(fleet.live))
        fleet.kill(slot)
        kills += 1
        phase = phases[next_phase % len(phases)]
        next_phase += 1
        armed[slot] = phase
        armed_at[slot] = time.monotonic()
        fleet.start(slot, {"STREAM_TEST_KILL_AT": phase, "STREAM_TEST_KILL_AFTER": str(rng.randint(1, 5))})
        if log:
            print(f"  kills={kills} armed {slot} for {phase}", file=sys.stderr, flush=True)
    freezes = freeze_each_in_turn(fleet, cfg, log)
    if cfg.load_until_kills_done:
        stop_load.set()
    producer.join(timeout=max(deadline - time.monotonic(), 1))
    stop_load.set()
    poisoner.join(timeout=max(deadline - time.monotonic(), 1))
    # Replace still-armed replicas with clean ones, then step through the scale plan.
    for slot in list(fleet.live):
        code = fleet.stop(slot)
        if code == -9 and slot in armed:
            kills += 1
            phase_kills[armed.pop(slot)] += 1
        elif code != 0:
            failures.append(f"replica {slot} exited {code} on SIGTERM: {fleet.finished[-1].output()[-1500:]}")
        fleet.start(slot)
    for target in cfg.scale:
        while len(fleet.live) < target:
            fleet.start(max(fleet.live, default=-1) + 1)
        while len(fleet.live) > target:
            code = fleet.stop(max(fleet.live))
            if code != 0:
                failures.append(f"scale-down SIGTERM exit {code}: {fleet.finished[-1].output()[-1500:]}")
        time.sleep(cfg.kill_interval_s)
    sent = produced["summary"].requested if "summary" in produced else 0
    if "summary" not in produced or produced["summary"].failed:
        failures.append(f"load generator: {produced.get('summary')}")
    expected = set(generate_events(sent, seed=cfg.seed).event_ids)
    verifier = Verifier(cfg.bootstrap, output_topic, dlq_topic)
    verifier.read_until(expected | {f"dlq:{k}" for k in poison_keys}, deadline)
    for slot in list(fleet.live):
        code = fleet.stop(slot)
        if code != 0:
            failures.append(f"final SIGTERM of replica {slot} exited {code}: {fleet.finished[-1].output()[-1500:]}")
    verifier.read_more(2.0)
    ids = verifier.id_counts()
    dead = verifier.dead_letter_counts()
    rebalances = sum(p.output().count(" assigned ") for p in fleet.all())
    result = ChaosResult(
        events=sent, kills=kills, freezes=freezes, rebalances=rebalances,
        lost=sum(1 for e in expected if e not in ids) + sum(1 for k in poison_keys if k not in dead),
        duplicates=sum(c - 1 for c in ids.values() if c > 1) + sum(c - 1 for c in dead.values() if c > 1),
        dead_lettered=len(dead), poison_injected=len(poison_keys), phase_kills=phase_kills,
        order_violations=verifier.order_violations(),
        commit_problems=check_committed(committed_offsets(cfg.bootstrap, group, input_topic),
                                        end_offsets(cfg.bootstrap, input_topic)),
        hanging_transactions=hanging_transactions(cfg.bootstrap, [output_topic, dlq_topic]),
        aborted_records_seen_uncommitted=uncommitted_extra(cfg.bootstrap, output_topic, len(verifier.outputs)),
        worker_failures=failures,
    )
    verifier.close()
    return result


def freeze_each_in_turn(fleet: Fleet, cfg: ChaosConfig, log: bool = False) -> int:
    """SIGSTOP each live replica in turn for ``cfg.freeze_s`` (past the session timeout: it is evicted, and finds
    its partitions lost and, under exactly-once, its transaction fenced when it thaws), then SIGCONT; returns
    how many were frozen."""
    if cfg.freeze_s <= 0:
        return 0
    frozen = 0
    for slot in sorted(fleet.live):
        proc = fleet.live.get(slot)
        if proc is None or proc.proc.poll() is not None:
            continue  # an armed replica killed itself meanwhile: the caller restarts it
        proc.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(cfg.freeze_s)
        finally:
            proc.proc.send_signal(signal.SIGCONT)
        frozen += 1
        if log:
            print(f"  froze replica {slot} for {cfg.freeze_s:g}s", file=sys.stderr, flush=True)
        time.sleep(cfg.freeze_gap_s)
    return frozen


def _inject_poison(cfg: ChaosConfig, topic: str, keys: set[str], stop: threading.Event) -> None:
    """Bad records of every category, in turn, at ``poison_fraction`` of the event rate; unique keys."""
    if cfg.poison_fraction <= 0:
        return
    from confluent_kafka import Producer

    from tests.handlers import bad_values

    values = list(bad_values().items())
    count = int(cfg.events * cfg.poison_fraction)
    interval = 1.0 / (cfg.rate * cfg.poison_fraction)
    producer = Producer({"bootstrap.servers": cfg.bootstrap, "enable.idempotence": True})
    started = time.monotonic()
    for i in range(count):
        if stop.is_set():
            break
        time.sleep(max(0.0, started + i * interval - time.monotonic()))
        reason, value = values[i % len(values)]
        key = f"poison-{reason}-{i}"
        producer.produce(topic, value, key.encode())
        keys.add(key)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("poison records undelivered")


class Verifier:
    """Reads output and DLQ (read_committed) from the beginning; knows nothing of the workers."""

    def __init__(self, bootstrap: str, output_topic: str, dlq_topic: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in (output_topic, dlq_topic)
                              for p in partitions_of(bootstrap, t)])
        self.output_topic = output_topic
        # (topic, partition) -> list of (input partition, input offset, event id or None)
        self.outputs: list[tuple[str, int, int, int, str]] = []
        self._ids: dict[str, int] = defaultdict(int)
        self.violations: list[tuple[str, int, int, int, int, str]] = []

    def _consume(self, timeout_s: float) -> int:
        from stream.codec import SchemaRegistry, decode

        registry = getattr(self, "_registry", None) or SchemaRegistry.from_dir()
        self._registry = registry
        n = 0
        for m in self.consumer.consume(10_000, timeout_s):
            if m.error() is not None:
                continue
            headers = headers_of(m)
            if m.topic() == self.output_topic:
                record = decode(registry, m.value())[1]
                event_id = str(record["event_id"])
            else:
                record = {}
                event_id = f"dlq:{(m.key() or b'').decode()}"  # poison keys are unique
            src = input_source(record, headers)[1:]
            self._ids[event_id] += 1
            self.outputs.append((m.topic(), m.partition(), src[0], src[1], event_id))
            n += 1
        return n

    def read_until(self, expected: set[str], deadline: float) -> None:
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            if self._consume(0.5):
                idle_since = time.monotonic()
            if all(e in self._ids for e in expected):
                return
            if time.monotonic() - idle_since > 120:
                return

    def read_more(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._consume(0.2)

    def id_counts(self) -> dict[str, int]:
        return {k: v for k, v in self._ids.items() if not k.startswith("dlq:")}

    def dead_letter_counts(self) -> dict[str, int]:
        return {k[4:]: v for k, v in self._ids.items() if k.startswith("dlq:")}

    def order_violations(self) -> int:
        """Per (output partition, input partition): input offsets must increase, repeats dropped."""
        last: dict[tuple[str, int, int], int] = {}
        seen: set[tuple[int, int]] = set()
        violations = 0
        for topic, partition, src_p, src_off, event_id in self.outputs:
            if (src_p, src_off) in seen:
                continue  # a repeat (at-least-once replay)
            seen.add((src_p, src_off))
            key = (topic, partition, src_p)
            if key in last and src_off < last[key]:
                violations += 1
                self.violations.append((topic, partition, src_p, last[key], src_off, event_id))
            last[key] = src_off
        return violations

    def close(self) -> None:
        self.consumer.close()


def hanging_transactions(bootstrap: str, topics: list[str]) -> list[str]:
    """Partitions whose last stable offset (read_committed end) lags the high watermark: an open transaction."""
    client = admin(bootstrap)
    problems = []
    for topic in topics:
        tps = [TopicPartition(topic, p) for p in partitions_of(bootstrap, topic)]
        committed = client.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                        isolation_level=IsolationLevel.READ_COMMITTED)
        uncommitted = client.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                          isolation_level=IsolationLevel.READ_UNCOMMITTED)
        for tp in tps:
            lso = next(f.result().offset for k, f in committed.items() if k.partition == tp.partition)
            hw = next(f.result().offset for k, f in uncommitted.items() if k.partition == tp.partition)
            if lso != hw:
                problems.append(f"{topic}[{tp.partition}]: last stable offset {lso} < high watermark {hw}")
    return problems


def uncommitted_extra(bootstrap: str, topic: str, committed_count: int) -> int:
    """Records in the topic beyond what read_committed returned (aborted transactions' records and markers)."""
    ends = end_offsets(bootstrap, topic)
    return sum(ends.values()) - committed_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runner", description=__doc__)
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=float, default=8_000.0)
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once", "both"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--freeze-s", type=float, default=20.0,
                        help="after the kills, freeze each replica in turn this long (0: no freezes)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds through the finally blocks (a frozen replica is thawed, the broker stopped).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    freeze_phase_s = args.replicas * (args.freeze_s + ChaosConfig.freeze_gap_s) if args.freeze_s > 0 else 0.0
    from stream.broker import start_kafka
    from stream.models.train_demo import ensure_trained

    model_dir = ensure_trained(Path(tempfile.mkdtemp(prefix="chaos-model-")))
    broker = None if args.bootstrap_servers else start_kafka()
    bootstrap = args.bootstrap_servers or broker.bootstrap  # type: ignore[union-attr]
    ok = True
    try:
        modes = ["at-least-once", "exactly-once"] if args.guarantee == "both" else [args.guarantee]
        for mode in modes:
            cfg = ChaosConfig(bootstrap, model_dir, events=args.events, partitions=args.partitions,
                              replicas=args.replicas, kills=args.kills, guarantee=mode, rate=args.rate,
                              kill_interval_s=max((args.events / args.rate - freeze_phase_s) / (args.kills + 2), 1.0),
                              seed=args.seed, scale=(1, 3, 1), timeout_s=3600, poison_fraction=0.01,
                              freeze_s=args.freeze_s)
            result = run_chaos(cfg, log=True)
            print(f"{mode}: {result.line()}", flush=True)
            print(json.dumps(asdict(result))[:2000], file=sys.stderr)
            ok = ok and result.ok(mode == "exactly-once")
    finally:
        if broker is not None:
            broker.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
