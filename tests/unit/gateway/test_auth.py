"""The gateway's API keys (`stream.gateway.auth`): which routes need one, how a key is given, what a refusal
looks like in each protocol's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from stream.errors import ConfigError
from stream.gateway import auth
from stream.gateway.auth import ApiKeys, KeySource, load_keys
from stream.gateway.settings import load_gateway_settings

KEY, OTHER = "k" * 20 + "-first", "o" * 24


def client() -> TestClient:
    async def ok(request: Request) -> Response:
        return JSONResponse({"path": request.url.path})

    paths = ["/v1/predict", "/v1/embeddings", "/v1/models", "/v2/models/m/infer", "/metrics", "/healthz", "/readyz",
             "/v2/health/live", "/v2/health/ready"]
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
    return TestClient(ApiKeys(app, KeySource([KEY, OTHER], []),  # type: ignore[arg-type]
                              {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"}))


def test_every_route_but_the_health_ones_needs_one_of_the_keys() -> None:
    http = client()
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        assert http.get(path).status_code == 200, path
    for path in ("/v1/predict", "/metrics", "/v2/models/m/infer"):
        missing = http.post(path)
        assert missing.status_code == 401 and missing.json() == {
            "error": "no API key: send Authorization: Bearer <key>"}
        assert missing.headers["www-authenticate"].startswith("Bearer")
        for header in (f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer "):
            assert http.post(path, headers={"Authorization": header}).status_code == 401, header
        for key in (KEY, OTHER):
            assert http.post(path, headers={"Authorization": f"Bearer {key}"}).json() == {"path": path}
        assert http.post(path, headers={"authorization": f"bearer  {KEY}"}).status_code == 200, "as RFC 6750 says"


def test_openai_routes_are_refused_in_openai_s_error_shape() -> None:
    http = client()
    for path in ("/v1/embeddings", "/v1/models"):
        refused = http.post(path, headers={"Authorization": "Bearer wrong-key-of-enough-length"})
        assert refused.status_code == 401
        assert refused.json() == {"error": {"message": "the API key is not one of this gateway's",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "invalid_api_key"}}


def test_keys_come_from_flags_files_and_the_environment_and_a_weak_one_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "keys"
    listing.write_text(f"# rotated 2026-11\n{OTHER}\n\n{KEY}\n")
    listing.chmod(0o600)
    settings = load_gateway_settings({"input_topic": "in", "bootstrap_servers": "b", "api_key": [KEY]},
                                     {"STREAM_GATEWAY_API_KEYS": f" {'e' * 16},{KEY}"})
    assert [k.get_secret_value() for k in settings.api_key] == [KEY], "the flag wins over the variable"
    settings = load_gateway_settings({"input_topic": "in", "bootstrap_servers": "b"},
                                     {"STREAM_GATEWAY_API_KEYS": f" {'e' * 16},{KEY}"})
    keys = load_keys([k.get_secret_value() for k in settings.api_key], [listing])
    assert keys is not None and keys.current() == [b"e" * 16, KEY.encode(), OTHER.encode()]
    assert load_keys([], []) is None
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_keys(["short"], [])
    with pytest.raises(ConfigError, match=r"--api-key-file .*missing"):
        load_keys([], [tmp_path / "missing"])
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="no key in it"):
        load_keys([], [tmp_path / "empty"])


def test_a_key_source_that_is_set_but_empty_refuses_to_start() -> None:
    for empty in ("", " , ", ","):
        with pytest.raises(ConfigError, match="holds no key"):
            load_gateway_settings({"input_topic": "in", "bootstrap_servers": "b"},
                                  {"STREAM_GATEWAY_API_KEYS": empty})


def test_a_key_file_others_may_write_is_refused_and_one_they_may_read_is_warned_of(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    listing = tmp_path / "keys"
    listing.write_text(KEY + "\n")
    listing.chmod(0o666)
    with pytest.raises(ConfigError, match="others may write it"):
        load_keys([], [listing])
    listing.chmod(0o644)
    assert load_keys([], [listing]) is not None
    assert "any user may read it (mode 644)" in caplog.text


def test_a_rotated_key_file_is_read_again_without_a_restart(tmp_path: Path) -> None:
    listing = tmp_path / "keys"
    listing.write_text(KEY + "\n")
    listing.chmod(0o600)
    now = [0.0]
    source = KeySource([], [listing], clock=lambda: now[0])
    http = client_with(source)
    assert http.get("/v1/predict", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    # A Kubernetes secret's rotation: a new file swapped in (a new inode), the old key gone.
    fresh = tmp_path / "keys.new"
    fresh.write_text(OTHER + "\n")
    fresh.chmod(0o600)
    fresh.replace(listing)
    def status(key: str) -> int:
        return http.get("/v1/predict", headers={"Authorization": f"Bearer {key}"}).status_code

    assert status(OTHER) == 401, "checked at most once a second"
    now[0] += auth.CHECK_EVERY_S
    assert status(OTHER) == 200 and status(KEY) == 401
    # A file that cannot be read meanwhile keeps the keys it had.
    listing.unlink()
    now[0] += auth.CHECK_EVERY_S
    assert status(OTHER) == 200


def client_with(source: KeySource) -> TestClient:
    async def ok(request: Request) -> Response:
        return JSONResponse({"path": request.url.path})

    return TestClient(ApiKeys(Starlette(routes=[Route("/v1/predict", ok)]), source, set()))  # type: ignore[arg-type]
