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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from producers.events import generate_events
from producers.load import ProduceSummary, produce_events
from producers.texts import produce_texts, text_ids
from stream.kafka.client_logs import client_logger
from stream.kafka.topics import create_topics
from stream.local.broker import LocalCluster
from stream.local.children import WorkerProcess
from stream.pipeline.faults import PHASES
from tests.chaos.broker_faults import BROKER_KINDS, Fault, FaultPlan, inject, measure_recovery, recovery_table
from tests.chaos.netcut import Bridge, isolated, netns_available
from tests.chaos.verifier import Verifier, hanging_transactions, uncommitted_extra
from tests.verify import check_committed, committed_offsets, end_offsets

ARMED_PHASE_TIMEOUT_S = 60.0  # an armed replica that has not reached its phase by then is killed from outside


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
    # Keep producing until the last kill or fault, then stop: up to ``events``, or, with broker faults, at least
    # ``events`` (and past them while faults remain, so that every fault has load before and after it).
    load_until_kills_done: bool = False
    freeze_s: float = 0.0  # after the kills: SIGSTOP each replica in turn this long, then SIGCONT (0: none)
    freeze_gap_s: float = 10.0  # from one thaw to the next freeze
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="stream-chaos-")))
    timeout_s: float = 600.0
    cluster: LocalCluster | None = None  # the local cluster whose nodes the broker faults hit
    faults: tuple[str, ...] = ()  # broker fault kinds (`broker_faults.KINDS`) in the order they are injected
    fault_gap_s: float = 12.0  # undisturbed load before each broker fault (its recovery's baseline)
    catch_up_timeout_s: float = 120.0  # before that, the longest wait for the group to catch up with the load
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    # None: the demo's events and `tests.handlers.PoisonHandler`; a text model instead (`TEXT_MODELS`): seeded
    # texts (`producers.texts`) and MiniLM's worker ("minilm", on the CPU) or its host path with a free model
    # ("free", `stream.bench.simulated`)
    text: str | None = None

    def __post_init__(self) -> None:
        if self.text is not None and self.text not in TEXT_MODELS:
            raise ValueError(f"text model {self.text!r}: one of {', '.join(TEXT_MODELS)}")
        if self.text is not None and self.poison_fraction > 0:
            raise ValueError("poison records are the demo's events (tests.handlers.bad_values): none with texts")


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
    send_failures: int = 0  # input sends the load generator saw fail (not counted as expected)
    failed_sends_found: int = 0  # of those, how many were written after all (a failure can be "maybe")
    faults: list[Fault] = field(default_factory=list)
    recovery: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    duplicate_details: list[str] = field(default_factory=list)  # where the first repeated ids were written
    upstream_repeats: int = 0  # of the duplicates, those whose copies name different input records
    # the output's repeats by when their first copy was appended: (first ms, last ms, repeats) per burst
    duplicate_bursts: list[tuple[int, int, int]] = field(default_factory=list)
    peak_per_commit: int = 0  # the most output records the fleet appended within one commit interval
    fleet_log: list[tuple[int, str]] = field(default_factory=list)  # (epoch ms, a replica started, stopped, killed)

    def ok(self, exactly_once: bool) -> bool:
        return (self.lost == 0 and self.order_violations == 0 and not self.commit_problems
                and not self.hanging_transactions and not self.worker_failures
                and (self.duplicates == 0 or not exactly_once))

    def line(self) -> str:
        faults = " ".join(f"{k}={v['faults']}:recovered={v['recovered']}:median={v['median_s']}s:max={v['max_s']}s"
                          for k, v in self.recovery.items())
        return (f"chaos: events={self.events} kills={self.kills} freezes={self.freezes} rebalances={self.rebalances} "
                f"lost={self.lost} "
                f"duplicates={self.duplicates} (upstream {self.upstream_repeats}) "
                f"order_violations={self.order_violations} dead_lettered={self.dead_lettered}/{self.poison_injected} "
                f"phase_kills={','.join(f'{k}:{v}' for k, v in self.phase_kills.items())} "
                f"commit_problems={len(self.commit_problems)} hanging_transactions={len(self.hanging_transactions)} "
                f"send_failures={self.send_failures}" + (f" {faults}" if faults else ""))

    def timeline(self) -> list[str]:
        """The fleet's starts, stops and kills and the bursts of repeats, in order, in seconds from the first start:
        what a kill or a handover left to be written again shows as a burst just before the next start or
        assignment."""
        zero = self.fleet_log[0][0] if self.fleet_log else 0
        rows = list(self.fleet_log)
        rows += [(first, f"{n} repeats, first written {(first - zero) / 1000:.2f}-{(last - zero) / 1000:.2f} s")
                 for first, last, n in self.duplicate_bursts]
        return [f"+{(ms - zero) / 1000:7.2f} s  {what}" for ms, what in sorted(rows)]


class Fleet:
    """Replica processes with stable names (and transactional ids), restarted in place. ``isolate``: slots whose
    processes run in a network namespace of their own, reached through ``bridge`` (`tests.chaos.netcut`)."""

    def __init__(self, cfg: ChaosConfig, input_topic: str, output_topic: str, dlq_topic: str, group: str,
                 isolate: tuple[int, ...] = ()) -> None:
        self.cfg = cfg
        self.args = ["--bootstrap-servers", cfg.bootstrap, "--input-topic", input_topic, "--output-topic",
                     output_topic, "--dlq-topic", dlq_topic, "--group-id", group, "--guarantee", cfg.guarantee,
                     "--max-batch-size", str(cfg.max_batch_size), "--commit-interval-ms", str(COMMIT_INTERVAL_MS),
                     "--max-wait-ms", "10", *_model_args(cfg)]
        self.group = group
        self.live: dict[int, WorkerProcess] = {}
        self.finished: list[WorkerProcess] = []
        self.starts = 0
        self.log: list[tuple[int, str]] = []  # (epoch ms, what happened to which slot): read beside the duplicates
        self.isolate = isolate
        self.bridge = Bridge(cfg.workdir / f"bridge-{group}.sock") if isolate else None
        self._ports = [int(a.rsplit(":", 1)[1]) for a in cfg.bootstrap.split(",")]

    def start(self, slot: int, env: dict[str, str] | None = None) -> None:
        self.starts += 1
        name = f"{self.group}-r{slot}"
        wrap = None
        if slot in self.isolate and self.bridge is not None:
            bridge, ports = self.bridge, self._ports
            wrap = lambda command: isolated(command, bridge.path, ports)  # noqa: E731
        proc = WorkerProcess([*self.args, "--transactional-id", name] if self.cfg.guarantee == "exactly-once"
                             else self.args, self.cfg.workdir / f"{name}-{self.starts}.log",
                             {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", **(env or {})}, wrap=wrap)
        self.live[slot] = proc
        self._note(f"start r{slot}" + (f" armed {env['STREAM_TEST_KILL_AT']}" if env and "STREAM_TEST_KILL_AT" in env
                                       else ""))

    def _note(self, what: str) -> None:
        self.log.append((int(time.time() * 1000), what))

    def cut(self, seconds: float) -> str:
        """Cut the isolated replicas off from every broker for ``seconds``, then reconnect them."""
        assert self.bridge is not None
        self.bridge.cut()
        try:
            time.sleep(seconds)
        finally:
            self.bridge.heal()
        return "replica " + ",".join(map(str, self.isolate))

    def reap(self) -> list[tuple[int, WorkerProcess]]:
        """Slots whose process exited, each with that process (exit codes are checked by the caller)."""
        gone = [slot for slot, p in self.live.items() if p.proc.poll() is not None]
        reaped = []
        for slot in gone:
            proc = self.live.pop(slot)
            proc.kill()  # already dead: reaps it and closes its log
            self._note(f"r{slot} exited {proc.proc.returncode} (found)")
            self.finished.append(proc)
            reaped.append((slot, proc))
        return reaped

    def stop(self, slot: int) -> int:
        proc = self.live.pop(slot)
        self._note(f"SIGTERM r{slot}")
        code = proc.terminate()
        self._note(f"r{slot} exited {code}")
        self.finished.append(proc)
        return code

    def kill(self, slot: int) -> None:
        proc = self.live.pop(slot)
        proc.kill()
        self._note(f"SIGKILL r{slot}")
        self.finished.append(proc)

    def all(self) -> list[WorkerProcess]:
        return [*self.finished, *self.live.values()]

    def close(self) -> None:
        if self.bridge is not None:
            self.bridge.close()


TEXT_MODELS = ("free", "minilm")
COMMIT_INTERVAL_MS = 200  # the fleet's --commit-interval-ms
# texts/s offered by default: about half of what two replicas drain on a 2-core machine beside the broker (MiniLM's
# CPU worker at one torch thread: about 100-200 texts/s a replica)
TEXT_RATES = {"free": 4_000.0, "minilm": 100.0}


def _model_args(cfg: ChaosConfig) -> list[str]:
    """The fleet's model flags: the demo's poison handler, or a text model on the CPU at one torch thread."""
    if cfg.text is None:
        return ["--model-dir", str(cfg.model_dir), "--max-input-bytes", "4096", "--model",
                "tests.handlers:PoisonHandler", "--dlq-max-fraction", "0.5"]
    from stream.bench.simulated import write_spec
    from stream.bench.stages import free_model, text_model_args

    return text_model_args(free_model(write_spec(cfg.workdir / "free-model.json", 0.0)) if cfg.text == "free"
                           else ["--model", "minilm"])


class _Load:
    """The input: the load generator (only acknowledged events are expected) and the poison injector."""

    def __init__(self, cfg: ChaosConfig, topic: str) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.summary: ProduceSummary | None = None
        self.poison_keys: set[str] = set()
        self.poison_failed = 0
        self.sent = 0
        self.error: str | None = None  # a text load's failure (texts are sent and acknowledged, or none counts)
        # With broker faults the load runs until the faults are done (at least ``events``); a cap keeps it finite.
        count = (max(cfg.events, int(cfg.rate * cfg.timeout_s)) if cfg.faults and cfg.load_until_kills_done
                 else cfg.events)
        self._threads = [
            threading.Thread(target=self._produce, args=(topic, count), daemon=True),
            threading.Thread(target=_inject_poison, args=(cfg, topic, self), daemon=True)]
        for t in self._threads:
            t.start()

    def _produce(self, topic: str, count: int) -> None:
        if self.cfg.text is None:
            self.summary = produce_events(self.cfg.bootstrap, topic, count, seed=self.cfg.seed, rate=self.cfg.rate,
                                          stop=self.stop, on_progress=self._progress, timeout_s=600.0)
            return
        started = time.monotonic()
        try:  # every text sent is acknowledged, or this raises: a failed send is the run's failure (no broker faults)
            sent = produce_texts(self.cfg.bootstrap, topic, count, seed=self.cfg.seed, rate=self.cfg.rate,
                                 stop=self.stop, on_progress=self._progress, timeout_s=600.0)
            self.summary = ProduceSummary(sent, sent, 0, time.monotonic() - started, 0.0, 0.0, None, ())
        except RuntimeError as exc:
            self.error = str(exc)

    def _progress(self, sent: int) -> None:
        self.sent = sent

    def end(self, deadline: float) -> None:
        """With ``load_until_kills_done`` stop producing now (with broker faults: once ``events`` went out),
        else let the generator send all of them; then stop the poison injector and wait for both."""
        if self.cfg.load_until_kills_done:
            while (self.cfg.faults and self.sent < self.cfg.events and self._threads[0].is_alive()
                   and time.monotonic() < deadline):
                time.sleep(0.5)
            self.stop.set()
        self._threads[0].join(timeout=max(deadline - time.monotonic(), 1))
        self.stop.set()
        self._threads[1].join(timeout=max(deadline - time.monotonic(), 1))


def run_chaos(cfg: ChaosConfig, log: bool = False) -> ChaosResult:
    run = uuid.uuid4().hex[:8]
    input_topic, output_topic, dlq_topic, group = (f"chaos-in-{run}", f"chaos-out-{run}", f"chaos-dlq-{run}",
                                                   f"chaos-{run}")
    create_topics(cfg.bootstrap, [input_topic, dlq_topic], cfg.partitions)
    # Output records carry the time the broker appended them: the recovery figures are read from them.
    create_topics(cfg.bootstrap, [output_topic], cfg.partitions, config={"message.timestamp.type": "LogAppendTime"})
    if cfg.faults and cfg.cluster is None:
        raise ValueError("broker faults need the local cluster (ChaosConfig.cluster)")
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if log else (lambda _text: None)
    rng = random.Random(cfg.seed)
    fleet = Fleet(cfg, input_topic, output_topic, dlq_topic, group,
                  isolate=(0,) if "worker-netcut" in cfg.faults else ())
    for slot in range(cfg.replicas):
        fleet.start(slot)
    load = _Load(cfg, input_topic)
    kills = 0
    failures: list[str] = []
    faults: list[Fault] = []
    pending_faults = list(cfg.faults)
    # Kill points alternate: a SIGKILL from outside (wherever the replica is), then a replica restarted to
    # SIGKILL itself at the next phase of the batch life cycle, in order, so every phase gets its kill.
    # Broker faults are spread among the kills, each after ``fault_gap_s`` of undisturbed load.
    phases = [p for p in PHASES if cfg.guarantee == "exactly-once" or p != "in-transaction"]
    phase_kills: dict[str, int] = dict.fromkeys(phases, 0)
    armed: dict[int, str] = {}
    armed_at: dict[int, float] = {}
    next_phase = 0
    deadline = time.monotonic() + cfg.timeout_s
    while (kills < cfg.kills or pending_faults) and time.monotonic() < deadline:
        time.sleep(cfg.kill_interval_s * rng.uniform(0.5, 1.5))
        for slot, gone in fleet.reap():  # two may exit at once: each its own code and output
            code = gone.proc.returncode
            if code == -9 and slot in armed:
                kills += 1
                phase_kills[armed.pop(slot)] += 1
                fleet.start(slot)
            else:
                failures.append(f"replica {slot} exited {code}: {gone.output()[-1500:]}")
                fleet.start(slot)
        for slot, since in list(armed_at.items()):
            # A restarted replica imports torch, loads the model and joins the group before its first batch: on
            # a loaded machine (make test runs two pytest processes) that took more than 20 s in CI.
            if slot in armed and slot in fleet.live and time.monotonic() - since > ARMED_PHASE_TIMEOUT_S:
                fleet.kill(slot)  # it never reached its phase (no input left?): kill it from outside
                armed.pop(slot)
                kills += 1
                fleet.start(slot)
        if armed:
            continue  # wait for the armed replica to reach its phase
        # The first action is a kill (the fleet has warmed up by then); faults keep pace with the kills after it.
        done = (len(cfg.faults) - len(pending_faults)) / len(cfg.faults) if cfg.faults else 1.0
        if pending_faults and (kills >= cfg.kills or (kills > 0 and done < kills / cfg.kills)):
            behind = _wait_caught_up(cfg, group, input_topic)
            time.sleep(cfg.fault_gap_s)  # the baseline of its recovery: a pipeline that keeps up with the load
            kind = pending_faults.pop(0)
            if behind:
                say(f"  still {behind} records behind {cfg.catch_up_timeout_s:g}s after the last fault; "
                    "the workers' thread stacks are in their logs")
                for proc in fleet.live.values():
                    proc.proc.send_signal(signal.SIGUSR2)
            say(f"  fault {len(cfg.faults) - len(pending_faults)}/{len(cfg.faults)}: {kind}")
            assert cfg.cluster is not None
            faults += inject(kind, cfg.cluster, [input_topic, output_topic], cfg.fault_plan, fleet.cut, say)
            continue
        if kills >= cfg.kills:
            continue
        slot = rng.choice(sorted(fleet.live))
        fleet.kill(slot)
        kills += 1
        phase = phases[next_phase % len(phases)]
        next_phase += 1
        armed[slot] = phase
        armed_at[slot] = time.monotonic()
        fleet.start(slot, {"STREAM_TEST_KILL_AT": phase, "STREAM_TEST_KILL_AFTER": str(rng.randint(1, 5))})
        say(f"  kills={kills} armed {slot} for {phase}")
    if cfg.faults:
        # Load after the last fault, its recovery measured on it: until the group has caught up (a recovery
        # slower than the gap would otherwise end with the load and read as none), then the gap.
        _wait_caught_up(cfg, group, input_topic)
        time.sleep(cfg.fault_gap_s)
    freezes = freeze_each_in_turn(fleet, cfg, log)
    load.end(deadline)
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
    summary = load.summary
    sent = summary.requested if summary is not None else 0
    if summary is None or len(summary.failed_ids) != summary.failed:
        failures.append(f"load generator: {summary} (failed sends it cannot name) {load.error or ''}")
    failed_ids = set(summary.failed_ids) if summary is not None else set()
    ids_sent = (generate_events(sent, seed=cfg.seed).event_ids if cfg.text is None
                else text_ids(sent, seed=cfg.seed))
    expected = set(ids_sent) - failed_ids  # only what was acknowledged
    verifier = Verifier(cfg.bootstrap, output_topic, dlq_topic)
    verifier.read_until(expected | {f"dlq:{k}" for k in load.poison_keys}, deadline)
    for slot in list(fleet.live):
        code = fleet.stop(slot)
        if code != 0:
            failures.append(f"final SIGTERM of replica {slot} exited {code}: {fleet.finished[-1].output()[-1500:]}")
    fleet.close()
    verifier.read_more(2.0)
    ids = verifier.id_counts()
    dead = verifier.dead_letter_counts()
    measure_recovery(faults, verifier.append_ms)
    rebalances = sum(p.output().count(" assigned ") for p in fleet.all())
    result = ChaosResult(
        events=sent, kills=kills, freezes=freezes, rebalances=rebalances,
        lost=sum(1 for e in expected if e not in ids) + sum(1 for k in load.poison_keys if k not in dead),
        duplicates=sum(c - 1 for c in ids.values() if c > 1) + sum(c - 1 for c in dead.values() if c > 1),
        dead_lettered=len(dead), poison_injected=len(load.poison_keys), phase_kills=phase_kills,
        order_violations=verifier.order_violations(),
        commit_problems=check_committed(committed_offsets(cfg.bootstrap, group, input_topic),
                                        end_offsets(cfg.bootstrap, input_topic)),
        hanging_transactions=hanging_transactions(cfg.bootstrap, [output_topic, dlq_topic]),
        aborted_records_seen_uncommitted=uncommitted_extra(cfg.bootstrap, output_topic, len(verifier.outputs)),
        worker_failures=failures, send_failures=len(failed_ids) + load.poison_failed,
        failed_sends_found=sum(1 for e in failed_ids if e in ids), faults=faults, recovery=recovery_table(faults),
        duplicate_details=verifier.duplicate_details(), upstream_repeats=verifier.upstream_repeats(),
        duplicate_bursts=verifier.duplicate_bursts(), peak_per_commit=verifier.peak_appended(COMMIT_INTERVAL_MS),
        fleet_log=fleet.log,
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


def _wait_caught_up(cfg: ChaosConfig, group: str, topic: str) -> int:
    """Wait (up to ``catch_up_timeout_s``) until the group's committed offsets are within two seconds of load of
    the input's end offsets; returns how many records it is still behind."""
    deadline = time.monotonic() + cfg.catch_up_timeout_s
    while True:
        try:
            ends = end_offsets(cfg.bootstrap, topic)
            committed = committed_offsets(cfg.bootstrap, group, topic)
            behind = sum(max(0, end - max(committed.get(p, 0), 0)) for p, end in ends.items())
        except Exception:  # a moment without a coordinator or leader: ask again
            behind = -1
        if 0 <= behind <= 2 * cfg.rate:
            return 0
        if time.monotonic() > deadline:
            return max(behind, 0)
        time.sleep(1.0)


def _inject_poison(cfg: ChaosConfig, topic: str, load: _Load) -> None:
    """Bad records of every category, in turn, at ``poison_fraction`` of the event rate; unique keys. A key is
    expected on the dead-letter topic once its send is acknowledged."""
    if cfg.poison_fraction <= 0:
        return
    from confluent_kafka import Producer

    from tests.handlers import bad_values

    values = list(bad_values().items())
    count = int(cfg.events * cfg.poison_fraction)
    interval = 1.0 / (cfg.rate * cfg.poison_fraction)
    producer = Producer({"bootstrap.servers": cfg.bootstrap, "enable.idempotence": True,
                         "logger": client_logger("poison")})

    def delivered(err: object, msg: object) -> None:
        if err is None:
            load.poison_keys.add(msg.key().decode())  # type: ignore[attr-defined]
        else:
            load.poison_failed += 1

    started = time.monotonic()
    for i in range(count):
        if load.stop.is_set():
            break
        time.sleep(max(0.0, started + i * interval - time.monotonic()))
        reason, value = values[i % len(values)]
        producer.produce(topic, value, f"poison-{reason}-{i}".encode(), on_delivery=delivered)
        producer.poll(0)
    if producer.flush(600):
        raise RuntimeError("poison records undelivered")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runner", description=__doc__)
    parser.add_argument("--bootstrap-servers", default=None,
                        help="default: start a local Apache Kafka of --nodes nodes (broker faults need it)")
    parser.add_argument("--nodes", type=int, default=3, help="nodes of the local cluster (default 3)")
    parser.add_argument("--broker-faults", type=int, default=8,
                        help="faults of each kind per guarantee on the local cluster (0: worker faults only)")
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events per guarantee (with broker faults: at least; the load lasts until they end)")
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=float, default=None,
                        help="events/s offered (default 8,000; 1,000 with broker faults, whose run is long)")
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once", "both"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--freeze-s", type=float, default=20.0,
                        help="after the kills, freeze each replica in turn this long (0: no freezes)")
    parser.add_argument("--text", choices=TEXT_MODELS, default=None,
                        help="seeded texts through --model minilm on the CPU, or through its host path with a free "
                             "model, instead of the demo's events (no poison records; default rate: "
                             + ", ".join(f"{k} {v:,.0f}/s" for k, v in TEXT_RATES.items()) + ")")
    parser.add_argument("--results", type=Path, default=None, help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    # SIGTERM unwinds through the finally blocks (a frozen replica is thawed, the broker stopped).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    from stream.local.broker import start_kafka_cluster
    from stream.models.train_demo import ensure_trained

    with_faults = args.broker_faults > 0 and args.bootstrap_servers is None and args.nodes >= 3
    netcut = netns_available() if with_faults else "no broker faults in this run"
    kinds = [*BROKER_KINDS, *(["worker-netcut"] if netcut is None else [])]
    faults = tuple(kinds * args.broker_faults) if with_faults else ()
    rate = args.rate or (TEXT_RATES[args.text] if args.text else 1_000.0 if faults else 8_000.0)
    freeze_phase_s = args.replicas * (args.freeze_s + ChaosConfig.freeze_gap_s) if args.freeze_s > 0 else 0.0
    model_dir = (ensure_trained(Path(tempfile.mkdtemp(prefix="chaos-model-"))) if args.text is None
                 else Path("unused"))
    cluster = None if args.bootstrap_servers else start_kafka_cluster(args.nodes)
    bootstrap = args.bootstrap_servers or cluster.bootstrap  # type: ignore[union-attr]
    report: dict[str, object] = {"command": " ".join(["python -m tests.chaos.runner", *(argv or sys.argv[1:])]),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nodes": args.nodes,
                                 "rate": rate, "text": args.text, "replicas": args.replicas,
                                 "partitions": args.partitions,
                                 "fault_kinds": kinds if faults else [], "worker_netcut": netcut or "yes",
                                 "runs": {}}
    ok = True
    try:
        modes = ["at-least-once", "exactly-once"] if args.guarantee == "both" else [args.guarantee]
        for mode in modes:
            interval = 5.0 if faults else max((args.events / rate - freeze_phase_s) / (args.kills + 2), 1.0)
            cfg = ChaosConfig(bootstrap, model_dir, events=args.events, partitions=args.partitions,
                              replicas=args.replicas, kills=args.kills, guarantee=mode, rate=rate,
                              kill_interval_s=interval, seed=args.seed, scale=(1, 3, 1),
                              timeout_s=3 * 3600 if faults else 3600,
                              poison_fraction=0.0 if args.text else 0.01, freeze_s=args.freeze_s,
                              cluster=cluster, faults=faults, load_until_kills_done=bool(faults), text=args.text)
            result = run_chaos(cfg, log=True)
            print(f"{mode}: {result.line()}", flush=True)
            ok = ok and result.ok(mode == "exactly-once")
            runs = report["runs"]
            assert isinstance(runs, dict)
            runs[mode] = {"ok": result.ok(mode == "exactly-once"), **asdict(result)}
            if args.results is not None:
                args.results.parent.mkdir(parents=True, exist_ok=True)
                args.results.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if cluster is not None:
            cluster.stop()
    if netcut is not None and with_faults:
        print(f"worker-netcut not run: {netcut}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
