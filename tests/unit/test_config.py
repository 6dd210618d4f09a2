from __future__ import annotations

import os
import platform
import sys

import pytest

from stream.config import (
    WorkerSettings,
    default_prepare_threads,
    load_settings,
)
from stream.errors import ConfigError
from stream.kafka_env import env_to_librdkafka_key, kafka_admin_env_config, kafka_env_config
from stream.pipeline.malloc import tune_malloc

BASE = {"input_topic": "in", "output_topic": "out", "group_id": "g", "bootstrap_servers": "127.0.0.1:9092"}


def test_defaults() -> None:
    s = load_settings(BASE, environ={})
    assert (s.max_batch_size, s.max_wait_ms, s.model, s.stop_at_end) == (4096, 20.0, "demo", False)
    assert s.batch_policy == "adaptive"
    assert (s.metrics_port, s.metrics_host) == (None, "127.0.0.1"), "/metrics on this host only unless asked"
    assert load_settings(BASE, environ={"STREAM_METRICS_HOST": "0.0.0.0"}).metrics_host == "0.0.0.0"  # the image's


def test_prepare_threads_default_to_half_the_cores_from_one_to_four() -> None:
    assert [default_prepare_threads(c) for c in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 4, 4]
    assert load_settings(BASE, environ={}).prepare_threads == default_prepare_threads()
    assert load_settings(BASE, environ={"STREAM_PREPARE_THREADS": "3"}).prepare_threads == 3


def test_flags_override_env_and_env_overrides_defaults() -> None:
    env = {"STREAM_MAX_BATCH_SIZE": "64", "STREAM_MAX_WAIT_MS": "5"}
    s = load_settings({**BASE, "max_batch_size": 32}, environ=env)
    assert s.max_batch_size == 32 and s.max_wait_ms == 5.0


def test_kafka_bootstrap_env_is_a_fallback() -> None:
    s = load_settings({k: v for k, v in BASE.items() if k != "bootstrap_servers"},
                      environ={"KAFKA_BOOTSTRAP_SERVERS": "h:1"})
    assert s.bootstrap_servers == "h:1"


def test_bootstrap_flag_wins_over_kafka_bootstrap_env_in_both_clients() -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "elsewhere:1"}
    s = load_settings(BASE, environ=env)
    assert s.consumer_config(env)["bootstrap.servers"] == "127.0.0.1:9092"
    assert s.producer_config(env)["bootstrap.servers"] == "127.0.0.1:9092"


@pytest.mark.parametrize(
    "override,needle",
    [
        ({"max_batch_size": 0}, "--max-batch-size"),
        ({"max_wait_ms": -1}, "--max-wait-ms"),
        ({"output_topic": "in"}, "must differ"),
        ({"device": "tpu"}, "--device"),
        ({"metrics_port": 70000}, "--metrics-port"),
        ({"metrics_port": "9107-9100"}, "--metrics-port"),
        ({"metrics_port": "91oo"}, "--metrics-port"),
        ({"gil_switch_interval_ms": 0}, "--gil-switch-interval-ms"),
        ({"prepare_threads": 0}, "--prepare-threads"),
    ],
)
def test_bad_values_give_clear_errors(override: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_settings({**BASE, **override}, environ={})


def test_the_metrics_port_is_one_port_or_a_range_from_flags_and_env() -> None:
    from stream.config import PortRange

    assert load_settings({**BASE, "metrics_port": 9100}, environ={}).metrics_port == PortRange(9100, 9100)
    assert load_settings({**BASE, "metrics_port": "9100-9107"}, environ={}).metrics_port == PortRange(9100, 9107)
    assert load_settings(BASE, environ={"STREAM_METRICS_PORT": "9100-9103"}).metrics_port == PortRange(9100, 9103)


def test_missing_required_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="--group-id"):
        load_settings({k: v for k, v in BASE.items() if k != "group_id"}, environ={})


def test_unknown_stream_env_is_rejected() -> None:
    with pytest.raises(ConfigError, match="STREAM_MAX_BATCH"):
        load_settings(BASE, environ={"STREAM_MAX_BATCH": "3"})


def test_confluent_naming_rule() -> None:
    assert env_to_librdkafka_key("SESSION_TIMEOUT_MS") == "session.timeout.ms"
    assert env_to_librdkafka_key("SASL_KERBEROS__SERVICE___NAME") == "sasl.kerberos_service-name"


def test_pass_through_and_client_specific_prefixes() -> None:
    consumer, producer = kafka_env_config({"KAFKA_CLIENT_ID": "x", "KAFKA_CONSUMER_FETCH_MIN_BYTES": "10",
                                           "KAFKA_PRODUCER_LINGER_MS": "2", "OTHER": "1"})
    assert consumer == {"client.id": "x", "fetch.min.bytes": "10"}
    assert producer == {"client.id": "x", "linger.ms": "2"}
    s = load_settings(BASE, environ={})
    conf = s.consumer_config({"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
    assert conf["session.timeout.ms"] == "6000"
    assert conf["enable.auto.commit"] == "false" and conf["enable.auto.offset.store"] == "false"
    assert conf["partition.assignment.strategy"] == "cooperative-sticky" and conf["group.id"] == "g"
    assert s.producer_config({"KAFKA_PRODUCER_LINGER_MS": "2"})["linger.ms"] == "2"


def test_transactions_retry_a_busy_coordinator_after_20_ms_unless_told_otherwise() -> None:
    eos = load_settings({**BASE, "guarantee": "exactly-once"}, environ={})
    assert eos.producer_config({})["retry.backoff.ms"] == 20
    assert eos.producer_config({"KAFKA_PRODUCER_RETRY_BACKOFF_MS": "50"})["retry.backoff.ms"] == "50"
    assert "retry.backoff.ms" not in load_settings(BASE, environ={}).producer_config({})


def test_settings_that_break_the_guarantee_are_refused() -> None:
    s = load_settings(BASE, environ={})
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit"):
        s.consumer_config({"KAFKA_ENABLE_AUTO_COMMIT": "true"})
    with pytest.raises(ConfigError, match="acks"):
        s.producer_config({"KAFKA_ACKS": "1"})


def test_no_bootstrap_is_a_clear_error() -> None:
    s = load_settings({k: v for k, v in BASE.items() if k != "bootstrap_servers"}, environ={})
    with pytest.raises(ConfigError, match="bootstrap"):
        s.consumer_config({})


def test_every_setting_has_a_worker_flag_and_flags_default_to_none() -> None:
    from stream.cli import build_parser
    from stream.config import WorkerSettings

    args = build_parser().parse_args(["worker"])
    assert [f for f in WorkerSettings.model_fields if not hasattr(args, f)] == []
    assert {f: getattr(args, f) for f in WorkerSettings.model_fields if getattr(args, f) is not None} == {}


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_malloc_tuning_yields_to_the_operators_own() -> None:
    for env in ({"MALLOC_ARENA_MAX": "4"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}):
        assert tune_malloc(env) is False
    assert tune_malloc({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}) is True


def test_fetches_are_never_held_longer_than_a_batch_waits() -> None:
    assert load_settings(BASE, environ={}).consumer_config({})["fetch.wait.max.ms"] == 20
    assert load_settings({**BASE, "max_wait_ms": 0.5}, environ={}).consumer_config({})["fetch.wait.max.ms"] == 1
    assert load_settings({**BASE, "max_wait_ms": 60_000}, environ={}).consumer_config({})["fetch.wait.max.ms"] == 500
    s = load_settings(BASE, environ={})
    assert s.consumer_config({"KAFKA_CONSUMER_FETCH_WAIT_MAX_MS": "100"})["fetch.wait.max.ms"] == "100"


def test_a_full_prefetch_queue_is_looked_at_again_soon() -> None:
    # librdkafka's 1 s default idled the worker once it had drained a full queue (measured on Tansu).
    s = load_settings(BASE, environ={})
    assert s.consumer_config({})["fetch.queue.backoff.ms"] == 10
    # the prefetch bound that also sees records of small values with large keys or headers
    assert s.consumer_config({})["queued.min.messages"] == 200
    assert s.consumer_config({"KAFKA_CONSUMER_QUEUED_MIN_MESSAGES": "5000"})["queued.min.messages"] == "5000"
    assert s.consumer_config({"KAFKA_CONSUMER_FETCH_QUEUE_BACKOFF_MS": "250"})["fetch.queue.backoff.ms"] == "250"


def test_the_docs_list_exactly_the_acls_the_worker_needs() -> None:
    """The operator's guide's least-privilege table and `stream.kafka.access.required` say the same."""
    from pathlib import Path

    from stream.kafka.access import required

    guide = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
    table = guide.read_text().split("## Security: the least-privilege ACLs")[1].split("\n\n")[2]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")][:3] for line in table.splitlines()[2:]]
    flags = {"--input-topic": "in", "--group-id": "g", "--output-topic": "out", "--dlq-topic": "dlq",
             "--transactional-id": "tid"}
    documented = sorted((kind, flags[flag], op) for kind, flag, op in rows)
    settings = WorkerSettings(bootstrap_servers="b:9092", input_topic="in", output_topic="out", group_id="g",
                              dlq_topic="dlq", guarantee="exactly-once", transactional_id="tid")
    assert documented == sorted(required(settings))


def test_admin_settings_take_the_shared_kafka_variables_and_their_own_not_the_clients() -> None:
    env = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_PASSWORD": "p", "KAFKA_ADMIN_REQUEST_TIMEOUT_MS": "9",
           "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", "KAFKA_PRODUCER_LINGER_MS": "0"}
    assert kafka_admin_env_config(env) == {"security.protocol": "SASL_SSL", "sasl.password": "p",
                                           "request.timeout.ms": "9"}
    consumer, producer = kafka_env_config(env)
    assert "request.timeout.ms" not in consumer and "request.timeout.ms" not in producer
    assert "admin.request.timeout.ms" not in consumer


def test_reply_topics_shadow_and_start_from() -> None:
    s = load_settings(BASE, environ={})
    assert s.reply_topic_set == {"in.replies"} and s.start_from_ms is None
    assert s.consumer_config(environ={})["auto.offset.reset"] == "earliest"
    assert load_settings({**BASE, "reply_topics": "a, b"}, environ={}).reply_topic_set == {"a", "b"}
    shadow = load_settings({**BASE, "shadow": True, "start_from": "latest"}, environ={})
    assert shadow.reply_topic_set == frozenset(), "a shadow run answers no caller"
    assert shadow.consumer_config(environ={})["auto.offset.reset"] == "latest" and shadow.start_from_ms is None
    assert load_settings({**BASE, "start_from": "2026-11-26T14:00:00Z"}, environ={}).start_from_ms == 1795701600000
    assert load_settings({**BASE, "start_from": "1795788000000"}, environ={}).start_from_ms == 1795788000000
    for bad, why in (({"start_from": "yesterday"}, "not earliest, latest"),
                     ({"start_from": "2026-11-26T14:00:00"}, "no time zone"),
                     ({"shadow": True, "reply_topics": "x"}, "answers no caller")):
        with pytest.raises(ConfigError, match=why):
            load_settings({**BASE, **bad}, environ={})


def test_copy_headers_are_names_beside_the_trace_context_and_never_the_pipeline_s_own() -> None:
    from stream.kafka.replies import carried_headers, watched_headers

    assert load_settings(BASE, environ={}).copy_header_names == ()
    s = load_settings({**BASE, "copy_headers": " tenant, x-request-id,tenant"}, environ={})
    assert s.copy_header_names == ("tenant", "x-request-id")
    assert carried_headers(s.copy_header_names) == ("traceparent", "tracestate", "tenant", "x-request-id")
    assert len(watched_headers(s.copy_header_names)) == 8  # a reply address's four first
    for bad, why in (("a,,b", "an empty header name"), (",".join(f"h{i}" for i in range(11)), "11 names, at most 10"),
                     ("stream.reply", "the pipeline's own header"), ("kafka_replyTopic", "the pipeline's own"),
                     ("stream.input.offset", "the pipeline's own")):
        with pytest.raises(ConfigError, match=why):
            load_settings({**BASE, "copy_headers": bad}, environ={})


def test_a_librdkafka_setting_it_refuses_is_a_config_error_with_its_reason(capfd: pytest.CaptureFixture[str]) -> None:
    from stream.kafka_env import check_client_config

    source = "KAFKA_* and KAFKA_CONSUMER_* variables"
    with pytest.raises(ConfigError, match=r"consumer's settings \(KAFKA_\* and KAFKA_CONSUMER_\* variables\): "
                                          r".*`fetch.max.bytes` must be >= `message.max.bytes`"):
        check_client_config("consumer", {"bootstrap.servers": "127.0.0.1:1", "fetch.max.bytes": "65536"}, source)
    with pytest.raises(ConfigError, match=r'No such configuration property: "fetch\.max\.byte"'):
        check_client_config("consumer", {"fetch.max.byte": "65536"}, source)
    with pytest.raises(ConfigError, match=r"producer's settings .*compression\.codec"):
        check_client_config("producer", {"compression.type": "brotli"}, "KAFKA_PRODUCER_*")
    with pytest.raises(ConfigError, match=r"admin's settings .*security\.protocol"):
        check_client_config("admin", {"security.protocol": "tls"}, "KAFKA_ADMIN_*")
    s = WorkerSettings(input_topic="in", output_topic="out", group_id="g", bootstrap_servers="127.0.0.1:1",
                       guarantee="exactly-once")
    for kind, conf in (("consumer", s.consumer_config({})), ("producer", s.producer_config({})),
                       ("admin", s.admin_config({}))):
        check_client_config(kind, {**conf, "error_cb": print}, source)  # the worker's own: accepted
    assert capfd.readouterr() == ("", "")  # the check's clients log nothing and connect nowhere


@pytest.mark.parametrize("command", [["worker", "--input-topic", "in", "--output-topic", "out", "--group-id", "g",
                                      "--model-dir", "/nonexistent"], ["gateway", "--input-topic", "in"]])
def test_the_commands_refuse_a_librdkafka_setting_at_their_start_saying_why(command: list[str]) -> None:
    """A fetch.max.bytes below message.max.bytes (both librdkafka's to check) used to end a worker with a traceback
    once its model had loaded and its probes answered; now the command ends at its start with the reason."""
    import subprocess
    import sys

    env = {**os.environ, "KAFKA_CONSUMER_FETCH_MAX_BYTES": "65536", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    out = subprocess.run([sys.executable, "-m", "stream", *command], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert ("error: librdkafka refused the consumer's settings (KAFKA_* and KAFKA_CONSUMER_* variables"
            in out.stderr), out.stderr[-2000:]
    assert "`fetch.max.bytes` must be >= `message.max.bytes`" in out.stderr
