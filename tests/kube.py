"""A local Kubernetes control plane for the deployment tests (`make k8s-test`): etcd, kube-apiserver (with its
Pod Security admission), kube-controller-manager, kube-scheduler and kwok, which simulates nodes and the pods bound
to them (nothing runs in a pod: it is marked running and ready); then, on demand, KEDA's operator and metrics
adapter, registered with the API server's aggregator as the external metrics API. Everything listens on 127.0.0.1
on free ports and is stopped by PID; the binaries are built once from the Go module proxy (`tests.kube_build`).

Trust: one throwaway CA signs the API server's and KEDA's serving certificates and the aggregator's client
certificate; the tests and every component authenticate to the API server with one static token of the
``system:masters`` group.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stream.local.broker import free_port, log_tails, terminate
from stream.local.children import die_with_parent
from tests.go_modules import KEDA, module_dir
from tests.kube_build import ensure_binaries

KEDA_NAMESPACE = "keda"
METRICS_SERVICE = "keda-metrics-apiserver"  # the APIService's service: an ExternalName pointing at localhost
NODE_CPU, NODE_MEMORY = "32", "256Gi"
APPLY = ("apply", "--server-side", "--field-manager=stream-tests")  # every apply: server-side, one field manager


class KubeError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise KubeError(f"openssl {' '.join(args)}: {proc.stderr[-1000:]}")


def make_certificates(folder: Path) -> None:
    """ca.crt/key; tls.crt/key (a server and client certificate for localhost, 127.0.0.1 and the names the
    aggregator and KEDA's adapter verify); front-proxy.crt/key (the aggregator's client); sa.key/pub (service
    account tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=stream-test-ca", cwd=folder)
    names = ["DNS:localhost", "IP:127.0.0.1", f"DNS:{METRICS_SERVICE}.{KEDA_NAMESPACE}.svc",
             f"DNS:keda-operator.{KEDA_NAMESPACE}.svc.cluster.local"]
    for name, subject, usage in (("tls", "/CN=localhost", "serverAuth,clientAuth"),
                                 ("front-proxy", "/CN=front-proxy-client", "clientAuth")):
        (folder / f"{name}.ext").write_text(f"subjectAltName={','.join(names)}\nextendedKeyUsage={usage}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 subject, cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)


class Component:
    """One process of the control plane, its output in ``<workdir>/<name>.log``."""

    def __init__(self, name: str, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                         env={**os.environ, **(env or {})}, preexec_fn=die_with_parent)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        terminate(self.proc, timeout_s)


class ControlPlane:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.bins = ensure_binaries()
        self.certs = workdir / "certs"
        self.components: list[Component] = []
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "admin.kubeconfig"

    # -- start and stop -------------------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        try:
            self._start()
        except BaseException as exc:
            exc.add_note(self.log_tails())
            self.stop()
            raise
        return self

    def _start(self) -> None:
        make_certificates(self.certs)
        c = self.certs
        (self.workdir / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                        "certificate-authority": str(c / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}]}))
        etcd_port, peer_port = free_port(), free_port()
        self._run("etcd", ["--name", "local", "--data-dir", str(self.workdir / "etcd"),
                           "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                           "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                           "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                           "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                           "--initial-cluster", f"local=http://127.0.0.1:{peer_port}",
                           "--unsafe-no-fsync", "--log-level", "warn"])
        self.wait("etcd", lambda: b'"health":"true"' in _get(f"http://127.0.0.1:{etcd_port}/health"), 60)
        self._run("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
            f"--secure-port={self.port}", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={c / 'tls.crt'}", f"--tls-private-key-file={c / 'tls.key'}",
            f"--client-ca-file={c / 'ca.crt'}", f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--enable-admission-plugins=PodSecurity",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={c / 'sa.pub'}", f"--service-account-signing-key-file={c / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            f"--requestheader-client-ca-file={c / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={c / 'front-proxy.crt'}", f"--proxy-client-key-file={c / 'front-proxy.key'}",
            "--profiling=false"])
        self.wait("kube-apiserver", lambda: self._get("/readyz") == b"ok", 120)
        kubeconfig = f"--kubeconfig={self.kubeconfig}"
        self._run("kube-controller-manager", [
            kubeconfig, "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={c / 'sa.key'}", f"--root-ca-file={c / 'ca.crt'}",
            "--horizontal-pod-autoscaler-sync-period=5s", "--cluster-name=stream-test"])
        self._run("kube-scheduler", [kubeconfig, "--leader-elect=false", "--secure-port=0"])
        self._run("kwok", [kubeconfig, "--manage-all-nodes=true", f"--server-address=127.0.0.1:{free_port()}",
                           "--cidr=10.0.0.1/16", "--node-lease-duration-seconds=40"])
        self.apply_docs([node("kwok-cpu-0"), node("kwok-gpu-0", gpus=8)])
        self.wait("the simulated nodes", lambda: self._nodes_ready(2), 90)

    def _nodes_ready(self, count: int) -> bool:
        return sum(has_condition(n, "Ready") for n in self.get("nodes")["items"]) >= count

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def log_tails(self) -> str:
        return log_tails([c.log for c in self.components])

    def _run(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Component:
        component = Component(name, [str(self.bins / name), *args], self.workdir, env)
        self.components.append(component)
        return component

    def wait(self, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
        """Until ``ready()`` (an error it raises of the API or a connection counts as not yet), failing at once when
        a component exits."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            for c in self.components:
                if not c.alive():
                    raise KubeError(f"{c.name} exited ({c.proc.returncode}) while waiting for {what}")
            try:
                if ready():
                    return
            except (OSError, KubeError, urllib.error.URLError) as exc:
                last = exc
            time.sleep(0.5)
        raise KubeError(f"{what} not ready within {timeout_s:.0f} s (last: {last})")

    # -- the API ---------------------------------------------------------------------------------------------
    def _get(self, path: str) -> bytes:
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        request = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        return _read(request, context)

    def version(self) -> str:
        return str(json.loads(self._get("/version"))["gitVersion"])

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and proc.returncode != 0:
            raise KubeError(f"kubectl {' '.join(args)} (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                            f"{proc.stderr[-3000:]}")
        return proc

    def apply_docs(self, docs: list[dict[str, Any]], *extra: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl(*APPLY, "-f", "-", *extra, stdin=yaml.safe_dump_all(docs))

    def apply_kustomized(self, folder: Path, namespace: str) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -k folder`` into ``namespace``, server-side."""
        return self.kubectl(*APPLY, "-k", str(folder), "-n", namespace)

    def get(self, kind: str, *extra: str) -> Any:
        return json.loads(self.kubectl("get", kind, "-o", "json", *extra).stdout)

    def namespace(self, name: str, level: str = "restricted") -> None:
        """A namespace whose pods the API server holds to the Pod Security ``level``, once its default service
        account exists (pods wait for it)."""
        self.apply_docs([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}}}])
        self.wait(f"namespace {name}'s default service account",
                   lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
                   60)

    # -- KEDA -----------------------------------------------------------------------------------------------
    def start_keda(self) -> None:
        """KEDA's CRDs, its operator and its metrics adapter (as host processes, with this cluster's admin
        credentials), and the aggregator's route to the adapter for ``external.metrics.k8s.io``."""
        ensure_binaries(keda=True)
        self.install_keda_crds()
        self.apply_docs([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}}])
        grpc_port, adapter_port = free_port(), free_port()
        env = {"KUBECONFIG": str(self.kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": KEDA_NAMESPACE,
               "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE, "OPERATOR_NAME": "keda-operator",
               "KEDA_HTTP_DEFAULT_TIMEOUT": "3000"}
        health = free_port()
        self._run("keda-operator", [
            "--leader-elect=false", f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{health}", f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
            f"--cert-dir={self.certs}", "--enable-cert-rotation=false", "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false", f"--ca-dir={self.certs}", "--zap-log-level=info"], env)
        self.wait("keda-operator", lambda: _get(f"http://127.0.0.1:{health}/readyz") == b"ok", 90)
        self._run("keda-adapter", [
            f"--secure-port={adapter_port}", "--bind-address=127.0.0.1", f"--cert-dir={self.certs}",
            f"--tls-cert-file={self.certs / 'tls.crt'}", f"--tls-private-key-file={self.certs / 'tls.key'}",
            f"--lister-kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", f"--metrics-service-address=localhost:{grpc_port}",
            "--zap-log-level=info"], env)
        ca_bundle = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        self.apply_docs([
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE,
                                                                  "namespace": KEDA_NAMESPACE},
             "spec": {"type": "ExternalName", "externalName": "localhost",
                      "ports": [{"name": "https", "port": adapter_port}]}},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
             "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "caBundle": ca_bundle,
                      "groupPriorityMinimum": 100, "versionPriority": 100,
                      "service": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE, "port": adapter_port}}}])
        self.wait("the external metrics API (KEDA's adapter)", self._external_metrics_available, 120)

    def _external_metrics_available(self) -> bool:
        return has_condition(self.get("apiservice", "v1beta1.external.metrics.k8s.io"), "Available")

    def install_keda_crds(self) -> None:
        crds = sorted((module_dir(KEDA) / "config" / "crd" / "bases").glob("*.yaml"))
        for crd in crds:
            self.kubectl(*APPLY, "-f", str(crd))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     *[f"crd/{yaml.safe_load(p.read_text())['metadata']['name']}" for p in crds])


def has_condition(obj: dict[str, Any], kind: str) -> bool:
    """``obj``'s status condition ``kind`` is true."""
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def node(name: str, *, gpus: int = 0) -> dict[str, Any]:
    """A node kwok manages: it reports the node ready and marks the pods bound to it running. A GPU node
    carries ``nvidia.com/gpu`` and its usual taint (only pods that tolerate it land there)."""
    capacity = {"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if gpus else []
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "spec": {"taints": taints},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake"}}}


def _read(request: urllib.request.Request | str, context: ssl.SSLContext | None = None) -> bytes:
    """The body of a 2xx answer; KubeError for any other status (its connection closed)."""
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        exc.close()
        raise KubeError(f"HTTP {exc.code}") from None


def _get(url: str) -> bytes:
    return _read(url)


def started(workdir: Path | None = None) -> ControlPlane:
    return ControlPlane(workdir or Path(tempfile.mkdtemp(prefix="kube-"))).start()


def remove(plane: ControlPlane) -> None:
    plane.stop()
    shutil.rmtree(plane.workdir, ignore_errors=True)
