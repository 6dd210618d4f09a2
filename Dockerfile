# The worker's image (docker-compose.yml, deploy/k8s), in two targets:
#
#   docker build --target cpu -t stream-inference:0.1.0 .        # torch's CPU wheels; the default target
#   docker build --target cuda -t stream-inference:0.1.0-cuda .  # torch's CUDA wheels: deploy/k8s/gpu, compose's
#                                                                 # gpu profile
#
# The builder stage compiles the C extensions into a wheel; the final stages install that wheel (no compiler, no
# editable install, no source tree) and run as an unprivileged user. No container engine runs on this project's
# CI machine: `make image-check` checks what can be checked without one (this file's stages and COPY sources, the
# targets compose and the manifests name, and deploy/image/install.sh run for each target in a venv).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY stream ./stream
COPY producers ./producers
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
# In a container /metrics must be reachable from outside it (a worker elsewhere listens on 127.0.0.1 only); the
# schema folder and the demo model live in /app, not beside the installed package; /app is not writable by the
# worker's user, so any library's cache goes to /tmp.
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 STREAM_METRICS_HOST=0.0.0.0 \
    STREAM_SCHEMAS_DIR=/app/schemas STREAM_MODEL_DIR=/app/artifacts/demo-fraud XDG_CACHE_HOME=/tmp/cache
RUN groupadd --system --gid 10001 stream && useradd --system --uid 10001 --gid stream --home-dir /app stream
WORKDIR /app
COPY schemas ./schemas
COPY deploy/image/install.sh /opt/stream/install.sh
COPY --from=builder /wheels /opt/stream/wheels
ENTRYPOINT ["python", "-m"]
CMD ["stream", "worker"]

# Each target installs the wheel (deploy/image/install.sh), trains the demo model into /app and drops to the user.
FROM runtime AS cuda
RUN sh /opt/stream/install.sh cuda /opt/stream/wheels \
    && python -m stream train-model --out /app/artifacts/demo-fraud && rm -rf /opt/stream
USER 10001:10001

FROM runtime AS cpu
RUN sh /opt/stream/install.sh cpu /opt/stream/wheels \
    && python -m stream train-model --out /app/artifacts/demo-fraud && rm -rf /opt/stream
USER 10001:10001
