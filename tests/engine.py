"""A Docker engine for the image and compose tests: the caller's where one answers (``DOCKER_HOST``, else the
default socket); otherwise, as root, Debian's ``docker.io`` (installed if missing) started here with no bridge and
no iptables rules, so that every build and container uses the host's network and traffic stays on loopback, and
stopped by PID at the end. Where no image registry can be reached, the base image the Dockerfile names is replaced
by a stand-in built once from Debian's packages (`python_image`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stream.local.cache import cache_dir, fill_once
from stream.local.children import die_with_parent
from tests.containers import engine_available

SOCKET = "/run/stream-test-docker.sock"
DAEMON_FLAGS = ["--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false"]
PYTHON_IMAGE = "python:3.11-slim"
STAND_IN = "stream-test/python:3.11-slim-bookworm"  # the stand-in's tag: never mistaken for the official image
CERTS = Path("/etc/ssl/certs/ca-certificates.crt")
BUILT_HERE = "stream.test-build=1"  # a label on what the tests build, so that only those are ever pruned
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # the Dockerfile's default


class EngineError(RuntimeError):
    pass


def docker(*args: str, timeout_s: float = 600, check: bool = True, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The docker CLI against the engine in ``DOCKER_HOST``; a failure raises with its output."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False,
                          env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise EngineError(f"docker {' '.join(args[:3])} ... exited {proc.returncode}:\n"
                          f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return proc


def _install_docker_io() -> None:
    if os.geteuid() != 0:
        raise EngineError("no Docker engine answers, and only root can install and start one (Debian's docker.io)")
    apt = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(apt, capture_output=True, text=True, timeout=900, check=False, env=env)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, check=False)
        proc = subprocess.run(apt, capture_output=True, text=True, timeout=900, check=False, env=env)
    if proc.returncode != 0 or shutil.which("dockerd") is None:
        raise EngineError(f"apt-get install docker.io failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


@contextmanager
def running_engine() -> Iterator[str]:
    """An engine that answers, in ``DOCKER_HOST`` for the block (for this process and the commands it starts);
    one started here is stopped (by PID) when the block ends, its containers with it. The image layers stay in
    the engine's data folder, a cache for the next run."""
    before = os.environ.get("DOCKER_HOST")
    try:
        with _engine() as host:
            os.environ["DOCKER_HOST"] = host
            yield host
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


@contextmanager
def _engine() -> Iterator[str]:
    if engine_available():
        yield os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        return
    if shutil.which("dockerd") is None:
        _install_docker_io()
    host = f"unix://{SOCKET}"
    workdir = Path(tempfile.mkdtemp(prefix="stream-dockerd-"))
    log = workdir / "dockerd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["dockerd", *DAEMON_FLAGS, f"--host={host}", f"--pidfile={workdir / 'dockerd.pid'}",
                                 f"--exec-root={workdir / 'exec'}"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 60
        while not engine_available({"DOCKER_HOST": host}):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise EngineError(f"dockerd did not answer on {host} (exit code {proc.poll()}):\n"
                                  f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield host
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # dockerd stops its containers and its containerd, then exits
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False, timeout_s=60).returncode == 0


def python_image() -> str:
    """``python:3.11-slim`` where the engine has it or can pull it; else a stand-in built once: Debian bookworm's
    minimal system (debootstrap) with its Python 3.11, venv, pip and headers, ``python``/``pip`` named as in the
    official image, pip free to install system-wide (the EXTERNALLY-MANAGED marker removed), and this machine's
    certificate bundle (pip reaches the package registries through it)."""
    if image_exists(PYTHON_IMAGE) or docker("pull", PYTHON_IMAGE, check=False, timeout_s=120).returncode == 0:
        return PYTHON_IMAGE
    if image_exists(STAND_IN):
        return STAND_IN
    tarball = fill_once(cache_dir() / "python-3.11-slim-bookworm", _debootstrap) / "rootfs.tar"
    docker("import", "--change", 'CMD ["python3"]', "--change", "ENV LANG=C.UTF-8", str(tarball), STAND_IN,
           timeout_s=600)
    return STAND_IN


def _debootstrap() -> str:
    if os.geteuid() != 0:
        raise EngineError("the python:3.11-slim stand-in is built with debootstrap, which needs root")
    if shutil.which("debootstrap") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"],
                       capture_output=True, text=True, timeout=600, check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    out = cache_dir() / "python-3.11-slim-bookworm"
    root = Path(tempfile.mkdtemp(prefix="stream-rootfs-"))
    try:
        proc = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,python3-pip,"
                               "python3-dev,ca-certificates", "bookworm", str(root)],
                              capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            raise EngineError(f"debootstrap failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        for name, target in (("python", "python3"), ("pip", "pip3")):
            if not (root / "usr/bin" / name).exists():
                (root / "usr/bin" / name).symlink_to(target)
        for marker in (root / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        shutil.copy2(CERTS, root / "etc/ssl/certs/ca-certificates.crt")
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        subprocess.run(["tar", "-C", str(root), "-cf", str(out / "rootfs.tar"), "."], check=True, timeout=600)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return "bookworm minbase, python3"


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except (urllib.error.URLError, OSError):
        return False


def build_image(target: str, tag: str, root: Path) -> None:
    """``docker build --target TARGET -t TAG`` of the repository at ``root``, as a user runs it; the stand-in base
    where the official one cannot be had, and PyPI's torch in the cpu stage where PyTorch's CPU index cannot be
    reached."""
    args = {"PYTHON_IMAGE": python_image()}
    if not reachable(TORCH_CPU_INDEX + "/"):  # for --target cuda too: the legacy builder builds the cpu stage first
        args["TORCH_CPU_INDEX"] = ""
    build(root, tag, args, target)


def build(context: Path, tag: str, build_args: dict[str, str], target: str | None = None) -> None:
    """``docker build`` with the legacy builder (no BuildKit: what any engine has) on the host's network, labelled
    as built here; then the images an earlier build of these tests left untagged are pruned."""
    # --force-rm: a failed step's container is removed too
    args = ["build", "--network", "host", "--force-rm", "-t", tag, "--label", BUILT_HERE,
            *(["--target", target] if target else [])]
    for name, value in build_args.items():
        args += ["--build-arg", f"{name}={value}"]
    docker(*args, str(context), timeout_s=2400, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    prune_earlier_builds()


def prune_earlier_builds() -> None:
    """Images these tests built that a newer build has untagged (5 GB each with CUDA's torch); the layers the
    tagged ones are made of stay, the cache of the next build."""
    docker("image", "prune", "--force", "--filter", f"label={BUILT_HERE}", timeout_s=600)


COMPOSE_GO = ("github.com/docker/compose/v2", "v2.40.3")


def compose_command() -> list[str]:
    """Docker Compose v2: the CLI's plugin where it has one, else the release built once from the Go module proxy
    (Debian bookworm packages only Compose v1) into the cache."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60, check=False).returncode == 0:
        return ["docker", "compose"]
    path, version = COMPOSE_GO
    folder = cache_dir() / f"docker-compose-{version}"

    def fill() -> str:
        go = shutil.which("go")
        if go is None:
            raise EngineError("Docker Compose v2 is built from the Go module proxy here: `go` must be on PATH")
        env = {**os.environ, "GOMODCACHE": str(cache_dir() / "gomod"), "GOFLAGS": "-modcacherw"}
        done = subprocess.run([go, "mod", "download", "-json", f"{path}@{version}"], capture_output=True, text=True,
                              env=env, timeout=900, check=False)
        if done.returncode != 0:
            raise EngineError(f"go mod download {path}@{version}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        # Built as the main module: its go.mod's replace and exclude directives apply (`go install` refuses them).
        source = Path(tempfile.mkdtemp(prefix="stream-compose-src-"))
        try:
            shutil.copytree(json.loads(done.stdout)["Dir"], source, dirs_exist_ok=True)
            for item in source.rglob("*"):
                item.chmod(item.stat().st_mode | 0o200)
            built = subprocess.run([go, "build", "-trimpath", "-ldflags", f"-s -w -X {path}/internal.Version={version}",
                                    "-o", str(folder / "docker-compose"), "./cmd"], cwd=source, env=env,
                                   capture_output=True, text=True, timeout=1800, check=False)
            if built.returncode != 0:
                raise EngineError(f"go build of Compose {version}:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")
        finally:
            shutil.rmtree(source, ignore_errors=True)
        return version

    return [str(fill_once(folder, fill) / "docker-compose")]


def proc_status(name: str) -> dict[str, str]:
    """The container's main process's /proc status, read on the host (the kernel's word, not the image's)."""
    pid = docker("inspect", "-f", "{{.State.Pid}}", name, timeout_s=60).stdout.strip()
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def uid_of(name: str) -> int:
    """The real uid of the container's main process."""
    return int(proc_status(name)["Uid"].split()[0])


def assert_hardened(name: str) -> None:
    """What the manifests ask is what the kernel enforces: no capability, no new privileges, the image's user,
    a root filesystem nothing can write (a write fails) with /tmp writable."""
    status = proc_status(name)
    assert int(status["CapEff"].strip(), 16) == 0 and int(status["CapPrm"].strip(), 16) == 0, status["CapEff"]
    assert status["NoNewPrivs"].strip() == "1"
    assert uid_of(name) == 10001
    write = docker("exec", name, "python", "-c", "open('/app/written', 'w')", check=False, timeout_s=60)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    assert docker("exec", name, "python", "-c", "open('/tmp/written', 'w').write('x')", timeout_s=60).returncode == 0
