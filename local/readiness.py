"""Waiting until the app is ready: one chat completion went through it (in disaggregated mode
prefill, then decode with the prompt's KV over NIXL). Until then ``/v1/models`` may already answer
while completions still time out. A deployment that fails on the way fails the start, with the
first error line of its replica's log."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

from local import ray_internals
from local.errors import StartupFailure
from serve_app.spec import ServingSpec

_ERROR_LINE = re.compile(r"(\b\w*(Error|Exception)\b:|\bTraceback\b|\bFAILED\b|Address already in use)")


def first_error_line(deployment: str) -> str | None:
    """The first error a replica of ``deployment`` logged: its Serve log, then its worker's stderr."""
    for path in ray_internals.replica_log_files(deployment):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [line.strip() for line in lines if _ERROR_LINE.search(line) and "Traceback" not in line]
        if hits:
            return hits[0][:300]
    return None


def unhealthy_deployments(app_name: str) -> tuple[list[str], list[str]]:
    """(failed, not yet healthy) deployments of the app, each 'name (status: message)'."""
    from ray import serve

    status = serve.status().applications.get(app_name)
    if status is None:
        return [], [f"application {app_name} (not deployed yet)"]
    failed, pending = [], []
    app_state = str(status.status).rsplit(".", 1)[-1]
    if app_state == "DEPLOY_FAILED" and not status.deployments:
        failed.append(
            f"application {app_name} ({status.message.strip().splitlines()[0] if status.message else 'deploy failed'})"
        )
    elif app_state != "RUNNING" and not status.deployments:
        pending.append(f"application {app_name} ({app_state})")
    for name, deployment in status.deployments.items():
        state = str(deployment.status).rsplit(".", 1)[-1]
        if state == "HEALTHY":
            continue
        line = f"{name} ({state}{': ' + deployment.message.strip().splitlines()[0] if deployment.message else ''})"
        (failed if state in ("UNHEALTHY", "DEPLOY_FAILED") else pending).append(line)
    return failed, pending


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def models_listed(base_url: str, api_key: str | None = None) -> bool:
    try:
        request = urllib.request.Request(f"{base_url}/models", headers=_auth(api_key))
        with urllib.request.urlopen(request, timeout=5) as response:
            return bool(json.loads(response.read())["data"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


def chat_once(
    base_url: str, model: str, timeout: float, api_key: str | None = None, min_prompt_tokens: int = 0
) -> str | None:
    """None if one chat completion (with logprobs) succeeds, else what went wrong. ``min_prompt_tokens``: the prompt
    is at least that long (each added word is a token or more), so that selective P/D sends it
    through prefill."""
    padding = " ready" * min_prompt_tokens
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"ready check {time.time_ns()}{padding}"}],
            "max_tokens": 2,
            "temperature": 0,
            # vLLM compiles its logprobs kernel in each engine at the first request with logprobs
            # (seconds on this CPU): ready means that first one was this.
            "logprobs": True,
            "top_logprobs": 1,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json", **_auth(api_key)}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return None if json.loads(response.read())["choices"] else "an answer without choices"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return str(exc)


def kv_arrived(metrics_url: str, before: dict, timeout: float = 20) -> bool:
    """Whether decode took a prompt's KV over NIXL since ``before`` (vLLM's per-engine counters)."""
    from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta, engine_counters, scrape

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = engine_counters(scrape(metrics_url), ray_internals.serve_replicas())
        if counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") > 0:
            return True
        time.sleep(1)
    return False


def wait_until_ready(
    spec: ServingSpec, base_url: str, metrics_url: str, deadline: float, api_key: str | None = None
) -> dict:
    """Returns once one chat completion went through the app (and, P/D, its KV through NIXL);
    ``api_key`` is the run's, when its ingress asks for one."""
    from local.metrics import engine_counters, scrape

    models_at, last = None, "no deployment healthy yet"
    while True:
        if models_at is None and models_listed(base_url, api_key):
            models_at = time.monotonic()  # what a client polling /v1/models would take for "up"
        failed, pending = unhealthy_deployments(spec.app_name)
        if failed:
            raise StartupFailure(_failure("failed during start-up", failed))
        if time.monotonic() > deadline:
            if pending:
                raise StartupFailure(_failure("is not ready within the ready timeout", pending))
            raise StartupFailure(
                f"every deployment is healthy, but no chat completion went through within the ready timeout "
                f"(last attempt: {last})"
            )
        if not pending:
            before = (
                engine_counters(scrape(metrics_url), ray_internals.serve_replicas())
                if spec.mode == "disaggregated"
                else {}
            )
            last = chat_once(
                base_url,
                spec.model.model_id,
                timeout=spec.request_timeout_s + 5,
                api_key=api_key,
                min_prompt_tokens=spec.pd_min_prompt_tokens if spec.selective else 0,
            )
            if last is None:
                if spec.mode != "disaggregated" or kv_arrived(metrics_url, before):
                    return {"models_at": models_at or time.monotonic()}
                last = "the completion succeeded, but decode took no KV over NIXL (it computed the prompt itself)"
        time.sleep(1)


def _failure(what: str, deployments: list[str]) -> str:
    lines = []
    for entry in deployments:
        name = entry.split(" (", 1)[0]
        error = first_error_line(name) if not name.startswith("application") else None
        lines.append(f"  {entry}" + (f"\n    first error in its replica log: {error}" if error else ""))
    return f"the Serve app {what}:\n" + "\n".join(lines)
