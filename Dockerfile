# The worker's image (docker-compose.yml, deploy/k8s), in two targets:
#
#   docker build --target cpu -t stream-inference:0.1.0 .        # torch's CPU wheels
#   docker build --target cuda -t stream-inference:0.1.0-cuda .  # torch's CUDA wheels: deploy/k8s/gpu, compose's
#                                                                 # gpu profile
#
# A build without --target gets the last stage, the cpu image (a builder without BuildKit builds every stage on
# the way, cuda too: name the target). Build arguments (--build-arg NAME=value):
#   PYTHON_IMAGE      the base image (python:3.11-slim; 3.12 and 3.13 work too)
#   TORCH_CPU_INDEX   the cpu target's torch index (PyTorch's CPU index); the build fails if torch from it is not
#                     the CPU build. Empty: torch from PyPI as it is (on Linux the CUDA build, about 5 GB)
#   PIP_INDEX_URL     where pip finds everything else (PyPI), e.g. a mirror
#
# The builder stage compiles the C extensions into a wheel; the final stages install that wheel (no compiler, no
# editable install, no source tree) and run as an unprivileged user, on a read-only root filesystem if you like:
# nothing is written outside /tmp. `make image-test` builds the cpu target with a real engine and runs it as the
# manifests do (tests/integration/test_image.py). The cpu stage comes before the cuda one, so that `--target cpu`
# builds no CUDA stage with any builder.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY stream ./stream
COPY producers ./producers
RUN pip wheel --no-cache-dir --no-deps --index-url "$PIP_INDEX_URL" --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
# In a container /metrics must be reachable from outside it (a worker elsewhere listens on 127.0.0.1 only); the
# schema folder and the demo model live in /app, not beside the installed package. /app is read-only to the
# worker's user: its home and every library's cache are in /tmp (a tmpfs or emptyDir on a read-only root), and
# the embedded broker (`stream broker --kind tansu`) runs from the image, not unpacked into the home.
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 STREAM_METRICS_HOST=0.0.0.0 \
    STREAM_SCHEMAS_DIR=/app/schemas STREAM_MODEL_DIR=/app/artifacts/demo-fraud \
    HOME=/tmp XDG_CACHE_HOME=/tmp/cache CALF_TANSU_BIN=/usr/local/bin/tansu
RUN groupadd --system --gid 10001 stream && useradd --system --uid 10001 --gid stream --home-dir /tmp \
    --no-create-home stream
WORKDIR /app
COPY deploy/image/install.sh pyproject.toml /opt/stream/
ENTRYPOINT ["python", "-m"]
CMD ["stream", "worker"]

# Each target installs the dependencies (a layer that changes only with pyproject.toml), then the wheel, the Tansu
# binary and the demo model in /app, all readable by the worker's user (deploy/image/install.sh), and drops to
# that user.
FROM runtime AS cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN TORCH_CPU_INDEX="$TORCH_CPU_INDEX" PIP_INDEX_URL="$PIP_INDEX_URL" \
    sh /opt/stream/install.sh cpu dependencies /opt/stream/pyproject.toml
COPY schemas ./schemas
COPY --from=builder /wheels /opt/stream/wheels
RUN sh /opt/stream/install.sh cpu worker /opt/stream/wheels && rm -rf /opt/stream
USER 10001:10001

FROM runtime AS cuda
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN PIP_INDEX_URL="$PIP_INDEX_URL" sh /opt/stream/install.sh cuda dependencies /opt/stream/pyproject.toml
COPY schemas ./schemas
COPY --from=builder /wheels /opt/stream/wheels
RUN sh /opt/stream/install.sh cuda worker /opt/stream/wheels && rm -rf /opt/stream
USER 10001:10001

# The default target: the cpu image.
FROM cpu AS default
