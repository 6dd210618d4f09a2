"""The Kubernetes manifests against a real control plane (`tests.kube`, `make k8s-test`; left out of `make test`):
admitted by the API server under the restricted Pod Security level, scheduled onto kwok's simulated nodes, and the
KEDA ScaledObject scaling the worker Deployment on a real Kafka's lag while real workers on this host drain it.

kwok runs nothing in a pod (it marks it running and ready): what the pods would do is what the other tests run
(the image, the compose stack); here the workers that drain the lag are host processes in the pods' consumer group.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from producers.load import produce_events
from stream.kafka.topics import create_topics
from stream.local.children import WorkerProcess
from tests.conftest import FAILURE_LOGS, BrokerInfo
from tests.go_modules import KEDA
from tests.integration.test_deploy import K8S, LOOSENINGS, loosened, restricted_problems
from tests.kube import ControlPlane, remove, started
from tests.verify import committed_offsets, end_offsets

pytestmark = pytest.mark.k8s
PSS_REFUSAL = 'violates PodSecurity "restricted:latest"'
PARTITIONS = 8  # as deploy/k8s/base/topics-job.yaml creates the input, and the ScaledObject's maxReplicaCount


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    p = started()
    FAILURE_LOGS.watch("plane", lambda: [c.log for c in p.components])
    try:
        p.install_keda_crds()
        yield p
    finally:
        FAILURE_LOGS.forget("plane")
        remove(p)


def rendered(plane: ControlPlane, folder: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl apply -k folder`` applies (kustomize, built into kubectl)."""
    return [d for d in yaml.safe_load_all(plane.kubectl("kustomize", str(folder)).stdout) if d]


def pods(plane: ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(plane.get("pods", "-n", namespace, "-l", selector)["items"])


def worker_nodes(plane: ControlPlane, namespace: str) -> set[str]:
    """The nodes the worker Deployment's pods were scheduled on (not the topics Job's, which share its label)."""
    return {p["spec"]["nodeName"] for p in pods(plane, namespace, "app.kubernetes.io/name=stream-worker")
            if p["metadata"].get("ownerReferences", [{}])[0].get("kind") == "ReplicaSet"}


def ready_replicas(plane: ControlPlane, namespace: str, name: str) -> int:
    status = plane.get("deployment", name, "-n", namespace).get("status", {})
    return int(status.get("readyReplicas", 0))


def test_every_manifest_and_overlay_is_admitted_under_the_restricted_level_and_scheduled(
        plane: ControlPlane) -> None:
    plane.namespace("stream")
    applied = plane.apply_kustomized(K8S, "stream")
    kinds = {line.split("/")[0] for line in applied.stdout.split() if "/" in line}
    assert {"configmap", "job.batch", "deployment.apps", "poddisruptionbudget.policy",
            "scaledobject.keda.sh"} <= kinds, applied.stdout
    assert "Warning" not in applied.stderr, applied.stderr  # Pod Security warns (audit/warn modes) on what it admits
    plane.wait("the base Deployment's 2 replicas ready",
               lambda: ready_replicas(plane, "stream", "stream-worker") == 2, 90)
    assert worker_nodes(plane, "stream") == {"kwok-cpu-0"}, "the GPU node's taint keeps CPU workers off it"
    # The topics Job's pod was admitted and created (kwok completes a Job's pods).
    plane.wait("the topics Job's pod", lambda: bool(pods(plane, "stream", "job-name=stream-topics")), 60)
    # The canary overlay: a second Deployment in the same namespace and consumer group.
    plane.apply_kustomized(K8S / "canary", "stream")
    plane.wait("the canary's replica ready",
               lambda: ready_replicas(plane, "stream", "stream-worker-canary") == 1, 90)
    # The GPU variant, in a namespace of its own: its workers land on the GPU node, one GPU each.
    plane.namespace("stream-gpu")
    plane.apply_kustomized(K8S / "gpu", "stream-gpu")
    plane.wait("the GPU Deployment's 2 replicas ready",
               lambda: ready_replicas(plane, "stream-gpu", "stream-worker") == 2, 90)
    assert worker_nodes(plane, "stream-gpu") == {"kwok-gpu-0"}
    node = plane.get("node", "kwok-gpu-0")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_a_loosened_pod_is_refused_by_the_server_and_the_fast_check_agrees(plane: ControlPlane) -> None:
    """Each loosening of the worker's pod: the API server refuses it exactly where it breaks the restricted level
    (the read-only root is the project's own rule, which the server does not hold), and the fast checker of
    tests/integration/test_deploy.py refuses it too."""
    plane.namespace("stream-loose")
    [deployment] = [d for d in rendered(plane, K8S) if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]

    def server_refusal(pod_spec: dict[str, Any]) -> str:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose", "namespace": "stream-loose"},
               "spec": pod_spec}
        proc = plane.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
        return "" if proc.returncode == 0 else proc.stderr

    assert server_refusal(spec) == "" and restricted_problems(spec) == []
    for path, value in LOOSENINGS:
        pod_spec = loosened(spec, path, value)
        refusal = server_refusal(pod_spec)
        assert restricted_problems(pod_spec), path
        if path[-1] == "readOnlyRootFilesystem":
            assert refusal == "", f"{path}: the restricted level does not ask for a read-only root"
        else:
            assert PSS_REFUSAL in refusal, f"{path}: {refusal!r}"


# ----------------------------------------------------------------------------------------------- KEDA
class Replicas:
    """The Deployment's desired and ready replicas, sampled every second into a timeline."""

    def __init__(self, plane: ControlPlane, namespace: str, name: str) -> None:
        self.plane, self.namespace, self.name = plane, namespace, name
        self.started = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                d = self.plane.get("deployment", self.name, "-n", self.namespace)
            except Exception:  # a slow answer: the next sample
                continue
            self.timeline.append({"t_s": round(self.now(), 1), "desired": d["spec"].get("replicas", 0),
                                  "ready": d.get("status", {}).get("readyReplicas", 0)})

    def now(self) -> float:
        return time.monotonic() - self.started

    def mark(self, event: str, **data: Any) -> None:
        self.events.append({"t_s": round(self.now(), 1), "event": event, **data})

    def desired(self) -> int:
        return int(self.timeline[-1]["desired"]) if self.timeline else -1

    def ready(self) -> int:
        return int(self.timeline[-1]["ready"]) if self.timeline else -1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def keda_documents(plane: ControlPlane, bootstrap: str, topic: str, group: str, *,
                   shipped_waits: bool) -> list[dict[str, Any]]:
    """deploy/k8s as applied, pointed at this host's Kafka, topic and group. The trigger (lag threshold,
    activation, partition limit, offset reset), the replica bounds and the scale target are the project's; unless
    ``shipped_waits``, the waits are shortened for a test: KEDA polls every 5 s (15), and scaling down waits 15 s
    then takes a pod every 5 s (300 s, then one each 60 s)."""
    docs = rendered(plane, K8S)
    for d in docs:
        if d["kind"] == "ConfigMap":
            d["data"].update({"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "STREAM_INPUT_TOPIC": topic,
                              "STREAM_GROUP_ID": group})
        elif d["kind"] == "ScaledObject":
            spec = d["spec"]
            spec["triggers"][0]["metadata"].update({"bootstrapServers": bootstrap, "topic": topic,
                                                    "consumerGroup": group})
            if not shipped_waits:
                spec["pollingInterval"] = 5
                down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
                down["stabilizationWindowSeconds"] = 15
                down["policies"] = [{"type": "Pods", "value": 1, "periodSeconds": 5}]
    return [d for d in docs if d["kind"] != "Job"]  # the topic exists already


def scale_down_bound_s(scaled: dict[str, Any], steps: int) -> float:
    """How long ``steps`` pods take to go under the ScaledObject's scale-down behaviour, with room for the HPA's
    and KEDA's rounds."""
    down = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    [policy] = down["policies"]
    return float(down["stabilizationWindowSeconds"] + steps * policy["periodSeconds"] / policy["value"] + 120)


def lag(bootstrap: str, group: str, topic: str) -> int:
    committed = committed_offsets(bootstrap, group, topic)
    return sum(end - max(committed.get(p, 0), 0) for p, end in end_offsets(bootstrap, topic).items())


@pytest.mark.keda
@pytest.mark.timeout(2400)
def test_keda_scales_the_workers_on_the_groups_lag_and_back_once_real_workers_drain_it(
        plane: ControlPlane, broker: BrokerInfo, unique_name: Callable[[str], str], model_dir: Path,
        tmp_path: Path) -> None:
    """``KUBE_TEST_WAITS=shipped``: with the ScaledObject's own waits (about 20 minutes)."""
    shipped_waits = os.environ.get("KUBE_TEST_WAITS") == "shipped"
    topic, output, group = unique_name("events"), unique_name("predictions"), unique_name("inference")
    create_topics(broker.bootstrap, [topic, output], PARTITIONS)
    plane.start_keda()
    plane.namespace("stream-keda")
    docs = keda_documents(plane, broker.bootstrap, topic, group, shipped_waits=shipped_waits)
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")["spec"]
    minimum = scaled["minReplicaCount"]
    threshold = int(scaled["triggers"][0]["metadata"]["lagThreshold"])
    plane.apply_docs(docs, "-n", "stream-keda")
    replicas = Replicas(plane, "stream-keda", "stream-worker")
    workers: list[WorkerProcess] = []
    try:
        # No lag: KEDA's HPA brings the Deployment's 2 replicas down to the minimum.
        plane.wait("the HPA KEDA made", lambda: bool(plane.get("hpa", "-n", "stream-keda")["items"]), 60)
        plane.wait("scaled down to minReplicaCount with no lag", lambda: replicas.desired() == minimum,
                   scale_down_bound_s(scaled, 1))
        replicas.mark("at the minimum", replicas=replicas.desired())
        # Lag: more than maxReplicaCount thresholds' worth, so the partition count caps it.
        events = threshold * (PARTITIONS + 2)
        summary = produce_events(broker.bootstrap, topic, events, seed=71)
        assert summary.delivered == events, summary.line()
        replicas.mark("lag produced", records=events, lag=lag(broker.bootstrap, group, topic))
        plane.wait(f"scaled up to {PARTITIONS} on {events} records of lag",
                   lambda: replicas.desired() == PARTITIONS, 180)
        replicas.mark("at the partition count", replicas=replicas.desired())
        plane.wait(f"{PARTITIONS} pods ready (kwok's)", lambda: replicas.ready() == PARTITIONS, 60)
        time.sleep(15)  # a few more HPA rounds at full lag: it must not go past the partition count
        # Real workers in the same group drain it.
        for i in range(2):
            workers.append(WorkerProcess(
                ["--bootstrap-servers", broker.bootstrap, "--input-topic", topic, "--output-topic", output,
                 "--group-id", group, "--model-dir", str(model_dir), "--commit-interval-ms", "500"],
                tmp_path / f"worker-{i}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}))
        replicas.mark("host workers started", workers=len(workers))

        def drained() -> bool:
            for w in workers:
                assert w.proc.poll() is None, f"a host worker exited:\n{w.output()[-3000:]}"
            return lag(broker.bootstrap, group, topic) == 0

        plane.wait("the host workers drain the lag", drained, 300)
        replicas.mark("lag drained")
        plane.wait("scaled back down to minReplicaCount", lambda: replicas.desired() == minimum,
                   scale_down_bound_s(scaled, PARTITIONS - minimum))
        replicas.mark("back at the minimum", replicas=replicas.desired())
        time.sleep(3)
    finally:
        replicas.stop()
        for w in workers:
            w.terminate()
    most = max(s["desired"] for s in replicas.timeline)
    assert most == PARTITIONS, f"never past the partition count: {most}"
    results = os.environ.get("KUBE_TEST_RESULTS")
    if results:
        Path(results).write_text(json.dumps({
            "command": "make k8s-test" + (" K8S_WAITS=shipped" if shipped_waits else ""),
            "waits": "shipped" if shipped_waits else "shortened", "kubernetes": plane.version(), "keda": KEDA[1],
            "scaled_object": copy.deepcopy(scaled), "records": events, "partitions": PARTITIONS,
            "events": replicas.events, "timeline": replicas.timeline}, indent=1) + "\n")
