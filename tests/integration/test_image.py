"""Each image target's install, run here as the Dockerfile runs it (`make image-check`; out of `make test`, for
CI's time: two full installs of torch): the builder stage's wheel from the files it copies, with the C extensions
compiled into it, then `deploy/image/install.sh TARGET` in a fresh venv, and what the final stage runs next.

Here PyTorch's CPU wheel index cannot be reached (only PyPI can), so the cpu target takes torch from PyPI like the
cuda one (``TORCH_CPU_INDEX``); the rest of its install is the image's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.image import ROOT, copy_sources, stages

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage: its COPYs into a clean folder (no compiled extension from here), then ``pip wheel``."""
    context = tmp_path_factory.mktemp("builder")
    builder = next(s for s in stages() if s.name == "builder")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info")
    for rest in builder.args_of("COPY"):
        _, paths = copy_sources(rest)
        for path in paths:
            source = ROOT / path
            if source.is_dir():
                shutil.copytree(source, context / path, ignore=ignore)
            else:
                shutil.copy2(source, context / path)
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                    str(context)], check=True)
    return out


def test_the_wheel_holds_the_c_extensions_and_no_tests(wheel_dir: Path) -> None:
    (wheel,) = wheel_dir.glob("kafka_microbatch_inference-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for ext in ("stream/kafka/_nativeconsume", "stream/kafka/_nativeproduce", "stream/codec/_nativecodec",
                "stream/models/_textprep"):
        assert any(n.startswith(ext) and n.endswith(".so") for n in names), ext
    assert "stream/pipeline/worker.py" in names and "producers/load.py" in names
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_each_target_installs_and_runs_as_the_image_does(target: str, wheel_dir: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    env = {**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(env_dir),
           "TORCH_CPU_INDEX": "https://pypi.org/simple", "STREAM_SCHEMAS_DIR": str(ROOT / "schemas"),
           "STREAM_MODEL_DIR": str(tmp_path / "model")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["sh", str(ROOT / "deploy" / "image" / "install.sh"), target, str(wheel_dir)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the C consumer, producer and codec load" in done.stdout
    python = str(env_dir / "bin" / "python")
    where = subprocess.run([python, "-c", "import stream; print(stream.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where, f"not the installed package: {where}"
    train = subprocess.run([python, "-m", "stream", "train-model", "--out", str(tmp_path / "model")], env=env,
                           cwd=tmp_path, capture_output=True, text=True, check=False)
    assert train.returncode == 0 and "held-out ROC AUC" in train.stdout, train.stderr[-3000:]
    # The worker checks its model and schemas from the image's folders before it connects anywhere.
    check = subprocess.run([python, "-c", "from stream.config import WorkerSettings\n"
                            "from stream.pipeline.worker import Worker\n"
                            "Worker(WorkerSettings(bootstrap_servers='127.0.0.1:1', input_topic='i', "
                            "output_topic='o', group_id='g'))\nprint('worker built')"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "worker built" in check.stdout, check.stderr[-3000:]
