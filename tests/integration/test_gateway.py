"""`python -m stream gateway` in front of `python -m stream worker`, both as users run them, on the test broker."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http

from stream.bench.callers import call_at_rate
from stream.kafka.topics import create_topics
from tests.conftest import BrokerInfo
from tests.gateway_cli import Gateway, events, expected_scores
from tests.integration.harness import Pipeline, wait_for_assignment
from tests.verify import OutputReader, end_offsets


def test_callers_get_their_own_prediction_from_batches_and_each_error_its_status(
        pipeline: Pipeline, model_dir: Path, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    dlq = unique_name("dlq")
    worker = pipeline.worker("--dlq-topic", dlq, "--max-batch-size", "64", "--max-wait-ms", "20",
                             "--batch-policy", "fixed")
    # Neither the worker nor this gateway is given an input schema: both take the model's own.
    first = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw-0.log", "--max-input-bytes", "4000",
                    "--timeout-ms", "10000", input_schema=None)
    second = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw-1.log", "--reply-partition", "1")
    try:
        wait_for_assignment(worker)
        first.wait_ready()
        second.wait_ready()
        sent = events(1500, seed=41)
        answers = asyncio.run(call_at_rate("127.0.0.1", first.port, sent, rate=400.0))
        # Every caller answered once, with its own event's prediction, as the model scores that event.
        assert [a.status for a in answers] == [200] * len(sent), [a.body for a in answers if a.status != 200][:3]
        expected = expected_scores(model_dir, sent)
        for a in answers:
            assert a.body["event_id"] == a.event["event_id"]
            assert a.body["fraud_score"] == pytest.approx(expected[a.event["event_id"]], abs=1e-5)
            assert a.body["model_name"] and a.body["model_version"]
        # ... from batches well above one record (400 callers a second, batches closed 20 ms after their first)
        mean_batch = sum(a.body["batch_size"] for a in answers) / len(answers)
        assert mean_batch > 3, mean_batch
        # The second gateway, on reply partition 1, read none of the first one's replies.
        assert first.metric("stream_gateway_replies_read") == len(sent)
        assert second.metric("stream_gateway_replies_read") == 0
        assert first.metric("stream_gateway_requests_total", '{status="200"}') == len(sent)

        with httpx.Client(base_url=first.url, timeout=30) as http:
            good = events(3, seed=42)
            # 413: a body over --max-input-bytes; 422: the schema refuses a field; 400: not JSON
            big = http.post("/v1/predict", content=json.dumps({**good[0], "event_id": "x" * 5000}))
            assert big.status_code == 413 and "max-input-bytes" in big.json()["error"]
            refused = http.post("/v1/predict", json={**good[0], "features": "not a list"})
            assert refused.status_code == 422 and any("features" in p for p in refused.json()["problems"])
            assert http.post("/v1/predict", content=b"{not json").status_code == 400
            # A list: one answer per event, in order
            listed = http.post("/v1/predict", json=good[1:])
            assert listed.status_code == 200
            assert [r["event_id"] for r in listed.json()] == [e["event_id"] for e in good[1:]]
            # 31 features: the schema takes it, the model's input does not: refused at the door (the workers'
            # own decode stage), never sent
            dead = http.post("/v1/predict", json={**good[0], "features": good[0]["features"][:31]})
            assert dead.status_code == 422, dead.text
            assert "would dead-letter this event (shape)" in dead.json()["error"] and dead.json()["sent"] is False
            # A caller's W3C trace context goes with its event and comes back on its prediction's record.
            traced = events(1, seed=49)[0]
            parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            assert http.post("/v1/predict", json=traced, headers={"traceparent": parent, "tracestate": "k=v"}
                             ).status_code == 200
        assert http_status_counts(first) == {"200": len(sent) + 2, "413": 1, "422": 2, "400": 1}
        # ... read back as users read the output topic (python -m stream read)
        read = subprocess.run([sys.executable, "-m", "stream", "read", "--bootstrap-servers", pipeline.bootstrap,
                               "--topic", pipeline.output, "--from-beginning"], capture_output=True, text=True,
                              timeout=120, check=True)
        predictions = [json.loads(line) for line in read.stdout.splitlines()]
        assert len(predictions) >= len(sent) + 3
        [mine] = [p for p in predictions if p["value"]["event_id"] == traced["event_id"]]
        assert mine["headers"] == {"traceparent": parent, "tracestate": "k=v"}, mine
        assert not [p for p in predictions if p["headers"] and p is not mine]
        # Its collector's pauses are exported (thousands of requests: young collections happened).
        text = httpx.get(f"{first.url}/metrics", timeout=5).text
        assert re.search(r'^stream_gateway_gc_pause_seconds_count\{generation="0"\} [1-9]', text, re.M), text
        # tritonclient with its defaults (binary tensors) on the same gateway: the Open Inference Protocol.
        triton = tritonclient.http.InferenceServerClient(url=f"127.0.0.1:{first.port}")
        assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("demo-fraud-mlp")
        meta = triton.get_model_metadata("demo-fraud-mlp")
        assert {"features", "event_id"} <= {i["name"] for i in meta["inputs"]}
        v2_events = events(20, seed=48)
        x = np.asarray([e["features"] for e in v2_events], dtype=np.float32)
        given = tritonclient.http.InferInput("features", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        ids = tritonclient.http.InferInput("event_id", [len(v2_events)], "BYTES")
        ids.set_data_from_numpy(np.asarray([e["event_id"].encode() for e in v2_events], dtype=np.object_))
        result = triton.infer("demo-fraud-mlp", [given, ids])
        v2_expected = expected_scores(model_dir, v2_events)
        assert result.as_numpy("fraud_score").tolist() == pytest.approx(
            [v2_expected[e["event_id"]] for e in v2_events], abs=1e-5)
        assert [v.decode() for v in result.as_numpy("event_id").tolist()] == [e["event_id"] for e in v2_events]
        triton.close()
        assert "no --api-key: anyone who can reach" in first.process.output()
        # Each event went to the input topic with its `key` field as the record's key (one key, one partition).
        keyed = input_keys(pipeline.bootstrap, pipeline.input, len(sent))
        assert {e["key"].encode() for e in sent} <= set(keyed) and None not in keyed
        assert first.stop() == 0 and second.stop() == 0
        assert worker.terminate() == 0
    finally:
        first.process.kill()
        second.process.kill()


def input_keys(bootstrap: str, topic: str, at_least: int, timeout_s: float = 30.0) -> list[bytes | None]:
    """The keys of the records on ``topic`` (all of it, read from the beginning until ``at_least`` are read and the
    topic has no more)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"keys-{secrets.token_hex(4)}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    keys: list[bytes | None] = []
    deadline = time.monotonic() + timeout_s
    try:
        while (len(keys) < max(at_least, sum(ends.values()))) and time.monotonic() < deadline:
            keys += [m.key() for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return keys


def http_status_counts(gateway: Gateway) -> dict[str, int]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    counts = {}
    for line in text.splitlines():
        if line.startswith('stream_gateway_requests_total{status="'):
            status = line.split('"')[1]
            counts[status] = int(float(line.split()[-1]))
    return counts


def test_no_worker_is_503_at_once_and_a_stuck_one_504_naming_where_the_event_waits_and_a_burst_503(
        pipeline: Pipeline, tmp_path: Path) -> None:
    gateway = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw.log", "--timeout-ms", "1500",
                      "--max-pending", "40", "--worker-group", pipeline.group)
    worker = None
    try:
        # No worker in the group: not ready, and every caller told at once to come back, nothing sent. (Its
        # /readyz is 503 from its start, "starting" until it has made its app.)
        deadline = time.monotonic() + 60
        while gateway.process.proc.poll() is None and time.monotonic() < deadline:
            try:
                if "gateway is starting" not in httpx.get(f"{gateway.url}/readyz", timeout=1).text:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        readyz = httpx.get(f"{gateway.url}/readyz", timeout=5)
        assert readyz.status_code == 503 and any("no worker serves" in w for w in readyz.json()["why"])
        refused = asyncio.run(call_at_rate("127.0.0.1", gateway.port, events(20, seed=42), rate=200.0))
        assert {a.status for a in refused} == {503} and all(a.seconds < 1.0 for a in refused)
        assert sum(end_offsets(pipeline.bootstrap, pipeline.input).values()) == 0, "nothing was sent"
        # A worker joins, then stops answering (SIGSTOP: still a member until its session times out).
        worker = pipeline.worker()
        wait_for_assignment(worker)
        gateway.wait_ready()
        worker.proc.send_signal(signal.SIGSTOP)
        sent = events(200, seed=43)
        # 200 callers at once: 40 are queued and time out (504, with where their event is), the other 160 are
        # told at once to come back (503 with Retry-After) instead of waiting.
        answers = asyncio.run(call_at_rate("127.0.0.1", gateway.port, sent, rate=2000.0))
        by_status: dict[int, list] = {}
        for a in answers:
            by_status.setdefault(a.status, []).append(a)
        assert sorted(by_status) == [503, 504], {s: len(a) for s, a in by_status.items()}
        assert len(by_status[504]) == 40
        assert all(a.body["input_offset"] is not None and a.body["may_still_be_predicted"] for a in by_status[504])
        assert all(a.seconds < 1.0 for a in by_status[503]), "503s are immediate"
        assert all(1.4 < a.seconds < 3.0 for a in by_status[504]), "504s come at the timeout, not later"
        # Those 40 events are durable: the worker, going on, predicts each of them into the output topic.
        worker.proc.send_signal(signal.SIGCONT)
        waiting = {a.event["event_id"] for a in by_status[504]}
        reader = OutputReader(pipeline.bootstrap, pipeline.output)
        try:
            assert reader.read_until(waiting, timeout_s=60), f"{reader.missing(waiting)} never predicted"
        finally:
            reader.close()
        assert worker.terminate() == 0
        assert gateway.stop() == 0
    finally:
        if worker is not None:
            worker.proc.send_signal(signal.SIGCONT)
        gateway.process.kill()


def test_the_gateway_refuses_a_bad_configuration_with_one_line(broker: BrokerInfo, tmp_path: Path,
                                                               unique_name: Callable[[str], str]) -> None:
    topic = unique_name("in")
    create_topics(broker.bootstrap, [topic], 1)
    gateway = Gateway(broker.bootstrap, topic, tmp_path / "gw.log", "--reply-partition", "4")
    try:
        assert gateway.process.wait(60) == 2
        assert "--reply-partition 4" in gateway.process.output()
    finally:
        gateway.process.kill()
    # A model that declares no input schema, and none given; half of HTTPS; a guessable key: each refused, saying
    # what to pass.
    for i, (args, says) in enumerate([
            (["--model", "minilm"], "no input schema: --model minilm declares none; pass --input-schema"),
            (["--ssl-certfile", str(tmp_path / "cert.pem")], "HTTPS needs both --ssl-certfile and --ssl-keyfile"),
            (["--api-key", "secret"], "an API key must be at least 16 characters")]):
        gateway = Gateway(broker.bootstrap, topic, tmp_path / f"gw-{i}.log", *args, input_schema=None)
        try:
            assert gateway.process.wait(60) == 2
            assert says in gateway.process.output()
        finally:
            gateway.process.kill()


def test_a_worker_killed_mid_load_under_exactly_once_answers_every_caller_rightly_or_with_504(
        broker: BrokerInfo, pipeline: Pipeline, model_dir: Path, tmp_path: Path) -> None:
    """Two exactly-once workers; one SIGKILLed a third of the way through the callers: every caller gets its own
    prediction (or a 504 naming where its event is), and every event is predicted exactly once in the output."""
    if not broker.hides_aborted_transactions:
        pytest.skip("this broker shows aborted transactions to read_committed readers")
    args = ("--guarantee", "exactly-once", "--batch-policy", "fixed", "--max-wait-ms", "20")
    # The killed worker's open transaction holds back what read_committed readers (the gateway among them) see
    # of the partitions it wrote until the broker aborts it, as no replica with its transactional id comes back
    # to: after its timeout, 10 s here instead of the default 60, and up to one more run of the broker's abort scan
    # (every 10 s) (docs/gateway.md). A caller whose event was sent as the worker died waits up to 20 s for that,
    # then for its event's turn: the callers wait 30 s (at 20 s one loaded run of the suite answered 1,348 of 1,500).
    env = {"KAFKA_PRODUCER_TRANSACTION_TIMEOUT_MS": "10000"}
    workers = [pipeline.worker(*args, env=env), pipeline.worker(*args, env=env)]
    gateway = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw.log", "--timeout-ms", "30000")
    try:
        for w in workers:
            wait_for_assignment(w)
        gateway.wait_ready()
        sent = events(1500, seed=44)

        async def callers_with_a_kill() -> list:
            asyncio.get_running_loop().call_later(2.5, workers[0].proc.kill)
            return await call_at_rate("127.0.0.1", gateway.port, sent, rate=300.0)

        answers = asyncio.run(callers_with_a_kill())
        assert workers[0].proc.poll() is not None, "the worker was killed while callers waited"
        statuses = {a.status for a in answers}
        assert statuses <= {200, 504}, statuses
        expected = expected_scores(model_dir, sent)
        for a in answers:
            if a.status == 200:
                assert a.body["event_id"] == a.event["event_id"]
                assert a.body["fraud_score"] == pytest.approx(expected[a.event["event_id"]], abs=1e-5)
            else:
                assert a.body["input_offset"] is not None, a.body
        answered = sum(a.status == 200 for a in answers)
        assert answered >= 0.9 * len(sent), f"only {answered} of {len(sent)} answered in time"
        reader = OutputReader(pipeline.bootstrap, pipeline.output)
        try:
            ids = {e["event_id"] for e in sent}
            assert reader.read_until(ids, timeout_s=120), f"{reader.missing(ids)} events never predicted"
            assert reader.duplicates() == 0 and reader.unexpected(ids) == 0
        finally:
            reader.close()
        assert gateway.stop() == 0
        assert workers[1].terminate() == 0
    finally:
        gateway.process.kill()


def test_readyz_follows_the_brokers_and_sigterm_answers_the_callers_in_flight(tmp_path: Path) -> None:
    """On a broker of its own (Tansu, stopped midway): SIGTERM with a caller waiting: that caller is answered
    (here 504: no worker) before the gateway exits 0; /readyz 503 (and /healthz 200) once the brokers are gone."""
    from stream.local.broker import start_tansu

    broker = start_tansu()
    gateway = None
    try:
        create_topics(broker.bootstrap, ["ready-in"], 1)
        gateway = Gateway(broker.bootstrap, "ready-in", tmp_path / "gw.log", "--timeout-ms", "3000")
        gateway.wait_ready()

        async def one_caller_then_sigterm() -> list:
            pending = asyncio.ensure_future(call_at_rate("127.0.0.1", gateway.port, events(1, seed=45), rate=1.0))
            await asyncio.sleep(1.0)
            gateway.process.proc.send_signal(15)
            return await pending

        [answer] = asyncio.run(one_caller_then_sigterm())
        assert answer.status == 504 and answer.body["input_offset"] is not None, answer.body
        assert 2.5 < answer.seconds < 6.0, "answered at its timeout, during the shutdown"
        assert gateway.process.wait(30) == 0, gateway.process.output()[-2000:]
        gateway.process.kill()

        gateway = Gateway(broker.bootstrap, "ready-in", tmp_path / "gw-2.log")
        gateway.wait_ready()
        broker.stop()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and httpx.get(f"{gateway.url}/readyz", timeout=5).status_code == 200:
            time.sleep(0.25)
        readyz = httpx.get(f"{gateway.url}/readyz", timeout=5)
        assert readyz.status_code == 503 and any("brokers" in why for why in readyz.json()["why"])
        assert httpx.get(f"{gateway.url}/healthz", timeout=5).status_code == 200, "alive, not ready"
        for typo in ("/readz", "/heathz", "/v1/predicts"):  # a mistyped probe fails instead of passing
            assert httpx.get(f"{gateway.url}{typo}", timeout=5).status_code == 404, typo
        assert httpx.get(f"{gateway.url}/", timeout=5).status_code == 405  # / takes TEI's POST only
    finally:
        if gateway is not None:
            gateway.process.kill()
        broker.stop()


def test_a_gateway_started_before_its_brokers_says_why_it_waits_and_serves_once_they_answer(tmp_path: Path) -> None:
    """Its brokers not up yet (a broker of its own, started later on the port it was given): one WARNING at once
    with librdkafka's reason, no exit; meanwhile it answers its probes (alive, not ready, saying why) and every
    other route with a 503 and Retry-After in its protocol's shape; ready once they answer. It used to say nothing
    for 30 s, then exit 1 with a TimeoutError's traceback; then it waited without listening, so that a
    supervisor's liveness probe failed."""
    from stream.local.broker import free_port, start_tansu

    port = free_port()
    gateway = Gateway(f"127.0.0.1:{port}", "early-in", tmp_path / "gw.log")
    broker = None
    try:
        deadline = time.monotonic() + 30
        while "cannot reach the Kafka brokers" not in gateway.process.output() and time.monotonic() < deadline:
            assert gateway.process.proc.poll() is None, gateway.process.output()[-3000:]
            time.sleep(0.2)
        [warning] = [line for line in gateway.process.output().splitlines() if "cannot reach the Kafka" in line]
        assert "Connection refused" in warning, warning
        with httpx.Client(base_url=gateway.url, timeout=5) as http:
            assert http.get("/healthz").json() == {"alive": True} and http.get("/v2/health/live").status_code == 200
            ready = http.get("/readyz")
            assert ready.status_code == 503 and ready.headers["retry-after"] == "5", ready.text
            assert ready.json() == {"ready": False, "why": ["the gateway is starting: waiting for the Kafka brokers"]}
            assert http.get("/v2/health/ready").status_code == 503
            own = http.post("/v1/predict", json=events(1, seed=3)[0])
            assert own.status_code == 503 and own.headers["retry-after"] == "5", own.text
            assert "waiting for the Kafka brokers" in own.json()["error"]
            openai = http.post("/v1/embeddings", json={"model": "m", "input": "a text"})
            assert openai.status_code == 503 and "starting" in openai.json()["error"]["message"], openai.text
        time.sleep(3)  # retrying meanwhile, and saying so once
        assert gateway.process.proc.poll() is None, gateway.process.output()[-3000:]
        broker = start_tansu(port)
        create_topics(broker.bootstrap, ["early-in"], 1)
        gateway.wait_ready(60)
        out = gateway.process.output()
        assert "the Kafka brokers answer again" in out and out.count("cannot reach the Kafka brokers") == 1, out
        assert gateway.stop() == 0, gateway.process.output()[-3000:]
    finally:
        gateway.process.kill()
        if broker is not None:
            broker.stop()


def test_a_gateway_waiting_for_its_brokers_stops_at_once_and_a_start_up_error_still_exits_2(tmp_path: Path) -> None:
    """SIGTERM while it waits for brokers that never come: exit 0 within a bound. An error found once they
    answer (here a --reply-partition the reply topic lacks) stops the server it had started and exits 2 naming
    it, as when it was found before listening."""
    from stream.local.broker import free_port, start_tansu

    waiting = Gateway(f"127.0.0.1:{free_port()}", "never-in", tmp_path / "waiting.log")
    try:
        waiting.wait_alive()
        started = time.monotonic()
        assert waiting.stop() == 0, waiting.process.output()[-3000:]
        assert time.monotonic() - started < 5, waiting.process.output()[-3000:]
        assert "gateway stopped" in waiting.process.output()
    finally:
        waiting.process.kill()
    broker = start_tansu()
    try:
        create_topics(broker.bootstrap, ["wrong-in", "wrong-in-replies"], 1)
        wrong = Gateway(broker.bootstrap, "wrong-in", tmp_path / "wrong.log", "--reply-topic", "wrong-in-replies",
                        "--reply-partition", "3")
        try:
            assert wrong.process.wait(60) == 2, wrong.process.output()[-3000:]
            assert "--reply-partition 3: wrong-in-replies has 1 partition(s)" in wrong.process.output()
        finally:
            wrong.process.kill()
    finally:
        broker.stop()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_over_https_only_callers_with_a_key_get_in_and_the_probes_stay_open(
        pipeline: Pipeline, model_dir: Path, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    from_file, from_env = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    (tmp_path / "keys").write_text(f"# the callers' keys\n{from_file}\n")
    worker = pipeline.worker("--max-wait-ms", "5")
    gateway = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw.log", "--api-key-file",
                      str(tmp_path / "keys"), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
                      env={"STREAM_GATEWAY_API_KEYS": from_env}, api_key=from_file, ca=cert)
    try:
        wait_for_assignment(worker)
        gateway.wait_ready()
        sent = events(2, seed=47)
        expected = expected_scores(model_dir, sent)
        with httpx.Client(base_url=gateway.url, verify=gateway.verify, timeout=30) as http:
            for event, k in zip(sent, (from_file, from_env), strict=True):
                answer = http.post("/v1/predict", json=event, headers={"Authorization": f"Bearer {k}"})
                assert answer.status_code == 200, answer.text
                assert answer.json()["fraud_score"] == pytest.approx(expected[event["event_id"]], abs=1e-5)
            for headers in ({}, {"Authorization": f"Bearer {from_file[:-1]}"}, {"Authorization": from_env}):
                refused = http.post("/v1/predict", json=sent[0], headers=headers)
                assert refused.status_code == 401 and "API key" in refused.json()["error"], refused.text
                assert http.get("/metrics", headers=headers).status_code == 401
            assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
        assert gateway.metric("stream_gateway_requests_total", '{status="200"}') == 2, "refusals never got in"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{gateway.port}/healthz", timeout=5)  # plain HTTP is not served
        assert "API key" in gateway.process.output() and "anyone who can reach" not in gateway.process.output()
        assert gateway.stop() == 0
        assert worker.terminate() == 0
    finally:
        gateway.process.kill()
