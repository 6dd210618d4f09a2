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
from stream.gateway.auth import ApiKeys, load_keys

KEY, OTHER = "k" * 20 + "-first", "o" * 24


def client() -> TestClient:
    async def ok(request: Request) -> Response:
        return JSONResponse({"path": request.url.path})

    paths = ["/v1/predict", "/v1/embeddings", "/v1/models", "/v2/models/m/infer", "/metrics", "/healthz", "/readyz",
             "/v2/health/live", "/v2/health/ready"]
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
    return TestClient(ApiKeys(app, [KEY, OTHER]))  # type: ignore[arg-type]


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
    assert load_keys([KEY], [str(listing)], {"STREAM_GATEWAY_API_KEYS": f" {'e' * 16},{KEY}"}) == [
        KEY, "e" * 16, OTHER]
    assert load_keys([], [], {}) == []
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_keys(["short"], [], {})
    with pytest.raises(ConfigError, match=r"--api-key-file .*missing"):
        load_keys([], [str(tmp_path / "missing")], {})
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="no key in it"):
        load_keys([], [str(tmp_path / "empty")], {})
