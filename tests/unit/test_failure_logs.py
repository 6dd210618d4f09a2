"""What a failed test's report carries (`tests.failure_logs`): the lines its servers wrote while it ran, and its
own processes' logs, so that a CI failure explains itself from CI's log."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from stream.local.broker import file_tail, log_tails
from tests.failure_logs import TAIL_LINES, FailureLogs


def test_a_failed_test_shows_what_its_servers_wrote_during_it_and_its_own_logs(tmp_path: Path) -> None:
    server = tmp_path / "server.log"
    server.write_text("before the test\n")
    logs = FailureLogs()
    logs.watch("broker", lambda: [server])
    logs.watch("schema_registry", lambda: [tmp_path / "missing.log"])
    logs.mark()
    server.write_text(server.read_text() + "".join(f"during {i}\n" for i in range(100)))
    own = tmp_path / "test" / "worker-0.log"
    own.parent.mkdir()
    own.write_text("the worker's last words\n")
    item = SimpleNamespace(fixturenames=["broker", "tmp_path"], funcargs={"tmp_path": own.parent})
    sections = dict(logs.sections(item))  # type: ignore[arg-type]
    [(broker_title, broker_text)] = [(k, v) for k, v in sections.items() if k.startswith("broker:")]
    assert "server.log" in broker_title
    assert broker_text.splitlines() == [f"during {i}" for i in range(100 - TAIL_LINES, 100)]
    assert any(v == "the worker's last words" for v in sections.values())
    assert not any(k.startswith("schema_registry") for k in sections), "a fixture the test did not use"
    logs.forget("broker")
    assert not any(k.startswith("broker") for k, _ in logs.sections(item))  # type: ignore[arg-type]


def test_a_tail_starts_over_when_the_file_shrank_and_an_unreadable_one_is_left_out(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("one\ntwo\n")
    assert file_tail(log, 1, start=1000) == "two"
    assert file_tail(tmp_path / "none.log") is None
    assert log_tails([log, tmp_path / "none.log"], 5) == f"--- {log} (last 5 lines)\none\ntwo"
