# The worker and producer image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
# CPU wheels keep the image small; drop the index URL to get the CUDA build for GPU hosts.
ENV PIP_NO_CACHE_DIR=1 PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY stream ./stream
COPY producers ./producers
COPY schemas ./schemas
RUN pip install -e . && python -m stream train-model
ENTRYPOINT ["python", "-m"]
CMD ["stream", "worker"]
