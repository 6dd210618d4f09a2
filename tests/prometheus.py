"""A local Prometheus for the tests: Debian's ``prometheus`` package (2.42, with ``promtool``), its binaries
unpacked into the cache (never installed as a service), run on 127.0.0.1 and stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from stream.errors import BrokerError
from stream.local.broker import LocalProcess, free_port
from stream.local.cache import cache_dir, fill_once
from stream.local.children import die_with_parent

PACKAGE = "prometheus"


def prometheus_home() -> Path:
    return cache_dir() / "prometheus-deb"


def ensure_prometheus() -> Path:
    """The folder holding ``prometheus`` and ``promtool``: Debian's package fetched with ``apt-get download`` and
    unpacked with ``dpkg -x`` (once; ``apt-get update`` first where the package lists are missing)."""
    home = prometheus_home()
    bin_dir = home / "usr" / "bin"

    def fill() -> str:
        if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
            raise BrokerError("the local Prometheus comes from Debian's package: apt-get and dpkg are needed")
        download = Path(tempfile.mkdtemp(prefix="prometheus-deb-"))
        try:
            fetch = ["apt-get", "download", "-q", PACKAGE]
            proc = subprocess.run(fetch, cwd=download, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode != 0 and os.geteuid() == 0:
                subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, check=False)
                proc = subprocess.run(fetch, cwd=download, capture_output=True, text=True, timeout=600, check=False)
            debs = sorted(download.glob(f"{PACKAGE}_*.deb"))
            if proc.returncode != 0 or not debs:
                raise BrokerError(f"apt-get download {PACKAGE} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            subprocess.run(["dpkg", "-x", str(debs[0]), str(home)], check=True, capture_output=True, timeout=300)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        for tool in ("prometheus", "promtool"):
            if not (bin_dir / tool).is_file():
                raise BrokerError(f"Debian's {PACKAGE} package holds no usr/bin/{tool}")
        return debs[0].name

    fill_once(home, fill)
    return bin_dir


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ensure_prometheus() / "promtool"), *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=cwd)


class LocalPrometheus(LocalProcess):
    """Prometheus scraping ``targets`` (host:port) as job ``job`` every ``interval_s``, with ``rule_files``."""

    def __init__(self, targets: list[str], rule_files: list[Path], *, job: str = "stream",
                 interval_s: float = 1.0, timeout_s: float = 60.0, extra_args: tuple[str, ...] = ()) -> None:
        workdir = Path(tempfile.mkdtemp(prefix="stream-prometheus-"))
        config = {
            "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s",
                       "scrape_timeout": f"{interval_s:g}s"},
            "rule_files": [str(p.resolve()) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log_file = workdir / "prometheus.log"
        with open(log_file, "wb") as out:
            proc = subprocess.Popen(
                [str(ensure_prometheus() / "prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--web.enable-lifecycle", *extra_args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        super().__init__(port, proc, workdir)
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace")[-3000:]
                self.stop()
                raise BrokerError(f"prometheus did not become ready (exit {proc.poll()}):\n{tail}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """``/api/v1/<path>``'s data; raises with Prometheus's own error (a query that does not parse)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}") from None
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now, or at Unix time ``at`` (a scalar comes back as one
        series)."""
        data = self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])
