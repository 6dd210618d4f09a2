"""The deployment files, validated the way their tools would: docker-compose.yml against the compose
specification's JSON schema, the Kubernetes manifests with kubernetes-validate (strict), the KEDA ScaledObject
against KEDA's own CRD and its Kafka scaler's parameters, Prometheus's configuration and rules with promtool
(their firing logic too, on synthetic series), and the names the files share (images, ports, volumes, topics,
the group) checked to agree. No container engine runs here, so nothing is started."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from stream.config import WorkerSettings
from stream.local.broker import KAFKA_VERSION
from stream.local.registry_server import REGISTRY_VERSION
from tests.go_modules import COMPOSE_GO, KEDA, module_dir
from tests.prometheus import promtool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "stream.json"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    data = load_yaml(ROOT / "docker-compose.yml")
    assert isinstance(data, dict)
    return data


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel of the provisioned dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"] if "alert" in r]


# -- docker-compose.yml ---------------------------------------------------------------------------------------
def compose_errors(doc: dict[str, Any]) -> list[str]:
    schema = json.loads((module_dir(COMPOSE_GO) / "schema" / "compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_follows_the_compose_specification() -> None:
    assert compose_errors(compose()) == []
    broken = compose()
    broken["services"]["worker"]["deploy"]["replicas"] = [2]
    broken["services"]["worker"]["stop_grace_periode"] = "40s"
    errors = compose_errors(broken)
    assert any("replicas" in e for e in errors) and any("stop_grace_periode" in e for e in errors), errors


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of a service's ./ bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = ROOT / source
    return mounts


def test_compose_names_agree_images_ports_volumes_topics() -> None:
    doc = compose()
    services = doc["services"]
    # Images: pinned, and the broker and registry are the versions the tests run.
    for name, service in services.items():
        if "image" in service:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), name
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert services["registry"]["image"] == f"apicurio/apicurio-registry-mem:{REGISTRY_VERSION}"
    # Named volumes declared; bind mounts point at files of this repository; no host port published twice.
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("./"):
                assert source in doc["volumes"], f"{name}: volume {source} not declared"
        for target, path in _bind_mounts(service).items():
            assert path.exists(), f"{name}: {path} (mounted at {target}) is not in the repository"
        for dep in service.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown {dep}"
    published = [p.split(":")[0] for s in services.values() for p in s.get("ports", [])]
    assert len(published) == len(set(published)), published
    # The brokers' address, the topics created and the topics the worker and the producer use.
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split("//")[1]
    create = services["topics"]["command"]
    assert create[create.index("--bootstrap-servers") + 1] == advertised
    created = set(create[create.index("--partitions") + 2:])
    worker = services["worker"]
    env = worker["environment"]
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == advertised
    assert {env["STREAM_INPUT_TOPIC"], env["STREAM_OUTPUT_TOPIC"], env["STREAM_DLQ_TOPIC"]} == created
    producer = services["producer"]["command"]
    assert producer[producer.index("--topic") + 1] == env["STREAM_INPUT_TOPIC"]
    assert producer[producer.index("--bootstrap-servers") + 1] == advertised
    # The metrics port: the worker's flag, what it exposes, its health check and Prometheus's scrape.
    port = worker["command"][worker["command"].index("--metrics-port") + 1]
    assert worker["expose"] == [port] and f":{port}/healthz" in " ".join(worker["healthcheck"]["test"])
    mounts = _bind_mounts(services["prometheus"])
    prom_config = load_yaml(mounts["/etc/prometheus/prometheus.yml"])
    [job] = prom_config["scrape_configs"]
    [sd] = job["dns_sd_configs"]
    # Every worker service (the CPU replicas and the gpu profile's) is scraped, on the same metrics port.
    workers = [name for name, service in services.items() if service.get("command", [])[:2] == ["stream", "worker"]]
    assert workers == ["worker", "worker-gpu"]
    for name in workers:
        assert services[name]["command"] == worker["command"] and services[name]["expose"] == [port], name
    assert job["job_name"] == "stream" and sd["names"] == workers and str(sd["port"]) == port
    # Prometheus's rule file is the repository's alerts; Grafana's datasource is this Prometheus, its dashboards
    # folder the repository's.
    assert prom_config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert mounts["/etc/prometheus/alerts.yml"] == ALERTS
    assert "9090:9090" in services["prometheus"]["ports"]
    grafana = _bind_mounts(services["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    [source] = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    [provider] = load_yaml(provisioning / "dashboards" / "stream.yml")["providers"]
    assert grafana[provider["options"]["path"]] == DASHBOARD.parent
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
    # The shutdown grace period covers the worker's own shutdown timeout.
    grace = int(str(worker["stop_grace_period"]).rstrip("s"))
    assert grace > WorkerSettings.model_fields["shutdown_timeout_s"].default


# -- Prometheus: configuration, rules, dashboard queries ------------------------------------------------------
def test_prometheus_configuration_and_rules_pass_promtool(tmp_path: Path) -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    config["rule_files"] = [str(ALERTS)]  # where compose mounts it (checked above)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every dashboard query parses: promtool checks them as recording rules.
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries())]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(tmp_path / "dashboard.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum(rate(stream_predictions_total[1m])"}]}]}))
    assert promtool("check", "rules", str(tmp_path / "broken.yml")).returncode != 0


def test_every_alert_names_its_signal_and_the_signal_is_in_its_expression() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == {"StreamConsumerLagGrowing", "StreamDeadLetterRateHigh", "StreamNoCommit",
                                          "StreamPartitionStalled", "StreamStoppedOnPurpose", "StreamReplicaDown"}
    for rule in rules:
        signal = rule["annotations"]["signal"]
        assert signal in " ".join(rule["expr"].split()), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


W1, W2, W3 = "w1:9100", "w2:9100", "w3:9100"


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in sorted({"job": "stream", **labels}.items()))
    return {"series": f"{name}{{{body}}}", "values": values}


def _lag(instance: str, values: str) -> dict[str, str]:
    return _series("stream_consumer_lag_records", values, instance=instance, topic="events", partition="0")


# (input series, [(minutes, alert, [expected alerts' labels beyond alertname])]) at a 1-minute interval.
SCENARIOS: list[tuple[list[dict[str, str]], list[tuple[int, str, list[dict[str, str]]]]]] = [
    # Lag over 1000 and rising: pending from 6 m, firing 5 m later; a high but flat lag is no alert.
    ([_lag(W1, "500+100x20")], [(4, "StreamConsumerLagGrowing", []), (10, "StreamConsumerLagGrowing", []),
                                (12, "StreamConsumerLagGrowing", [{"severity": "warning"}])]),
    ([_lag(W1, "5000x20")], [(15, "StreamConsumerLagGrowing", [])]),
    # 2 % of the input dead-lettered fires; 0.5 % does not.
    ([_series("stream_records_consumed_total", "0+1000x20", instance=W1),
      _series("stream_dead_letters_total", "0+20x20", instance=W1, stage="decode", reason="bad-magic")],
     [(3, "StreamDeadLetterRateHigh", []), (10, "StreamDeadLetterRateHigh", [{"severity": "warning"}])]),
    ([_series("stream_records_consumed_total", "0+1000x20", instance=W1),
      _series("stream_dead_letters_total", "0+5x20", instance=W1, stage="model", reason="model-error")],
     [(10, "StreamDeadLetterRateHigh", [])]),
    # No commit since the start (t=0) with lag: fires after 10 + 1 minutes; a replica that keeps committing, or
    # one with nothing to do, does not.
    ([_series("stream_last_commit_timestamp_seconds", "0x20", instance=W1), _lag(W1, "50x20"),
      _series("stream_last_commit_timestamp_seconds", "0+60x20", instance=W2), _lag(W2, "50x20"),
      _series("stream_last_commit_timestamp_seconds", "0x20", instance=W3), _lag(W3, "0x20")],
     [(9, "StreamNoCommit", []), (13, "StreamNoCommit", [{"instance": W1, "severity": "critical"}])]),
    ([_series("stream_stalled_partitions", "0 0 1 1 1 1 1", instance=W1),
      _series("stream_stalled_partitions", "0x6", instance=W2)],
     [(2, "StreamPartitionStalled", []), (4, "StreamPartitionStalled", [{"instance": W1, "severity": "warning"}])]),
    # A replica that ran for a minute at the records where the last run stopped on purpose: at once, and for
    # 10 minutes after (the crash-looping replica may be down at any given scrape); the others never.
    ([_series("stream_stopped_on_purpose_partitions", "0 0 2 _ _ _ _ _ _ _ _ _ _ _ _ _", instance=W1),
      _series("stream_stopped_on_purpose_partitions", "0x15", instance=W2)],
     [(1, "StreamStoppedOnPurpose", []),
      (2, "StreamStoppedOnPurpose", [{"instance": W1, "severity": "critical"}]),
      (11, "StreamStoppedOnPurpose", [{"instance": W1, "severity": "critical"}]),
      (13, "StreamStoppedOnPurpose", [])]),
    ([_series("up", "1 1 0 0 0 0", instance=W1), _series("up", "1x5", instance=W2)],
     [(2, "StreamReplicaDown", []),
      (4, "StreamReplicaDown", [{"instance": W1, "job": "stream", "severity": "critical"}])]),
]


def test_alerts_fire_when_they_should_and_not_otherwise(tmp_path: Path) -> None:
    """promtool's rule tests on synthetic series, against the rule file with its annotations left out (the
    firing logic is what is tested; the annotations' templates are checked by `promtool check rules`)."""
    rules = load_yaml(ALERTS)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    tests = [{"interval": "1m", "input_series": series,
              "alert_rule_test": [{"eval_time": f"{minutes}m", "alertname": alert,
                                   "exp_alerts": [{"exp_labels": labels} for labels in expected]}
                                  for minutes, alert, expected in checks]}
             for series, checks in SCENARIOS]
    assert {a for _, checks in SCENARIOS for _, a, e in checks if e} == {r["alert"] for r in alert_rules()}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["alerts.yml"], "evaluation_interval": "1m",
                                                        "tests": tests}))
    result = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The same tests against a rule that never fires must fail: promtool really compares.
    rules["groups"][0]["rules"][-1]["expr"] = 'up{job="stream"} == 2'
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    assert promtool("test", "rules", "tests.yml", cwd=tmp_path).returncode != 0


# -- Kubernetes and KEDA --------------------------------------------------------------------------------------
def k8s_docs() -> dict[str, dict[str, Any]]:
    """kind -> manifest, of the files deploy/k8s/base/kustomization.yaml lists."""
    kustomization = load_yaml(K8S / "base" / "kustomization.yaml")
    docs = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / "base" / name).read_text()):
            docs[doc["kind"]] = doc
    return docs


def k8s_errors(doc: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc.message)]
    return []


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` and ``replace`` (what the GPU overlay uses); ``~1`` is ``/`` and ``-`` appends."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            if last == "-":
                node.append(op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            assert op["op"] in ("add", "replace") and (op["op"] == "add" or last in node), op
            node[last] = op["value"]
    return doc


def test_kubernetes_manifests_validate_strictly_and_agree() -> None:
    files = sorted(p.name for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(load_yaml(K8S / "base" / "kustomization.yaml")["resources"]) == files
    assert load_yaml(K8S / "kustomization.yaml")["resources"] == ["base"]
    docs = k8s_docs()
    for kind, doc in docs.items():
        if kind != "ScaledObject":
            assert k8s_errors(doc) == [], kind
    broken = copy.deepcopy(docs["Deployment"])
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    assert k8s_errors(broken), "strict validation rejects an unknown field"
    config = docs["ConfigMap"]["data"]
    deployment = docs["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # Probes on the metrics port, on the paths the worker serves; the grace period covers its shutdown.
    port = container["args"][container["args"].index("--metrics-port") + 1]
    [named] = container["ports"]
    assert str(named["containerPort"]) == port == deployment["spec"]["template"]["metadata"]["annotations"][
        "prometheus.io/port"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": named["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": named["name"]}
    assert pod["terminationGracePeriodSeconds"] > float(config["STREAM_SHUTDOWN_TIMEOUT_S"])
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert container["envFrom"] == [{"configMapRef": {"name": docs["ConfigMap"]["metadata"]["name"]}}]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The settings are valid worker settings (the worker would refuse them otherwise).
    WorkerSettings.model_validate({k[len("STREAM_"):].lower(): v for k, v in config.items()
                                   if k.startswith("STREAM_")})
    job = docs["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert set(job[job.index("--partitions") + 2:]) == {
        config["STREAM_INPUT_TOPIC"], config["STREAM_OUTPUT_TOPIC"], config["STREAM_DLQ_TOPIC"]}
    # KEDA: its target is this Deployment, its trigger this group's input, at most one replica per partition.
    scaled = docs["ScaledObject"]["spec"]
    [trigger] = scaled["triggers"]
    assert scaled["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert trigger["metadata"]["consumerGroup"] == config["STREAM_GROUP_ID"]
    assert trigger["metadata"]["topic"] == config["STREAM_INPUT_TOPIC"]
    assert trigger["metadata"]["bootstrapServers"] == config["KAFKA_BOOTSTRAP_SERVERS"]
    assert scaled["maxReplicaCount"] == int(job[job.index("--partitions") + 1])
    assert trigger["metadata"]["offsetResetPolicy"] == "earliest"  # as the worker's auto.offset.reset


def test_the_gpu_overlay_patches_into_a_valid_deployment() -> None:
    overlay = load_yaml(K8S / "gpu" / "kustomization.yaml")
    assert overlay["resources"] == ["../base"], "the base kustomization, whole (kubectl apply -k: test_k8s.py)"
    [patch] = overlay["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "stream-worker"}
    gpu = _json_patch(k8s_docs()["Deployment"], yaml.safe_load(patch["patch"]))
    assert k8s_errors(gpu) == []
    [container] = gpu["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "STREAM_DEVICE", "value": "cuda"} in container["env"]


def scaled_object_errors(doc: dict[str, Any]) -> list[str]:
    """KEDA's own CRD schema (openAPIV3Schema of keda.sh_scaledobjects.yaml), then the Kafka trigger's metadata
    against the parameters its scaler declares (``keda:"name=..."`` tags of kafka_scaler.go) and the checks it
    makes on them."""
    keda = module_dir(KEDA)
    crd = load_yaml(keda / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml")
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == doc["apiVersion"].split("/")[1]]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in
              jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).iter_errors(doc)]
    scaler = (keda / "pkg" / "scalers" / "kafka_scaler.go").read_text()
    known = set(re.findall(r'keda:"name=([A-Za-z]+)', scaler))
    for trigger in doc["spec"]["triggers"]:
        meta = trigger["metadata"]
        errors += [f"unknown kafka trigger parameter {k}" for k in meta if k not in known]
        if trigger["type"] != "kafka":
            errors.append(f"trigger type {trigger['type']}")
        for required in ("bootstrapServers", "consumerGroup"):
            if required not in meta:
                errors.append(f"{required} missing")
        if int(meta.get("lagThreshold", "10")) <= 0 or int(meta.get("activationLagThreshold", "0")) < 0:
            errors.append("lagThreshold must be positive, activationLagThreshold non-negative")
        if meta.get("limitToPartitionsWithLag") == "true" and ("topic" not in meta or
                                                               meta.get("allowIdleConsumers") == "true"):
            errors.append("limitToPartitionsWithLag needs a topic and excludes allowIdleConsumers")
    return errors


def test_keda_scaled_object_follows_kedas_crd_and_kafka_scaler() -> None:
    doc = k8s_docs()["ScaledObject"]
    assert scaled_object_errors(doc) == []
    meta = doc["spec"]["triggers"][0]["metadata"]
    for key in ("lagThreshold", "activationLagThreshold", "limitToPartitionsWithLag"):
        assert key in meta, key
    broken = copy.deepcopy(doc)
    broken["spec"]["maxReplicaCount"] = "eight"
    broken["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    broken["spec"]["triggers"][0]["metadata"]["allowIdleConsumers"] = "true"
    errors = scaled_object_errors(broken)
    assert any("maxReplicaCount" in e for e in errors) and "unknown kafka trigger parameter lagTreshold" in errors
    assert any("excludes allowIdleConsumers" in e for e in errors), errors


@pytest.mark.parametrize("path", ["docker-compose.yml", "deploy/k8s/base/topics-job.yaml"])
def test_the_topic_commands_parse_as_the_cli_does(path: str) -> None:
    """The topic-creating commands the deployment files run are valid ``python -m stream topics create`` lines."""
    from stream.cli import build_parser

    text = (ROOT / path).read_text()
    doc = load_yaml(ROOT / path)
    command = (doc["services"]["topics"]["command"] if "services" in doc
               else doc["spec"]["template"]["spec"]["containers"][0]["command"][2:])
    assert command[0] == "stream" and "topics" in text
    args = build_parser().parse_args([c.replace("$(KAFKA_BOOTSTRAP_SERVERS)", "kafka:9092") for c in command[1:]])
    assert args.topics and args.partitions == 8, shlex.join(command)


def test_the_canary_overlay_is_a_second_deployment_in_the_same_group() -> None:
    overlay = load_yaml(K8S / "canary" / "kustomization.yaml")
    [canary] = [doc for name in overlay["resources"] for doc in yaml.safe_load_all((K8S / "canary" / name).read_text())]
    assert k8s_errors(canary) == []
    base = k8s_docs()["Deployment"]
    assert canary["kind"] == "Deployment" and canary["metadata"]["name"] != base["metadata"]["name"]
    # Selectors that do not overlap: neither Deployment takes the other's pods.
    base_selector = base["spec"]["selector"]["matchLabels"].items()
    canary_selector = canary["spec"]["selector"]["matchLabels"].items()
    assert not base_selector <= canary["spec"]["template"]["metadata"]["labels"].items()
    assert not canary_selector <= base["spec"]["template"]["metadata"]["labels"].items()
    [b], [c] = base["spec"]["template"]["spec"]["containers"], canary["spec"]["template"]["spec"]["containers"]
    assert c["envFrom"] == b["envFrom"], "the same settings, so the same consumer group"
    assert c["args"] == b["args"] and c["image"] != b["image"]
    for key in ("livenessProbe", "readinessProbe", "startupProbe", "ports"):
        assert c[key] == b[key], key
    assert {"name": "STREAM_MODEL_DIR", "value": "/models/v2"} in c["env"]
    assert c["env"][0] == b["env"][0], "a stable transactional id per pod, as the baseline's"


# Each a field of the worker's pod spec loosened: all but the read-only root break Kubernetes' restricted level.
LOOSENINGS: list[tuple[tuple[str | int, ...], Any]] = [
    (("securityContext", "runAsNonRoot"), False),
    (("securityContext", "seccompProfile"), {"type": "Unconfined"}),
    (("containers", 0, "securityContext", "allowPrivilegeEscalation"), True),
    (("containers", 0, "securityContext", "capabilities"), {"drop": ["NET_RAW"]}),
    (("containers", 0, "securityContext", "readOnlyRootFilesystem"), False),
    (("volumes",), [{"name": "tmp", "hostPath": {"path": "/tmp"}}])]


def loosened(pod: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    node: Any = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from Kubernetes' restricted Pod Security profile, or from a read-only root with an
    emptyDir at /tmp (where the image writes its HOME and caches)."""
    problems = []
    pod_context = pod.get("securityContext", {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    allowed_volumes = {"name", "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}
    problems += [f"volume {name}: {sorted(set(v) - allowed_volumes)}" for name, v in volumes.items()
                 if set(v) - allowed_volumes]
    for c in pod["containers"]:
        context = {**pod_context, **c.get("securityContext", {})}
        if context.get("runAsNonRoot") is not True:
            problems.append(f"{c['name']}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            problems.append(f"{c['name']}: runAsUser 0")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{c['name']}: no RuntimeDefault or Localhost seccomp profile")
        container_context = c.get("securityContext", {})
        if container_context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if container_context.get("privileged"):
            problems.append(f"{c['name']}: privileged")
        capabilities = container_context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{c['name']}: capabilities {capabilities} (drop ALL, add at most NET_BIND_SERVICE)")
        if container_context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{c['name']}: the root filesystem is writable")
        tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        if not tmp or "emptyDir" not in volumes.get(tmp[0]["name"], {}):
            problems.append(f"{c['name']}: no emptyDir at /tmp")
    return problems


def test_every_pod_runs_restricted_on_a_read_only_root() -> None:
    docs = k8s_docs()
    pods = {"worker": docs["Deployment"]["spec"]["template"]["spec"],
            "topics job": docs["Job"]["spec"]["template"]["spec"]}
    overlay = load_yaml(K8S / "gpu" / "kustomization.yaml")
    pods["gpu worker"] = _json_patch(docs["Deployment"], yaml.safe_load(overlay["patches"][0]["patch"]))[
        "spec"]["template"]["spec"]
    canary = load_yaml(K8S / "canary" / "kustomization.yaml")
    [pods["canary"]] = [doc["spec"]["template"]["spec"] for name in canary["resources"]
                        for doc in yaml.safe_load_all((K8S / "canary" / name).read_text())]
    for name, pod in pods.items():
        assert restricted_problems(pod) == [], name
    # The check can fail: each field it looks for, taken away or loosened, is reported. (The API server's own
    # Pod Security admission refuses the same pods but the read-only root's: tests/integration/test_k8s.py.)
    for path, value in LOOSENINGS:
        assert restricted_problems(loosened(pods["worker"], path, value)), path
