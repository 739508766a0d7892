"""The checks of `make verify`, each a function of parsed data that returns a :class:`CheckResult`.

Only ``chat_completion_works``, ``verify_kv_reuse`` and the snapshot helpers touch the network;
everything else reads JSON that kubectl printed or counters already scraped.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from local.metrics import (
    KV_TRANSFER_STALLS,
    NIXL_TRANSFERS,
    PREFILL_FALLBACKS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS_BY_SOURCE,
    Sample,
    counter_delta,
    engine_counters,
    is_engine_counter,
    parse,
    scrape,
    settled,
)
from manifests.contract import (
    AUTOSCALER_NAME,
    AUTOSCALER_NAMESPACE,
    AUTOSCALER_STATUS_CONFIGMAP,
    EFA_RESOURCE,
    GPU_RESOURCE,
    HEAD_CONTAINER,
    PHASE_LABEL,
    RAY_GROUP_LABEL,
    RAY_PODS_SELECTOR,
    WORKER_CONTAINER,
    WORKER_GROUPS,
    worker_group_name,
)
from manifests.hf_token import CSI_DRIVER
from verify import efa
from verify.kube import Kube, KubeError

# Evidence that NIXL's LIBFABRIC backend runs on the efa provider, and of a fallback. Best effort:
# the wording comes from NIXL's libfabric plugin (INFO level) and libfabric's own log, and changes
# between versions; a pod that logs neither fails with a hint instead of passing silently.
EFA_PROVIDER_PATTERNS = (r"Discovered \d+ EFA devices", r"provider\s*[=:]\s*efa\b")
FALLBACK_PATTERNS = (
    r"TCP fallback",
    r"simplified topology for (tcp|sockets)",
    r"provider\s*[=:]\s*(tcp|sockets)\b",
    r"Backend UCX was instantiated",
)

Counters = dict[tuple[str, str, str], float]

READY, PLACED, EFA, NIXL, CHAT, KV = (
    "RayService ready",
    "replicas on their node groups",
    "EFA allocated to workers",
    "NIXL uses EFA",
    "chat completion",
    "KV transferred, no recompute",
)
AUTOSCALER, PENDING = ("Cluster Autoscaler sees both GPU groups", "no worker Pending too long")
HF_TOKEN = "Hugging Face token mounted"
RAY_AUTH = "Ray token authentication"
ROLLOUT = "rollout state"
REUSE = "prefix cache hit rate per phase"
FALLBACKS = "requests decode served without prefill"
STALLS = "KV reads that stalled"
# Decode re-pulls whole prompts when prefill serves at least this share of its queried prompt tokens
# from its prefix cache and decode less than this fraction of prefill's share. Every block prefill
# hits was computed on an earlier turn and pulled by decode then; a decode that keeps what it
# pulled finds it again (NixlConnector pulls only decode's uncached blocks), so its rate follows
# prefill's. Half leaves room for decode's cache also holding outputs, and for some eviction.
REUSE_PREFILL_MIN = 0.2
REUSE_DECODE_FRACTION = 0.5
REPLICA_TIME = "time to the last new replica"
# Serve's controller logs each replica start with its duration; read on the head pod.
SERVE_STARTS = (
    "grep -h 'started successfully' /tmp/ray/session_latest/logs/serve/controller_*.log 2>/dev/null | tail -n 50"
)
_STARTED = re.compile(
    r"^\w+ (\S+ \S+) .*Replica\(id='([^']+)', deployment='([^']+)'.*started successfully.*after ([0-9.]+)s"
)
# The script prints one word, never the token: whether the file HF_TOKEN_PATH names exists and is
# not empty.
HF_TOKEN_PROBE = 'if [ -s "$HF_TOKEN_PATH" ]; then echo present; elif [ -e "$HF_TOKEN_PATH" ]; then echo empty; else echo missing; fi'


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    evidence: str
    # What later checks or a recording need (the active RayCluster, the prompt length, counters).
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _result(name: str, problems: list[str], facts: list[str], **data: Any) -> CheckResult:
    return CheckResult(name, not problems, "; ".join(problems or facts) or "nothing to show", data)


def rayservice_ready(rayservice: dict, app_name: str | None = None) -> CheckResult:
    """KubeRay v1 status: the Ready condition, the app RUNNING and every deployment HEALTHY."""
    status = rayservice.get("status") or {}
    problems, facts = [], []
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        problems.append("status has no Ready condition (is the KubeRay operator 1.3 or newer running?)")
    elif ready.get("status") == "True":
        facts.append(f"Ready=True ({ready.get('reason', '')})")
    else:
        problems.append(f"Ready={ready.get('status')} ({ready.get('reason', '')}: {ready.get('message', '')})")
    active = status.get("activeServiceStatus") or {}
    apps = active.get("applicationStatuses") or {}
    for app in [app_name] if app_name else sorted(apps) or ["(any)"]:
        state = apps.get(app)
        if state is None:
            problems.append(f"Serve application {app!r} not reported (reported: {', '.join(apps) or 'none'})")
            continue
        if state.get("status") != "RUNNING":
            problems.append(f"application {app} is {state.get('status')}: {state.get('message', '')}".rstrip(": "))
        deployments = state.get("serveDeploymentStatuses") or {}
        unhealthy = [f"{n}={d.get('status')}" for n, d in sorted(deployments.items()) if d.get("status") != "HEALTHY"]
        if unhealthy or not deployments:
            problems.append(f"deployments not HEALTHY: {', '.join(unhealthy) or 'none reported'}")
        else:
            facts.append(f"application {app} RUNNING, {', '.join(f'{n}=HEALTHY' for n in sorted(deployments))}")
    cluster = active.get("rayClusterName")
    if cluster:
        facts.append(f"cluster {cluster}")
    pending = (status.get("pendingServiceStatus") or {}).get("rayClusterName")
    if pending:
        facts.append(f"upgrade to {pending} pending")
    return _result(READY, problems, facts, cluster=cluster)


def worker_pods(pods: dict, cluster: str | None = None) -> dict[str, dict]:
    """Pods of the GPU worker groups (of the active RayCluster, when known), by name."""
    found = {}
    for pod in pods.get("items") or []:
        labels = pod["metadata"].get("labels") or {}
        if labels.get("ray.io/node-type") != "worker" or labels.get("ray.io/group") not in WORKER_GROUPS:
            continue
        if cluster and labels.get("ray.io/cluster") != cluster:
            continue
        found[pod["metadata"]["name"]] = pod
    return found


def _group(pod: dict) -> str:
    return pod["metadata"]["labels"]["ray.io/group"]


def _running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def replicas_on_their_node_groups(pods: dict, nodes: dict, cluster: str | None = None) -> CheckResult:
    phase_of = {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(PHASE_LABEL) for n in nodes.get("items") or []
    }
    workers = worker_pods(pods, cluster)
    problems, facts = [], []
    for group, phase in WORKER_GROUPS.items():
        mine = {name: pod for name, pod in workers.items() if _group(pod) == group}
        if not any(_running(pod) for pod in mine.values()):
            problems.append(f"{group}: no running pod")
        for name, pod in sorted(mine.items()):
            node = (pod.get("spec") or {}).get("nodeName")
            if node is None:
                continue
            got = phase_of.get(node)
            where = f"{name} on {node} ({PHASE_LABEL}={got or 'unset'})"
            if got == phase:
                facts.append(f"{group}: {where}")
            else:
                problems.append(f"{group}: {where}, expected {phase}")
    return _result(PLACED, problems, facts)


def _status_time(text: str) -> datetime | None:
    """The autoscaler's status time, written like Go's time.String ("2026-11-30 18:00:00.1 +0000 UTC")."""
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)? ([+-]\d{4})", text or "")
    if not match:
        return None
    return datetime.strptime(f"{match.group(1)} {match.group(3)}", "%Y-%m-%d %H:%M:%S %z")


def autoscaler_status(configmap: dict) -> dict:
    """The parsed ``status`` of Cluster Autoscaler's status ConfigMap (YAML since 1.30)."""
    import yaml

    text = (configmap.get("data") or {}).get("status") or ""
    try:
        status = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return status if isinstance(status, dict) else {}


def autoscaler_sees_gpu_groups(deployment: dict, status: dict, expected: Mapping[str, tuple[int, int]]) -> CheckResult:
    """The autoscaler runs, and lists each phase's node group with the configured min/max.

    Managed node groups reach the autoscaler as their Auto Scaling groups, named
    ``eks-<node group>-<id>``; the node groups' generated names carry the phase
    (``…PrefillNodes…`` / ``…DecodeNodes…``).
    """
    problems, facts = [], []
    available = (deployment.get("status") or {}).get("availableReplicas") or 0
    if available < 1:
        problems.append(f"deployment {AUTOSCALER_NAME} has no available replica")
    if status.get("autoscalerStatus") != "Running":
        problems.append(
            f"status is {status.get('autoscalerStatus') or 'missing'} (ConfigMap {AUTOSCALER_STATUS_CONFIGMAP})"
        )
    groups = status.get("nodeGroups") or []
    for phase, (low, high) in expected.items():
        mine = [g for g in groups if f"{phase}nodes" in (g.get("name") or "").lower()]
        if not mine:
            problems.append(f"no {phase} node group among {', '.join(g.get('name', '?') for g in groups) or 'none'}")
            continue
        health = mine[0].get("health") or {}
        seen = (health.get("minSize"), health.get("maxSize"))
        line = f"{phase}: {mine[0]['name']} min {seen[0]} max {seen[1]} target {health.get('cloudProviderTarget')}"
        if seen != (low, high):
            problems.append(f"{line}, but the config says min {low} max {high} (deploy again?)")
        else:
            facts.append(line)
    return _result(AUTOSCALER, problems, facts)


def no_worker_pending_too_long(pods: dict, now: datetime, limit_seconds: float) -> CheckResult:
    """No GPU worker pod of any RayCluster waits longer than a new replica should take."""
    problems, facts = [], []
    for name, pod in sorted(worker_pods(pods).items()):
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        waited = (now - created).total_seconds()
        line = f"{name} Pending for {waited:.0f} s"
        if waited > limit_seconds:
            problems.append(
                f"{line}, longer than the {limit_seconds:.0f} s a new replica should take (planner estimate): "
                "no capacity (quota, InsufficientInstanceCapacity, max_size)? see the autoscaler's events"
            )
        else:
            facts.append(f"{line} (within {limit_seconds:.0f} s)")
    return _result(PENDING, problems, facts or [f"no worker pod Pending (limit {limit_seconds:.0f} s)"])


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def rollout_state(rayservice: dict, rayclusters: dict, now: datetime, deletion_delay_seconds: int) -> CheckResult:
    """Which RayCluster serves, whether a NewCluster upgrade is under way and how far it got, and
    that an old cluster goes once KubeRay's deletion delay after the switch is over."""
    name = rayservice["metadata"]["name"]
    status = rayservice.get("status") or {}
    active = (status.get("activeServiceStatus") or {}).get("rayClusterName")
    pending_status = status.get("pendingServiceStatus") or {}
    pending = pending_status.get("rayClusterName")
    owned = {
        c["metadata"]["name"]: c
        for c in rayclusters.get("items") or []
        if any(
            o.get("kind") == "RayService" and o.get("name") == name for o in c["metadata"].get("ownerReferences") or []
        )
    }
    problems, facts = [], []
    if not active or active not in owned:
        problems.append(f"no serving RayCluster (active: {active or 'none'}; clusters: {', '.join(owned) or 'none'})")
    else:
        facts.append(f"serving {active}")
    if pending:
        cluster = owned.get(pending, {})
        cs = cluster.get("status") or {}
        apps = pending_status.get("applicationStatuses") or {}
        app = ", ".join(f"{a} {v.get('status')}" for a, v in sorted(apps.items())) or "not deployed yet"
        facts.append(
            f"new cluster {pending} coming up: {cs.get('readyWorkerReplicas', 0)}/{cs.get('desiredWorkerReplicas', '?')} "
            f"workers ready, state {cs.get('state') or 'not ready'}; Serve app {app}"
        )
    ready_since = _time(((owned.get(active) or {}).get("status") or {}).get("stateTransitionTimes", {}).get("ready"))
    for other, cluster in sorted(owned.items()):
        if other in (active, pending):
            continue
        if cluster["metadata"].get("deletionTimestamp"):
            facts.append(f"old cluster {other} being deleted")
        elif ready_since and (now - ready_since).total_seconds() > deletion_delay_seconds + 60:
            problems.append(
                f"old cluster {other} still exists {int((now - ready_since).total_seconds())} s after {active} became "
                f"ready, longer than rayClusterDeletionDelaySeconds ({deletion_delay_seconds}); see the KubeRay operator's log"
            )
        else:
            facts.append(
                f"old cluster {other} lingers for in-flight requests (deleted {deletion_delay_seconds} s after the switch)"
            )
    if active and not pending and set(owned) == {active}:
        facts.append("no other RayCluster")
    return _result(ROLLOUT, problems, facts)


def _condition_time(pod: dict, kind: str) -> datetime | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return _time(condition.get("lastTransitionTime"))
    return None


def time_to_last_replica(
    pods: dict, serve_starts: str, estimates: Mapping[str, float], cluster: str | None = None
) -> CheckResult:
    """How long the newest GPU worker took from its pod's creation to a serving replica, step by step
    (Kubernetes: waiting for a node, then image and Ray; Serve: weights and engine), next to the
    planner's estimate for a new replica on a new node."""
    facts = []
    workers = {n: p for n, p in worker_pods(pods, cluster).items() if _running(p)}
    if not workers:
        return _result(REPLICA_TIME, [], ["no running GPU worker to time"])
    starts: dict[str, float] = {}
    for line in serve_starts.splitlines():
        match = _STARTED.match(line.strip())
        if match:
            starts[match.group(3).split(":")[0].lower()] = float(match.group(4))
    newest = max(workers.items(), key=lambda item: item[1]["metadata"].get("creationTimestamp", ""))
    name, pod = newest
    phase = WORKER_GROUPS[_group(pod)]
    created = _time(pod["metadata"].get("creationTimestamp"))
    scheduled, ready = _condition_time(pod, "PodScheduled"), _condition_time(pod, "Ready")
    parts = []
    if created and scheduled:
        parts.append(f"{(scheduled - created).total_seconds():.0f} s waiting for a node")
    if scheduled and ready:
        parts.append(f"{(ready - scheduled).total_seconds():.0f} s to Ready (image pull, Ray)")
    total = (ready - created).total_seconds() if created and ready else 0.0
    if phase in starts:
        parts.append(f"{starts[phase]:.0f} s for Serve's replica (weights, engine)")
        total += starts[phase]
    facts.append(
        f"{phase}: {name}: {', '.join(parts) or 'no timestamps'}; about {total:.0f} s in all, planner estimate "
        f"{estimates.get(phase, 0):.0f} s"
    )
    return _result(REPLICA_TIME, [], facts)


def hf_token_mounted(pods: dict, probes: Mapping[str, str], cluster: str | None = None) -> CheckResult:
    """Each running GPU worker mounts the token through the CSI driver and the file is not empty.

    ``probes`` holds what :data:`HF_TOKEN_PROBE` printed in each pod: present, empty or missing."""
    problems, facts = [], []
    for name, pod in sorted(worker_pods(pods, cluster).items()):
        if not _running(pod):
            continue
        spec = pod.get("spec") or {}
        volumes = [v for v in spec.get("volumes") or [] if (v.get("csi") or {}).get("driver") == CSI_DRIVER]
        env = {e.get("name"): e.get("value") for c in spec.get("containers") or [] for e in c.get("env") or []}
        if not volumes or "HF_TOKEN_PATH" not in env:
            problems.append(f"{name}: no {CSI_DRIVER} volume or no HF_TOKEN_PATH")
            continue
        if "HF_TOKEN" in env or "HUGGING_FACE_HUB_TOKEN" in env:
            problems.append(f"{name}: a token variable is set in the pod's environment")
        state = probes.get(name, "not probed").strip()
        if state == "present":
            facts.append(f"{name}: {env['HF_TOKEN_PATH']} present, not empty")
        else:
            problems.append(f"{name}: {env['HF_TOKEN_PATH']} {state} (is the secret's value set? see the pod's events)")
    return _result(HF_TOKEN, problems, facts or ["no running GPU worker"])


def ray_token_authentication(pods: dict, cluster: str | None = None) -> CheckResult:
    """Every Ray pod of the serving cluster runs with Ray's token authentication, as KubeRay's
    authOptions set it up: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the cluster's Secret
    (common/pod.go, SetContainerTokenAuthEnvVars), in the Ray container."""
    problems, secrets = [], set()
    ray_pods = [
        p
        for p in pods.get("items") or []
        if not cluster or (p["metadata"].get("labels") or {}).get("ray.io/cluster") == cluster
    ]
    for pod in ray_pods:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e for e in container.get("env") or []}
        mode = (env.get("RAY_AUTH_MODE") or {}).get("value")
        ref = ((env.get("RAY_AUTH_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        if mode != "token":
            problems.append(f"{name} runs without RAY_AUTH_MODE=token")
        elif ref.get("key") != "auth_token":
            problems.append(f"{name} has RAY_AUTH_MODE=token but no RAY_AUTH_TOKEN from a Secret's auth_token")
        else:
            secrets.add(ref.get("name", "?"))
    if problems:
        problems.append(
            "a RayCluster created before authOptions keeps running without it until it is replaced: make deploy "
            "starts a new cluster with it (raise ray_service.auth_token_generation to force one)"
        )
    if not ray_pods:
        problems.append("no Ray pod of the serving cluster found")
    facts = f"{len(ray_pods)} Ray pod(s) with RAY_AUTH_MODE=token, the token from Secret {', '.join(sorted(secrets))}"
    return _result(RAY_AUTH, problems, [facts])


def _quantity(container: dict, resource: str) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(resource) or (resources.get("requests") or {}).get(resource)
    return int(value or 0)


def efa_allocated(pods: dict, cluster: str | None = None) -> CheckResult:
    """Every GPU worker pod holds at least one EFA device (extended resources are all-or-nothing)."""
    workers = worker_pods(pods, cluster)
    problems, facts = [], []
    for group in WORKER_GROUPS:
        if not any(_group(p) == group for p in workers.values()):
            problems.append(f"{group}: no worker pod")
    for name, pod in sorted(workers.items()):
        containers = (pod.get("spec") or {}).get("containers") or []
        efa = sum(_quantity(c, EFA_RESOURCE) for c in containers)
        gpus = sum(_quantity(c, GPU_RESOURCE) for c in containers)
        phase = (pod.get("status") or {}).get("phase")
        if efa < 1:
            problems.append(f"{name} requests no {EFA_RESOURCE}")
        elif phase != "Running":
            problems.append(f"{name} asks for {EFA_RESOURCE}={efa} but is {phase}")
        else:
            facts.append(f"{name}: {EFA_RESOURCE}={efa}, {GPU_RESOURCE}={gpus}, Running")
    return _result(EFA, problems, facts)


def _first_line(patterns: tuple[str, ...], text: str) -> str | None:
    for line in text.splitlines():
        if any(re.search(p, line, re.IGNORECASE) for p in patterns):
            return line.strip()[:160]
    return None


def nixl_uses_efa(logs: Mapping[str, str]) -> CheckResult:
    """``logs`` maps each worker pod to its log text; every pod must show efa and no fallback."""
    problems, facts = [], []
    if not logs:
        problems.append("no worker logs to read")
    for pod, text in sorted(logs.items()):
        fallback = _first_line(FALLBACK_PATTERNS, text)
        efa = _first_line(EFA_PROVIDER_PATTERNS, text)
        if fallback:
            problems.append(f"{pod} fell back: {fallback!r}")
        elif not efa:
            problems.append(
                f"{pod}: no log line names the efa provider (NIXL logs it at INFO; set NIXL_LOG_LEVEL=INFO)"
            )
        else:
            facts.append(f"{pod}: {efa!r}")
    return _result(NIXL, problems, facts)


def unique_prompt() -> str:
    # A fresh prefix keeps both engines' prefix caches out of the measurement.
    return f"verify {uuid.uuid4().hex}: in two sentences, say why a KV cache speeds up decoding."


def judge_chat(response: Mapping[str, Any]) -> CheckResult:
    """A chat completion response (``ChatCompletion.model_dump()``) or ``{"error": "..."}``."""
    if "error" in response:
        return CheckResult(CHAT, False, str(response["error"]), {"response": dict(response)})
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    usage = response.get("usage") or {}
    prompt_tokens, completion_tokens = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    passed = message.get("role") == "assistant" and completion_tokens >= 1
    evidence = (
        f"{response.get('model')}: {prompt_tokens} prompt + {completion_tokens} completion tokens, "
        f"finish_reason={choice.get('finish_reason')}, reply {(message.get('content') or '')[:40]!r}"
    )
    return CheckResult(CHAT, passed, evidence, {"response": dict(response), "prompt_tokens": prompt_tokens})


def chat_completion_works(
    base_url: str,
    model: str,
    *,
    prompt: str | None = None,
    max_tokens: int = 16,
    timeout: float = 120,
    api_key: str | None = None,
) -> CheckResult:
    """One chat completion through the OpenAI endpoint at ``base_url`` (ending in /v1), with the
    endpoint's API key when it asks for one."""
    try:
        import openai
    except ImportError:
        return judge_chat({"error": "the openai package is not installed in this environment"})
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=0)
    try:
        response = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt or unique_prompt()}],
            max_tokens=max_tokens,
            temperature=0,
        )
    except openai.AuthenticationError as exc:
        fix = (
            "API_KEY is not the key of any secret in ray_service.endpoint.api_key_secrets"
            if api_key
            else "the endpoint asks for an API key (ray_service.endpoint.api_key_secrets): run make verify API_KEY=…"
        )
        return judge_chat({"error": f"POST {base_url}/chat/completions: HTTP {exc.status_code}; {fix}"})
    except openai.OpenAIError as exc:
        return judge_chat({"error": f"POST {base_url}/chat/completions failed: {type(exc).__name__}: {exc}"})
    return judge_chat(response.model_dump())


def kv_transferred(before: Counters, after: Counters, prompt_tokens: int) -> CheckResult:
    """Prefill computed the prompt, decode received it over NIXL and computed none of it itself."""

    def delta(prefix: str, metric: str, source: str = "") -> float:
        return counter_delta(before, after, prefix, metric, source)

    prefilled = delta("Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute")
    received = delta("Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
    recomputed = delta("Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute")
    transfers = delta("Decode", NIXL_TRANSFERS)
    problems = []
    if prompt_tokens < 1:
        problems.append("no prompt was sent")
    if prefilled < prompt_tokens:
        problems.append(f"prefill computed {prefilled:g} of {prompt_tokens} prompt tokens")
    if received < prompt_tokens:
        problems.append(f"decode received {received:g} of {prompt_tokens} prompt tokens over external_kv_transfer")
    if recomputed:
        problems.append(f"decode recomputed {recomputed:g} prompt tokens (local_compute)")
    if recomputed and received < prompt_tokens and prefilled >= prompt_tokens:
        # Prefill did its part and decode computed the prompt again: the transfer failed and
        # kv_transfer.load_failure_policy recompute turned that into slow serving.
        problems.append(
            "decode recomputes what prefill computed: after a prefill restart decode may still hold the old "
            "prefill's NIXL peer (vLLM issue #49238); restart the decode workers "
            "(kubectl delete pod -l ray.io/group=decode-gpu in the serving namespace)"
        )
    if transfers < 1:
        problems.append("no NIXL transfer was counted on decode")
    facts = (
        f"prompt {prompt_tokens} tokens; prefill local_compute +{prefilled:g}; decode "
        f"external_kv_transfer +{received:g}, local_compute +{recomputed:g}; NIXL transfers +{transfers:g}"
    )
    return CheckResult(
        KV,
        not problems,
        "; ".join(problems) + (f" ({facts})" if problems else facts),
        {"before": before, "after": after, "prompt_tokens": prompt_tokens},
    )


def prefix_reuse(counters: Counters) -> CheckResult:
    """Each phase's prefix-cache hit rate over its engines' lifetime (vLLM's prefix_cache_hits over
    prefix_cache_queries, both in tokens); fails where decode re-pulls what prefill finds cached."""

    def total(prefix: str, metric: str, source: str = "") -> float:
        return sum(
            v for (dep, name, src), v in counters.items() if dep.startswith(prefix) and name == metric and src == source
        )

    rates: dict[str, float] = {}
    facts, problems = [], []
    for phase in ("Prefill", "Decode"):
        queries, hits = total(phase, PREFIX_CACHE_QUERIES), total(phase, PREFIX_CACHE_HITS)
        if not any(dep.startswith(phase) and name == PREFIX_CACHE_QUERIES for dep, name, _ in counters):
            # Ray exports a counter once it first moves: none means no request met a prefix cache there.
            problems.append(
                f"no {PREFIX_CACHE_QUERIES} was read from {phase.lower()}: its engines served no request with "
                "prefix caching on (serving.prefix_caching)"
            )
            continue
        if queries:
            rates[phase] = hits / queries
            facts.append(f"{phase.lower()} {hits / queries:.0%} of {queries:,.0f} queried prompt tokens")
        else:
            facts.append(f"{phase.lower()} no prompt queried yet")
    rule = (
        f"rule: decode below {REUSE_DECODE_FRACTION:g}× prefill's rate while prefill's is at least "
        f"{REUSE_PREFILL_MIN:.0%} means decode pulls whole prompts again"
    )
    prefill, decode = rates.get("Prefill"), rates.get("Decode")
    if prefill is not None and decode is not None and prefill >= REUSE_PREFILL_MIN:
        if decode < prefill * REUSE_DECODE_FRACTION:
            pulled = total("Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
            problems.append(
                f"decode re-pulls whole prompts over NIXL turn after turn: prefill finds {prefill:.0%} of each "
                f"prompt in its cache, decode {decode:.0%}"
                + (f" ({pulled:,.0f} prompt tokens pulled)" if pulled else "")
                + "; send a conversation's turns to the decode replica that holds its history "
                "(serving.decode.request_router: session_affinity with an x-session-id per conversation, or "
                "prefix_affinity) and check decode's KV cache is not evicting it "
                "(ray_vllm_kv_cache_usage_perc)"
            )
    evidence = "; ".join(problems + facts) + f" ({rule})"
    return CheckResult(REUSE, not problems, evidence, {"rates": rates})


def prefill_fallbacks(counters: Counters) -> CheckResult:
    """How many requests decode served on its own engine because prefill was gone, by reason, since
    decode's replicas started: a fact, not a failure (each such request was answered)."""
    reasons: dict[str, float] = defaultdict(float)
    for (_, name, reason), value in counters.items():
        if name == PREFILL_FALLBACKS and value:
            reasons[reason or "unknown"] += value
    if not reasons:
        return CheckResult(FALLBACKS, True, "decode served no request itself for want of prefill since it started")
    listed = ", ".join(f"{count:,.0f} {reason}" for reason, count in sorted(reasons.items()))
    return CheckResult(
        FALLBACKS,
        True,
        f"decode served {sum(reasons.values()):,.0f} request(s) on its own engine because prefill was gone ({listed}) "
        "since it started: prefill replicas died or were all replaced at once; kubectl get pods -l "
        f"{RAY_GROUP_LABEL}={worker_group_name('prefill')} shows their restarts",
        {"reasons": dict(reasons)},
    )


def kv_stalls(before: Counters, after: Counters) -> CheckResult:
    """KV reads decode failed for making no progress (serve_app/kv_wait.py): one during the check's own
    request fails the check; earlier ones since decode started are reported, as each was served."""
    total = {
        label: sum(value for (_, name, _), value in counters.items() if name == KV_TRANSFER_STALLS)
        for label, counters in (("before", before), ("after", after))
    }
    during = total["after"] - total["before"]
    if during > 0:
        return CheckResult(
            STALLS,
            False,
            f"decode's KV read for the check's request made no progress for kv_transfer.stall_timeout_s and was "
            f"failed ({KV_TRANSFER_STALLS} +{during:,.0f}): the prefill it pulled from never answered; decode's engine "
            "log line 'KV transfer stalled' names it (docs/troubleshooting.md, \"The KV path\")",
            {"during": during, "total": total["after"]},
        )
    since = (
        f"; {total['after']:,.0f} since decode started, each served by load_failure_policy (decode's log names "
        "the peers)"
        if total["after"]
        else ""
    )
    return CheckResult(STALLS, True, f"no KV read stalled during the check{since}", {"total": total["after"]})


def engine_snapshot(metrics_url: str, replicas: Mapping[str, str]) -> Counters:
    """Counters of one metrics endpoint whose replica ids ``replicas`` maps to deployments."""
    return engine_counters(scrape(metrics_url), dict(replicas))


def _by_label(samples: Mapping[str, list[Sample]]) -> Counters:
    totals: Counters = defaultdict(float)
    for label, found in samples.items():
        for sample in found:
            if is_engine_counter(sample.name):
                totals[(label, sample.name, sample.labels.get("source", sample.labels.get("reason", "")))] += (
                    sample.value
                )
    return dict(totals)


def phase_counters(texts: Mapping[str, str]) -> Counters:
    """Counters from Prometheus texts keyed by deployment label ("Decode/<pod>").

    On the cluster each worker pod's metrics port shows only its own node's engines, so where a
    text was scraped says which phase it belongs to; no replica map is needed.
    """
    return _by_label({label: parse(text) for label, text in texts.items()})


def phase_snapshot(metrics_urls: Mapping[str, str]) -> Counters:
    """:func:`phase_counters` of metrics URLs keyed by deployment label."""
    return _by_label({label: scrape(url) for label, url in metrics_urls.items()})


def verify_kv_reuse(
    base_url: str,
    model: str,
    snapshot: Callable[[], Counters],
    *,
    timeout: float = 60,
    poll: float = 2.0,
    api_key: str | None = None,
) -> list[CheckResult]:
    """One chat completion, then its KV transfer read from the counters ``snapshot`` returns.

    Assumes no other traffic: another request's prompt would show up in the same counters.
    """
    before = settled(snapshot, poll, timeout)
    chat = chat_completion_works(base_url, model, api_key=api_key)
    if not chat.passed:
        return [
            chat,
            CheckResult(KV, False, "no completion, so no transfer to measure"),
            prefix_reuse(before),
            prefill_fallbacks(before),
            kv_stalls(before, before),
        ]
    deadline = time.monotonic() + timeout
    while True:
        after = snapshot()
        result = kv_transferred(before, after, chat.data["prompt_tokens"])
        if result.passed or time.monotonic() > deadline:
            return [chat, result, prefix_reuse(after), prefill_fallbacks(after), kv_stalls(before, after)]
        time.sleep(poll)


def endpoint_record(results: list[CheckResult]) -> dict:
    """The chat response and counters behind the endpoint checks, as JSON for a recording."""
    by_name = {r.name: r.data for r in results}
    return {
        "chat": by_name.get(CHAT, {}).get("response", {}),
        **{key: [[*k, v] for k, v in sorted(by_name.get(KV, {}).get(key, {}).items())] for key in ("before", "after")},
    }


def replay_endpoint(record: Mapping[str, Any]) -> list[CheckResult]:
    chat = judge_chat(record.get("chat") or {"error": "no chat completion was recorded"})
    counters = {key: {(d, m, s): v for d, m, s, v in record.get(key, [])} for key in ("before", "after")}
    return [
        chat,
        kv_transferred(counters["before"], counters["after"], chat.data.get("prompt_tokens", 0)),
        prefix_reuse(counters["after"]),
        prefill_fallbacks(counters["after"]),
        kv_stalls(counters["before"], counters["after"]),
    ]


def run_all(
    kube: Kube,
    *,
    namespace: str,
    name: str,
    app_name: str,
    endpoint: Callable[[dict[str, str]], list[CheckResult]],
    gpu_groups: Mapping[str, tuple[int, int]],
    replica_estimates: Mapping[str, float],
    gated: bool = False,
    deletion_delay_seconds: int = 120,
    kv_backend: str = "LIBFABRIC",
) -> list[CheckResult]:
    """Every check; ``endpoint`` gets the running worker pods ({pod: phase}) and runs the last three.

    ``gpu_groups`` is the configured (min, max) of each phase's node group; ``replica_estimates`` the
    planner's time to a new replica of each phase, which is also as long as a worker pod may wait for
    a node; ``gated`` adds the token check; an old RayCluster may outlive the switch by
    ``deletion_delay_seconds``. With ``kv_backend`` LIBFABRIC each worker container's EFA device is probed
    before the endpoint's request, and its counters read again after it (verify/efa.py)."""
    rayservice = kube.get_json(["get", "rayservice", name, "-n", namespace])
    ready = rayservice_ready(rayservice, app_name)
    cluster = ready.data.get("cluster")
    pods = kube.get_json(["get", "pods", "-n", namespace, "-l", RAY_PODS_SELECTOR])
    nodes = kube.get_json(["get", "nodes"])
    running = {n: WORKER_GROUPS[_group(p)] for n, p in worker_pods(pods, cluster).items() if _running(p)}
    logs = {}
    for pod in sorted(running):
        try:
            logs[pod] = kube.logs(pod, namespace, WORKER_CONTAINER) + kube.ray_logs(pod, namespace, WORKER_CONTAINER)
        except KubeError as exc:
            logs[pod] = f"(logs unreadable: {exc})"
    deployment = kube.get_json(["get", "deployment", AUTOSCALER_NAME, "-n", AUTOSCALER_NAMESPACE])
    status = autoscaler_status(
        kube.get_json(["get", "configmap", AUTOSCALER_STATUS_CONFIGMAP, "-n", AUTOSCALER_NAMESPACE])
    )
    # The autoscaler's own clock (its last status write) dates a recording consistently.
    now = _status_time(status.get("time", "")) or datetime.now(UTC)
    token = []
    if gated:
        probes = {}
        for pod in sorted(running):
            try:
                probes[pod] = kube.text(
                    ["exec", pod, "-n", namespace, "-c", WORKER_CONTAINER, "--", "sh", "-c", HF_TOKEN_PROBE]
                )
            except KubeError as exc:
                probes[pod] = f"not readable ({exc})"
        token = [hf_token_mounted(pods, probes, cluster)]
    rollout = rollout_state(
        rayservice, kube.get_json(["get", "rayclusters", "-n", namespace]), now, deletion_delay_seconds
    )
    heads = [
        p["metadata"]["name"]
        for p in pods.get("items") or []
        if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "head"
        and (not cluster or (p["metadata"].get("labels") or {}).get("ray.io/cluster") == cluster)
    ]
    try:
        serve_starts = (
            kube.text(["exec", heads[0], "-n", namespace, "-c", HEAD_CONTAINER, "--", "sh", "-c", SERVE_STARTS])
            if heads
            else ""
        )
    except KubeError:
        serve_starts = ""
    timing = time_to_last_replica(pods, serve_starts, replica_estimates, cluster)
    efa_checks: list[CheckResult] = []
    served = endpoint_after = None
    if kv_backend == "LIBFABRIC":
        probes = {pod: _exec(kube, pod, namespace, efa.NODE_SCRIPT) for pod in sorted(running)}
        reach = _srd_reachable(kube, namespace, running, pods)
        served = endpoint(running)
        endpoint_after = {pod: _exec(kube, pod, namespace, efa.COUNTERS_SCRIPT) for pod in sorted(running)}
        nodes_finding = efa.efa_in_workers(probes)
        kv = next((r for r in served if r.name == KV), None)
        received = (
            counter_delta(
                kv.data["before"], kv.data["after"], "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer"
            )
            if kv is not None and "before" in kv.data
            else 0.0
        )
        path = efa.kv_path(probes, endpoint_after, running, received)
        efa_checks = [
            CheckResult(efa.EFA_NODES, nodes_finding.passed, nodes_finding.evidence),
            CheckResult(efa.SRD, reach.passed, reach.evidence),
            CheckResult(efa.KV_PATH, path.passed, path.evidence),
        ]
    return [
        ready,
        rollout,
        ray_token_authentication(pods, cluster),
        *token,
        autoscaler_sees_gpu_groups(deployment, status, gpu_groups),
        no_worker_pending_too_long(pods, now, max(replica_estimates.values())),
        timing,
        replicas_on_their_node_groups(pods, nodes, cluster),
        efa_allocated(pods, cluster),
        # UCX moves KV over TCP: nothing of EFA's to check.
        *([nixl_uses_efa(logs)] if kv_backend == "LIBFABRIC" else []),
        *(served if served is not None else endpoint(running)),
        *efa_checks,
    ]


def _srd_reachable(kube: Kube, namespace: str, running: Mapping[str, str], pods: dict) -> efa.Finding:
    """fi_pingpong from the first running decode worker to the first running prefill worker."""
    by_phase = {phase: sorted(p for p, ph in running.items() if ph == phase) for phase in ("prefill", "decode")}
    if not (by_phase["prefill"] and by_phase["decode"]):
        return efa.Finding(False, "no running prefill and decode worker to ping between")
    server, client = by_phase["prefill"][0], by_phase["decode"][0]
    address = next(
        ((p.get("status") or {}).get("podIP") for p in pods.get("items") or [] if p["metadata"]["name"] == server), None
    )
    if not address:
        return efa.Finding(False, f"{server} has no pod IP yet")
    started = _exec(kube, server, namespace, efa.PINGPONG_SERVER)
    if "started" not in started:
        return efa.Finding(False, f"the fi_pingpong server did not start in {server}: {started.strip()[:160]}")
    return efa.srd_reachable(client, server, _exec(kube, client, namespace, efa.pingpong_client(address)))


def _exec(kube: Kube, pod: str, namespace: str, script: str) -> str:
    try:
        return kube.text(["exec", pod, "-n", namespace, "-c", WORKER_CONTAINER, "--", "sh", "-c", script])
    except KubeError as exc:
        return f"(not probed: {exc})"


def render(results: list[CheckResult], out: TextIO) -> int:
    """``PASS|FAIL name: evidence`` per check; the exit code (0 when every check passed)."""
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.evidence}", file=out)
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed}/{len(results)} checks passed", file=out)
    return 1 if failed else 0
