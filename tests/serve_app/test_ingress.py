"""The API-key ingress, served for real: Ray Serve runs ``serve_app.ingress.KeyedOpenAiIngress`` the
way Ray Serve LLM's builders do (``make_fastapi_ingress``) on loopback, with no engine behind it
(no model: the key check comes before any model lookup), and the OpenAI client talks to it."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

import pytest

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = [pytest.mark.serving, pytest.mark.live]

KEYS = ("sk-first-4f1c2a", "sk-second-9b7d3e")


@pytest.fixture(scope="module")
def keyed_ingress(tmp_path_factory):
    """The keyed ingress on 127.0.0.1 at a free port, two keys in its directory (rotation)."""
    from ray import serve
    from ray.serve.llm.ingress import make_fastapi_ingress

    from serve_app.ingress import KeyedOpenAiIngress

    directory = tmp_path_factory.mktemp("api-keys")
    for index, key in enumerate(KEYS):
        (directory / f"key-{index}").write_text(key + "\n")
    # The CSI driver's bookkeeping beside the keys: never read as a key.
    (directory / "..data").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The key check is the ingress's, not Ray's: a Ray without token authentication, said explicitly
    # (Ray's ray.init() may otherwise turn it on and keep a token in ~/.ray/auth_token).
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = serve.deployment(make_fastapi_ingress(KeyedOpenAiIngress), ray_actor_options={"num_cpus": 0}).bind(
            llm_deployments={}, model_cards={}, api_key_dir=str(directory)
        )
        serve.run(app, name="keyed", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def call(url: str, *, method: str = "GET", key: str | None = None, body: dict | None = None) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"{}")


def test_every_route_without_a_key_gets_openais_401(keyed_ingress):
    for method, path, body in [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/tiny", None),
        ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}),
        ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}),
    ]:
        status, headers, answer = call(keyed_ingress + path, method=method, body=body)
        assert status == 401, (path, answer)
        assert headers.get("www-authenticate", headers.get("WWW-Authenticate")) == "Bearer"
        assert answer == {
            "error": {
                "message": "You didn't provide an API key. You need to provide your API key in an Authorization "
                "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }, path


def test_a_wrong_key_is_refused_without_echoing_it(keyed_ingress):
    status, _, answer = call(keyed_ingress + "/v1/models", key="sk-not-a-key")
    assert status == 401
    assert answer["error"]["code"] == "invalid_api_key"
    assert "sk-not-a-key" not in json.dumps(answer)
    status, _, _ = call(keyed_ingress + "/v1/models", key=KEYS[0][:-1])
    assert status == 401


def test_either_key_is_served_so_clients_can_move_from_one_to_the_next(keyed_ingress):
    for key in KEYS:
        status, _, answer = call(keyed_ingress + "/v1/models", key=key)
        assert (status, answer["object"], answer["data"]) == (200, "list", [])
    # With a key the request reaches Ray's own handling: here, a model this ingress does not serve.
    status, _, answer = call(keyed_ingress + "/v1/models/tiny", key=KEYS[1])
    assert status == 404 and "Unable to find tiny" in answer["error"]["message"]


def test_the_openai_client_sends_its_key_as_bearer(keyed_ingress):
    import openai

    served = openai.OpenAI(base_url=keyed_ingress + "/v1", api_key=KEYS[0], max_retries=0).models.list()
    assert list(served) == []
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=keyed_ingress + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


def test_serves_health_checks_need_no_key(keyed_ingress):
    with urllib.request.urlopen(keyed_ingress + "/-/healthz", timeout=30) as response:
        assert response.status == 200
