"""Who gets in, on the local server in the cluster's shape: real Ray with token authentication (a
head with its dashboard, a worker node per phase, as KubeRay's authOptions set them up) and the
keyed ingress (an API key, as ray_service.endpoint.api_key_secrets asks for).

Without Ray's token the dashboard's Serve and job APIs and the GCS refuse the caller; with it they
answer. Without the API key the OpenAI endpoint answers 401; with it the app serves, through both
phases. The other shared servers run without a key, so the suite serves both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta
from tests.local.conftest import openai_client, report_measurement, unique_prompt, wait_for_counters

pytestmark = pytest.mark.live
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get("gcs-fault-tolerant")


def ray_token(server) -> str:
    return Path(server.status["ray_auth_token_file"]).read_text().strip()


def dashboard(server, path: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(server.status["cluster"]["dashboard_url"] + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def client_environment(**extra: str) -> dict[str, str]:
    """This test's environment without the run's Ray token settings: a caller that is not the run's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")} | extra


def test_the_dashboards_serve_api_needs_rays_token(server):
    status, body = dashboard(server, "/api/serve/applications/")
    assert status == 401 and "Missing authentication token" in body
    status, body = dashboard(server, "/api/serve/applications/", token="0" * 64)
    assert status == 403 and "Invalid authentication token" in body
    status, body = dashboard(server, "/api/serve/applications/", token=ray_token(server))
    assert status == 200
    assert json.loads(body)["applications"]["llm"]["status"] == "RUNNING"
    # KubeRay's probes read the exempt health paths, which answer without it.
    assert dashboard(server, "/api/gcs_healthz")[0] == 200


# Ray's job head waits only 10 s (ray.dashboard.consts.WAIT_AVAILABLE_AGENT_TIMEOUT) for the head
# node's job agent to answer a lookup through the GCS, then answers 500 with this text: on a busy
# machine that lookup can miss, and the answer itself says the submission may be tried again.
TRY_AGAIN_LATER = "No available agent to submit job, please try again later"


def submit_job_as_told(server, client, entrypoint: str, bound_s: float = 120) -> str:
    """Submits a job, trying again (for at most ``bound_s``) only where Ray's answer says to."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint)
        except RuntimeError as error:
            if TRY_AGAIN_LATER not in str(error) or time.monotonic() > deadline:
                raise AssertionError(f"{error}\n--- the job head's log:\n{job_head_log_tail(server)}") from error
            time.sleep(5)


def job_head_log_tail(server, lines: int = 40) -> str:
    logs = sorted(Path(server.status["cluster"]["temp_dirs"]["head"]).glob("session_2*/logs/dashboard_JobHead.log"))
    return "\n".join(logs[-1].read_text().splitlines()[-lines:]) if logs else "(no dashboard_JobHead.log)"


def test_a_job_is_submitted_only_with_rays_token(server):
    """Job submission runs code on the cluster: exactly what a pod that reached the dashboard could do."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobStatus, JobSubmissionClient

    url = server.status["cluster"]["dashboard_url"]
    with pytest.raises(AuthenticationError):
        JobSubmissionClient(url).submit_job(entrypoint="python -c \"print('not me')\"")
    client = JobSubmissionClient(url, headers={"Authorization": f"Bearer {ray_token(server)}"})
    job = submit_job_as_told(server, client, entrypoint="python -c \"print('job with the token')\"")
    deadline = time.monotonic() + 180
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, client.get_job_logs(job)
        time.sleep(2)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, client.get_job_logs(job)
    assert "job with the token" in client.get_job_logs(job)


def test_the_gcs_refuses_a_process_without_rays_token(server, tmp_path):
    """Ray's own health check (what KubeRay's wait-gcs-ready and the autoscaler run first), against the GCS."""
    address = server.status["cluster"]["gcs_address"]
    check = [sys.executable, "-m", "ray.scripts.scripts", "health-check", "--address", address, "--skip-version-check"]
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    # A refused client retries its connection; Ray's own bounds keep that short (a busy machine
    # adds the interpreter's start to it). Not getting in within the wait is not getting in.
    bounded = {"RAY_gcs_rpc_server_connect_timeout_s": "5", "RAY_gcs_rpc_server_reconnect_timeout_s": "10"}
    tokens = {"none": str(tmp_path / "missing"), "wrong": str(wrong), "the run's": server.status["ray_auth_token_file"]}
    outcomes: dict[str, int | str] = {}
    for name, token_path in tokens.items():
        env = client_environment(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path, **bounded)
        try:
            outcomes[name] = subprocess.run(check, env=env, capture_output=True, text=True, timeout=300).returncode
        except subprocess.TimeoutExpired:
            outcomes[name] = "not answered within 300 s"
    assert outcomes["none"] != 0 and outcomes["wrong"] != 0, outcomes
    assert outcomes["the run's"] == 0, outcomes


def test_the_endpoint_answers_401_without_the_api_key_and_serves_with_it(server):
    without = openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as refused:
        without.completions.create(model=MODEL, prompt="who am I", max_tokens=2)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    request = urllib.request.Request(server.base_url + "/models")
    with pytest.raises(urllib.error.HTTPError) as bare:
        urllib.request.urlopen(request, timeout=60)
    assert bare.value.code == 401
    assert json.loads(bare.value.read())["error"]["type"] == "invalid_request_error"
    # Serve's health check is the proxy's: no key.
    with urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/-/healthz", timeout=30) as health:
        assert health.status == 200

    client = openai_client(server)
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=unique_prompt("keyed", 60), max_tokens=4)
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", 60)
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == (
        response.usage.prompt_tokens
    )
    report_measurement(
        "who-gets-in",
        {
            "dashboard_without_token": dashboard(server, "/api/serve/applications/")[0],
            "dashboard_with_token": dashboard(server, "/api/serve/applications/", token=ray_token(server))[0],
            "endpoint_with_a_wrong_key": refused.value.status_code,
            "endpoint_without_a_key": bare.value.code,
            "endpoint_with_key_prompt_tokens_over_nixl": response.usage.prompt_tokens,
        },
    )


def test_a_prefix_cached_under_one_key_is_no_hit_under_another(server):
    """cache_isolation per_key, as the local server runs it with two keys: vLLM's own prefix-cache
    counters, summed over both phases' engines, for one prompt sent under key A, then key B, then A."""
    from local.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES

    assert server.other_api_keys, "the server is started with a second key"
    tenants = {
        "a": openai_client(server),
        "b": openai.OpenAI(base_url=server.base_url, api_key=server.other_api_keys[0], timeout=120, max_retries=0),
    }
    # Several of the CPU engines' 128-token blocks, so a hit is whole blocks of it.
    prompt = unique_prompt("tenant", 600)
    seen = {}
    for step, tenant in enumerate(["a", "b", "a"]):
        before = server.counters()
        tenants[tenant].completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        after = wait_for_counters(server, before, "", PREFIX_CACHE_QUERIES, "", len(prompt), 60)
        seen[f"{step}:{tenant}"] = {
            "queried": counter_delta(before, after, "", PREFIX_CACHE_QUERIES),
            "hit": counter_delta(before, after, "", PREFIX_CACHE_HITS),
        }
    report_measurement("cache-isolation-per-key", seen)
    first_a, then_b, again_a = seen.values()
    assert first_a["hit"] == 0, seen  # a prompt no one sent before
    # Key B sends the very prompt key A's requests left in the engines' caches: no block of it hits.
    assert then_b["queried"] >= len(prompt) and then_b["hit"] == 0, seen
    # Key A sending it again hits its own blocks.
    assert again_a["hit"] >= 4 * 128, seen


def answer_status(url: str, method: str = "GET", key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url, method=method, headers=headers, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_without_the_api_key_nothing_but_the_health_check_answers(server):
    """Every route the served map lists (read with the key), FastAPI's own pages (the map and the
    docs built on it, at FastAPI's default paths) and a path nobody serves: 401 without the key."""
    import re

    from fastapi import FastAPI

    root = server.base_url.removesuffix("/v1")
    with urllib.request.urlopen(
        urllib.request.Request(root + "/openapi.json", headers={"Authorization": f"Bearer {server.api_key}"}),
        timeout=60,
    ) as response:
        served_map = json.loads(response.read())
    routes = [
        (method.upper(), re.sub(r"\{[^}]*\}", "x", path))
        for path, methods in served_map["paths"].items()
        for method in methods
    ]
    defaults = FastAPI()
    pages = [defaults.openapi_url, defaults.docs_url, defaults.swagger_ui_oauth2_redirect_url, defaults.redoc_url]
    requests = [*routes, *(("GET", page) for page in pages), ("GET", "/no-such-path")]
    answers = {(method, path): answer_status(root + path, method) for method, path in requests}
    assert ("POST", "/v1/completions") in answers
    assert set(answers.values()) == {401}, {request: status for request, status in answers.items() if status != 401}
    assert answer_status(root + "/-/healthz") == 200


def models_status(server, key: str) -> int:
    request = urllib.request.Request(server.base_url + "/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def seconds_until(server, key: str, status: int, deadline_s: float) -> float | None:
    """Seconds until ``key`` gets ``status`` from /v1/models, or None past ``deadline_s``."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if models_status(server, key) == status:
            return round(time.monotonic() - started, 2)
        time.sleep(0.2)
    return None


def test_a_key_added_is_accepted_and_a_key_removed_refused_without_a_restart(server):
    """As the CSI driver does on the cluster, a key file appears in (and goes from) the running
    ingress's directory: the ingress reads it again within its interval (serve_app/ingress.py)."""
    import secrets

    from serve_app.ingress import RELOAD_INTERVAL_S

    directory = Path(server.status["api_key_file"]).parent
    added = "sk-local-added-" + secrets.token_hex(16)
    replicas = server.replicas()
    # The interval, plus a request's way through a busy two-core machine.
    deadline = RELOAD_INTERVAL_S + 30
    assert models_status(server, added) == 401
    staged = directory / ".key-1.tmp"  # a dot file is never read as a key; renamed whole into place
    staged.write_text(added)
    staged.chmod(0o600)
    staged.rename(directory / "key-1")
    try:
        accepted_after = seconds_until(server, added, 200, deadline)
        assert accepted_after is not None, f"a key added was still refused after {deadline:.0f} s"
        assert models_status(server, server.api_key) == 200
    finally:
        (directory / "key-1").unlink(missing_ok=True)
    refused_after = seconds_until(server, added, 401, deadline)
    assert refused_after is not None, f"a key removed was still accepted after {deadline:.0f} s"
    assert models_status(server, server.api_key) == 200
    assert server.replicas() == replicas  # the same replicas: nothing was restarted
    report_measurement(
        "api-key-reload",
        {
            "reload_interval_s": RELOAD_INTERVAL_S,
            "key_added_accepted_after_s": accepted_after,
            "key_removed_refused_after_s": refused_after,
        },
    )
