"""`make verify`'s checks on outputs recorded from a cluster, and its CLI replaying a recording."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import RAYSERVICE_CRD, best_schema_error, checked_schema_validator
from verify import checks
from verify.kube import KubectlRunner, KubeError, RecordedKube, RecordingKube

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "verify"
HEALTHY = FIXTURES / "healthy"
CRD = RAYSERVICE_CRD
PREFILL_POD = "pd-llm-xk2vd-prefill-gpu-worker-7x9qz"
DECODE_POD = "pd-llm-xk2vd-decode-gpu-worker-m4k2p"
KUBE = RecordedKube(HEALTHY)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def rayservice() -> dict:
    return KUBE.get_json(["get", "rayservice", "pd-llm", "-n", "llm"])


def pods() -> dict:
    return KUBE.get_json(["get", "pods", "-n", "llm", "-l", checks.RAY_PODS_SELECTOR])


def nodes() -> dict:
    return KUBE.get_json(["get", "nodes"])


def worker_logs() -> dict[str, str]:
    return {pod: KUBE.ray_logs(pod, "llm", checks.WORKER_CONTAINER) for pod in (PREFILL_POD, DECODE_POD)}


def test_ready_rayservice_passes_and_names_the_active_cluster():
    result = checks.rayservice_ready(rayservice(), "llm")
    assert result.passed, result.evidence
    assert "Ready=True (NonZeroServeEndpoints)" in result.evidence
    assert "Decode:qwen2.5-7b-instruct=HEALTHY" in result.evidence
    assert result.data["cluster"] == "pd-llm-xk2vd"


def test_rayservice_not_ready_fails_with_the_reason():
    result = checks.rayservice_ready(load("rayservice_not_ready.json"), "llm")
    assert not result.passed
    assert "Ready=False (ZeroServeEndpoints" in result.evidence
    assert "application llm is DEPLOYING" in result.evidence
    assert "Decode:qwen2.5-7b-instruct=UPDATING" in result.evidence


def test_rayservice_without_the_configured_app_fails():
    result = checks.rayservice_ready(rayservice(), "other")
    assert not result.passed
    assert "'other' not reported (reported: llm)" in result.evidence


@pytest.fixture(scope="module")
def rayservice_status_validator():
    """KubeRay's schema of a RayService's status as a validator (checked_schema_validator)."""
    import yaml

    crd = yaml.load(CRD.read_text(), Loader=yaml.CSafeLoader)
    v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return checked_schema_validator(v1["schema"]["openAPIV3Schema"]["properties"]["status"])


@pytest.mark.parametrize("status_of", [rayservice, lambda: load("rayservice_not_ready.json")])
def test_recorded_rayservice_status_matches_the_kuberay_crd(rayservice_status_validator, status_of):
    error = best_schema_error(rayservice_status_validator, status_of()["status"])
    assert error is None, error


def test_replicas_on_their_node_groups():
    result = checks.replicas_on_their_node_groups(pods(), nodes(), "pd-llm-xk2vd")
    assert result.passed, result.evidence
    assert (
        f"decode-gpu: {DECODE_POD} on ip-10-40-12-77.us-east-2.compute.internal (pd-serving/phase=decode)"
        in result.evidence
    )


def test_decode_pod_on_a_prefill_node_fails():
    result = checks.replicas_on_their_node_groups(load("pods_decode_on_prefill_node.json"), nodes())
    assert not result.passed
    assert (
        f"{DECODE_POD} on ip-10-40-12-34.us-east-2.compute.internal (pd-serving/phase=prefill), expected decode"
        in result.evidence
    )


def test_pods_of_another_ray_cluster_are_not_counted():
    result = checks.replicas_on_their_node_groups(pods(), nodes(), "pd-llm-old")
    assert not result.passed
    assert "prefill-gpu: no running pod" in result.evidence


def test_efa_allocated():
    result = checks.efa_allocated(pods())
    assert result.passed, result.evidence
    assert f"{PREFILL_POD}: vpc.amazonaws.com/efa=1, nvidia.com/gpu=1, Running" in result.evidence


def test_workers_without_efa_fail():
    result = checks.efa_allocated(load("pods_without_efa.json"))
    assert not result.passed
    assert f"{DECODE_POD} requests no vpc.amazonaws.com/efa" in result.evidence


def test_nixl_on_the_efa_provider_passes():
    result = checks.nixl_uses_efa(worker_logs())
    assert result.passed, result.evidence
    assert "Discovered 1 EFA devices" in result.evidence


def test_nixl_tcp_fallback_fails_with_the_log_line():
    logs = {**worker_logs(), DECODE_POD: (FIXTURES / "logs_tcp_fallback.txt").read_text()}
    result = checks.nixl_uses_efa(logs)
    assert not result.passed
    assert f"{DECODE_POD} fell back:" in result.evidence and "(TCP fallback)" in result.evidence


def test_nixl_without_provider_lines_fails_with_a_hint():
    result = checks.nixl_uses_efa({PREFILL_POD: "Ray runtime started.\n"})
    assert not result.passed
    assert "NIXL_LOG_LEVEL=INFO" in result.evidence


def counters(prefill_local, decode_external, decode_local, transfers) -> checks.Counters:
    metric = "ray_vllm_prompt_tokens_by_source_total"
    return {
        ("Prefill:tiny-llama", metric, "local_compute"): prefill_local,
        ("Decode:tiny-llama", metric, "external_kv_transfer"): decode_external,
        ("Decode:tiny-llama", metric, "local_compute"): decode_local,
        ("Decode:tiny-llama", "ray_vllm_nixl_xfer_time_seconds_count", ""): transfers,
    }


def test_kv_transferred_without_recompute_passes():
    result = checks.kv_transferred(counters(100, 100, 0, 2), counters(220, 220, 0, 3), 120)
    assert result.passed, result.evidence
    assert "decode external_kv_transfer +120, local_compute +0; NIXL transfers +1" in result.evidence


@pytest.mark.parametrize(
    "after, expected",
    [
        (counters(220, 100, 120, 2), "decode recomputed 120 prompt tokens"),
        (counters(220, 220, 0, 2), "no NIXL transfer was counted on decode"),
        (counters(100, 220, 0, 3), "prefill computed 0 of 120 prompt tokens"),
    ],
)
def test_kv_not_transferred_fails(after, expected):
    result = checks.kv_transferred(counters(100, 100, 0, 2), after, 120)
    assert not result.passed
    assert expected in result.evidence


def test_decode_that_only_recomputes_is_named_with_the_stale_peer_and_the_remedy():
    """Prefill computed the prompt, decode received none of it and computed it again: what a stale
    NIXL peer after a prefill restart looks like under load_failure_policy recompute."""
    result = checks.kv_transferred(counters(100, 100, 0, 2), counters(220, 100, 120, 3), 120)
    assert not result.passed
    assert "decode recomputes what prefill computed" in result.evidence
    assert "vLLM issue #49238" in result.evidence and "kubectl delete pod -l ray.io/group=decode-gpu" in result.evidence
    # A transfer that went through is not that alarm.
    partial = checks.kv_transferred(counters(100, 100, 0, 2), counters(220, 220, 10, 3), 120)
    assert "recomputes what prefill computed" not in partial.evidence


def test_phase_counters_attribute_each_scrape_to_its_phase():
    text = (
        "# TYPE ray_vllm_prompt_tokens_by_source_total counter\n"
        'ray_vllm_prompt_tokens_by_source_total{ReplicaId="r1",source="external_kv_transfer"} 46.0\n'
        'ray_vllm_prompt_tokens_by_source_total{ReplicaId="r1",source="local_compute"} 0.0\n'
        'ray_vllm_nixl_xfer_time_seconds_count{ReplicaId="r1"} 1.0\n'
        'ray_serve_num_http_requests_total{route="/"} 3.0\n'
    )
    prefill = 'ray_vllm_prompt_tokens_by_source_total{ReplicaId="r0",source="local_compute"} 46.0\n'
    after = checks.phase_counters({f"Decode/{DECODE_POD}": text, f"Prefill/{PREFILL_POD}": prefill})
    assert checks.kv_transferred({}, after, 46).passed
    assert all(metric.startswith("ray_vllm_") for _, metric, _ in after)


def test_chat_completion_against_nothing_fails_with_the_error():
    result = checks.chat_completion_works("http://127.0.0.1:9/v1", "m", timeout=5)
    assert not result.passed
    assert result.evidence.startswith("POST http://127.0.0.1:9/v1/chat/completions failed: APIConnectionError")


def test_recording_writes_the_files_replay_reads(tmp_path):
    recording = RecordingKube(KUBE, tmp_path)
    recording.get_json(["get", "nodes"])
    recording.ray_logs(DECODE_POD, "llm", checks.WORKER_CONTAINER)
    assert {p.name for p in tmp_path.iterdir()} <= {p.name for p in HEALTHY.iterdir()}
    assert RecordedKube(tmp_path).get_json(["get", "nodes"]) == nodes()
    with pytest.raises(KubeError, match="no recorded output for `kubectl get pods`"):
        RecordedKube(tmp_path).get_json(["get", "pods"])


def test_missing_kubectl_is_a_clear_error():
    runner = KubectlRunner()
    runner.base = ["kubectl-that-is-not-installed"]
    with pytest.raises(KubeError, match="not on PATH"):
        runner.get_json(["get", "nodes"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_wrong_context_is_a_clear_error(tmp_path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeError, match="kubeconfig points at this environment's cluster"):
        KubectlRunner(str(kubeconfig), "pd-dev").get_json(["get", "nodes"])


def test_verify_finds_the_workers_the_manifest_renders():
    """verify looks pods up by the contract's names; the rendered RayService must use the same ones."""
    from config.loader import load_config
    from manifests import contract
    from manifests import ray_service as manifest

    config = load_config(ROOT / "config" / "dev.yaml")
    for phase in contract.PHASES:
        group = manifest.worker_group(config, phase, image="i", service_account="s")
        container = group["template"]["spec"]["containers"][0]
        assert checks.WORKER_GROUPS[group["groupName"]] == phase
        assert container["name"] == checks.WORKER_CONTAINER
        assert checks.EFA_RESOURCE in container["resources"]["limits"]
        assert group["template"]["spec"]["nodeSelector"][checks.PHASE_LABEL] == phase


def verify_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verify", "--config", "config/dev.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_on_a_healthy_recording_passes_every_check():
    done = verify_cli("--recorded", str(HEALTHY))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "PASS RayService ready",
        "PASS rollout state",
        "PASS Ray token authentication",
        "PASS Cluster Autoscaler sees both GPU groups",
        "PASS no worker Pending too long",
        "PASS time to the last new replica",
        "PASS replicas on their node groups",
        "PASS EFA allocated to workers",
        "PASS NIXL uses EFA",
        "PASS chat completion",
        "PASS KV transferred, no recompute",
        "PASS prefix cache hit rate per phase",
        "PASS requests decode served without prefill",
        "PASS KV reads that stalled",
        "PASS EFA inside the GPU workers",
        "PASS SRD between prefill and decode",
        "PASS KV path",
    ]
    assert lines[-1] == "17/17 checks passed"


def test_cli_on_a_broken_recording_fails_the_broken_checks(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(HEALTHY, broken)
    pods_file = broken / "get_pods_-n_llm_-l_ray.io_is-ray-node=yes.json"
    shutil.copy(FIXTURES / "pods_decode_on_prefill_node.json", pods_file)
    decode_log = next(broken.glob(f"exec_{DECODE_POD}_*nixl*.txt"))
    shutil.copy(FIXTURES / "logs_tcp_fallback.txt", decode_log)
    (broken / "endpoint.json").unlink()
    done = verify_cli("--recorded", str(broken))
    assert done.returncode == 1
    out = done.stdout
    assert "PASS RayService ready:" in out and "PASS EFA allocated to workers:" in out
    assert f"FAIL replicas on their node groups: decode-gpu: {DECODE_POD} on" in out
    assert "FAIL NIXL uses EFA:" in out and "(TCP fallback)" in out
    assert "FAIL chat completion: no chat completion was recorded" in out
    assert "FAIL prefix cache hit rate per phase: no ray_vllm_prefix_cache_queries_total was read" in out
    assert "FAIL KV path: did not cross: EFA moved" in out
    assert out.splitlines()[-1] == "11/17 checks passed"


def test_cli_without_a_cluster_answer_exits_2(tmp_path):
    done = verify_cli("--recorded", str(tmp_path))
    assert done.returncode == 2
    assert "no recorded output for `kubectl get rayservice pd-llm -n llm`" in done.stderr


AUTOSCALER_KEYS = (
    ["get", "deployment", checks.AUTOSCALER_NAME, "-n", checks.AUTOSCALER_NAMESPACE],
    ["get", "configmap", checks.AUTOSCALER_STATUS_CONFIGMAP, "-n", checks.AUTOSCALER_NAMESPACE],
)


def autoscaler_parts():
    deployment, configmap = (KUBE.get_json(args) for args in AUTOSCALER_KEYS)
    return deployment, checks.autoscaler_status(configmap)


def test_autoscaler_sees_both_gpu_groups_with_their_configured_sizes():
    deployment, status = autoscaler_parts()
    result = checks.autoscaler_sees_gpu_groups(deployment, status, {"prefill": (1, 2), "decode": (1, 2)})
    assert result.passed, result.evidence
    assert (
        "prefill: eks-EksClusterNodegroupPrefillNodesD823" in result.evidence
        and "min 1 max 2 target 1" in result.evidence
    )


def test_autoscaler_with_other_sizes_or_a_missing_group_fails():
    deployment, status = autoscaler_parts()
    result = checks.autoscaler_sees_gpu_groups(deployment, status, {"prefill": (1, 2), "decode": (0, 4)})
    assert not result.passed
    assert "the config says min 0 max 4 (deploy again?)" in result.evidence
    status["nodeGroups"] = [g for g in status["nodeGroups"] if "Decode" not in g["name"]]
    result = checks.autoscaler_sees_gpu_groups(deployment, status, {"prefill": (1, 2), "decode": (1, 2)})
    assert "no decode node group among" in result.evidence


def test_autoscaler_not_running_fails():
    deployment, status = autoscaler_parts()
    deployment["status"]["availableReplicas"] = 0
    status["autoscalerStatus"] = "Initializing"
    result = checks.autoscaler_sees_gpu_groups(deployment, status, {"prefill": (1, 2), "decode": (1, 2)})
    assert not result.passed
    assert "no available replica" in result.evidence and "status is Initializing" in result.evidence


def test_a_worker_pending_longer_than_a_new_replica_takes_fails():
    now = checks._status_time(autoscaler_parts()[1]["time"])
    assert now == STATUS_TIME
    result = checks.no_worker_pending_too_long(load("pods_worker_pending.json"), now, 285)
    assert not result.passed
    assert "pd-llm-q8t4m-decode-gpu-worker-zz9rt Pending for 1306 s, longer than the 285 s" in result.evidence
    assert "prefill-gpu-worker-ab12c" not in result.evidence  # 108 s is within the estimate
    healthy = checks.no_worker_pending_too_long(pods(), now, 285)
    assert healthy.passed and "no worker pod Pending" in healthy.evidence


def test_cli_reports_a_stuck_worker(tmp_path):
    broken = tmp_path / "stuck"
    shutil.copytree(HEALTHY, broken)
    shutil.copy(FIXTURES / "pods_worker_pending.json", broken / "get_pods_-n_llm_-l_ray.io_is-ray-node=yes.json")
    done = verify_cli("--recorded", str(broken))
    assert "FAIL no worker Pending too long: pd-llm-q8t4m-decode-gpu-worker-zz9rt Pending for 1306 s" in done.stdout


def gated_recording(tmp_path, probe_answer: str) -> Path:
    """The healthy recording with the pods of a gated model and what the token probe printed."""
    from verify.kube import slug

    recording = tmp_path / "gated"
    shutil.copytree(HEALTHY, recording)
    shutil.copy(FIXTURES / "pods_gated.json", recording / "get_pods_-n_llm_-l_ray.io_is-ray-node=yes.json")
    for pod in (PREFILL_POD, DECODE_POD):
        args = ["exec", pod, "-n", "llm", "-c", checks.WORKER_CONTAINER, "--", "sh", "-c", checks.HF_TOKEN_PROBE]
        (recording / f"{slug(args)}.txt").write_text(probe_answer + "\n")
    return recording


def gated_config(tmp_path) -> Path:
    import yaml

    data = yaml.safe_load((ROOT / "config" / "dev.yaml").read_text())
    data["serving"]["model"] = {
        "model_id": "llama-3.1-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": "pd-serving/hf-token",
    }
    path = tmp_path / "gated.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gated_model_token_mounted_in_every_worker_passes_without_printing_it(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "verify",
            "--config",
            str(gated_config(tmp_path)),
            "--recorded",
            str(gated_recording(tmp_path, "present")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(x for x in done.stdout.splitlines() if "Hugging Face token mounted" in x)
    assert line.startswith("PASS Hugging Face token mounted:")
    assert f"{PREFILL_POD}: /var/run/secrets/huggingface/token present, not empty" in line
    # The probe prints one word; nothing from the file can reach the output.
    assert "cat " not in checks.HF_TOKEN_PROBE and "echo present" in checks.HF_TOKEN_PROBE


@pytest.mark.parametrize("answer", ["empty", "missing"])
def test_gated_model_token_empty_or_missing_fails(tmp_path, answer):
    kube = RecordedKube(gated_recording(tmp_path, answer))
    gated_pods = kube.get_json(["get", "pods", "-n", "llm", "-l", checks.RAY_PODS_SELECTOR])
    probes = {pod: answer for pod in (PREFILL_POD, DECODE_POD)}
    result = checks.hf_token_mounted(gated_pods, probes)
    assert not result.passed
    assert f"{DECODE_POD}: /var/run/secrets/huggingface/token {answer}" in result.evidence


def test_worker_without_the_token_volume_fails():
    result = checks.hf_token_mounted(pods(), {PREFILL_POD: "present", DECODE_POD: "present"})
    assert not result.passed and "no secrets-store.csi.k8s.io volume or no HF_TOKEN_PATH" in result.evidence


def rayclusters() -> dict:
    return KUBE.get_json(["get", "rayclusters", "-n", "llm"])


STATUS_TIME = datetime(2026, 11, 30, 17, 59, 58, tzinfo=UTC)


def test_rollout_state_names_the_serving_cluster_and_no_other():
    result = checks.rollout_state(rayservice(), rayclusters(), STATUS_TIME, 120)
    assert result.passed, result.evidence
    assert result.evidence == "serving pd-llm-xk2vd; no other RayCluster"


def test_rollout_under_way_reports_how_far_the_new_cluster_got():
    result = checks.rollout_state(
        load("rayservice_upgrading.json"), load("rayclusters_upgrading.json"), STATUS_TIME, 120
    )
    assert result.passed, result.evidence
    assert "serving pd-llm-xk2vd" in result.evidence
    assert (
        "new cluster pd-llm-q8t4m coming up: 1/2 workers ready, state not ready; Serve app llm DEPLOYING"
        in result.evidence
    )


def test_an_old_cluster_that_outlives_the_deletion_delay_fails():
    result = checks.rollout_state(rayservice(), load("rayclusters_old_left.json"), STATUS_TIME, 120)
    assert not result.passed
    assert "old cluster pd-llm-b7n2c still exists 4798 s after pd-llm-xk2vd became ready" in result.evidence
    fresh = checks.rollout_state(
        rayservice(), load("rayclusters_old_left.json"), datetime(2026, 11, 30, 16, 41, tzinfo=UTC), 120
    )
    assert fresh.passed and "old cluster pd-llm-b7n2c lingers for in-flight requests" in fresh.evidence


def test_time_to_the_last_replica_is_reported_next_to_the_planners_estimate():
    args = ["exec", "pd-llm-xk2vd-head-8tq2w", "-n", "llm", "-c", "ray-head", "--", "sh", "-c", checks.SERVE_STARTS]
    starts = KUBE.text(args)
    result = checks.time_to_last_replica(pods(), starts, {"prefill": 285, "decode": 285}, "pd-llm-xk2vd")
    assert result.passed
    assert result.evidence == (
        f"decode: {DECODE_POD}: 98 s waiting for a node, 86 s to Ready (image pull, Ray), 196 s for Serve's replica "
        "(weights, engine); about 380 s in all, planner estimate 285 s"
    )


def test_a_ray_pod_without_token_authentication_fails_the_check():
    """A RayCluster created before authOptions: its pods have no RAY_AUTH_* (KubeRay injects them at creation)."""
    recorded = pods()
    healthy = checks.ray_token_authentication(recorded)
    assert (
        healthy.passed
        and "3 Ray pod(s) with RAY_AUTH_MODE=token, the token from Secret pd-llm-xk2vd" in healthy.evidence
    )
    for pod in recorded["items"][:1]:
        pod["spec"]["containers"][0]["env"] = [
            e for e in pod["spec"]["containers"][0]["env"] if not e["name"].startswith("RAY_AUTH_")
        ]
    result = checks.ray_token_authentication(recorded)
    assert not result.passed
    assert "pd-llm-xk2vd-head-8tq2w runs without RAY_AUTH_MODE=token" in result.evidence
    assert "raise ray_service.auth_token_generation" in result.evidence


# Prefix-cache reuse per phase --------------------------------------------------------------------

REUSE_HEALTHY, REUSE_REPULLS = FIXTURES / "metrics_reuse_healthy", FIXTURES / "metrics_reuse_decode_repulls"


def scraped(folder: Path) -> checks.Counters:
    """The counters of a recorded scrape of each phase's worker, labelled as `make verify` labels them."""
    return checks.phase_counters(
        {
            f"Prefill/{PREFILL_POD}": (folder / "prefill.prom").read_text(),
            f"Decode/{DECODE_POD}": (folder / "decode.prom").read_text(),
        }
    )


def hit_rate(folder: Path, phase: str) -> float:
    from local.metrics import parse

    def total(name: str) -> float:
        return sum(s.value for s in parse((folder / f"{phase}.prom").read_text()) if s.name == name)

    return total("ray_vllm_prefix_cache_hits_total") / total("ray_vllm_prefix_cache_queries_total")


@pytest.mark.serving  # the names vLLM exports, read from vLLM itself
@pytest.mark.parametrize("folder", [REUSE_HEALTHY, REUSE_REPULLS])
def test_recorded_scrapes_name_only_metrics_vllm_exports(folder):
    from local.metrics import parse
    from tests.vllm_exports import ray_exported

    for phase in ("prefill", "decode"):
        names = {s.name for s in parse((folder / f"{phase}.prom").read_text())}
        assert {"ray_vllm_prefix_cache_hits_total", "ray_vllm_prefix_cache_queries_total"} <= names
        assert names <= ray_exported(), names - ray_exported()


def test_prefix_hit_rate_is_reported_per_phase_and_a_decode_that_keeps_what_it_pulled_passes():
    result = checks.prefix_reuse(scraped(REUSE_HEALTHY))
    assert result.passed, result.evidence
    prefill, decode = hit_rate(REUSE_HEALTHY, "prefill"), hit_rate(REUSE_HEALTHY, "decode")
    assert result.data["rates"] == {"Prefill": pytest.approx(prefill), "Decode": pytest.approx(decode)}
    assert f"prefill {prefill:.0%} of " in result.evidence and f"decode {decode:.0%} of " in result.evidence
    assert "rule: decode below 0.5× prefill's rate while prefill's is at least 20%" in result.evidence


def test_a_decode_that_re_pulls_what_prefill_finds_cached_is_flagged_with_the_remedy():
    result = checks.prefix_reuse(scraped(REUSE_REPULLS))
    prefill, decode = hit_rate(REUSE_REPULLS, "prefill"), hit_rate(REUSE_REPULLS, "decode")
    assert prefill >= checks.REUSE_PREFILL_MIN and decode < prefill * checks.REUSE_DECODE_FRACTION
    assert not result.passed
    assert f"decode re-pulls whole prompts over NIXL turn after turn: prefill finds {prefill:.0%}" in result.evidence
    assert "serving.decode.request_router: session_affinity with an x-session-id per conversation" in result.evidence
    # Either side of the rule's edge, with the recorded prefill: decode's share just above and just under it.
    edge = prefill * checks.REUSE_DECODE_FRACTION
    counters = scraped(REUSE_REPULLS)
    queries = counters[(f"Decode/{DECODE_POD}", "ray_vllm_prefix_cache_queries_total", "")]
    for share, passes in ((edge + 0.001, True), (edge - 0.001, False)):
        counters[(f"Decode/{DECODE_POD}", "ray_vllm_prefix_cache_hits_total", "")] = share * queries
        assert checks.prefix_reuse(counters).passed is passes


def test_without_reuse_on_prefill_there_is_nothing_to_flag():
    counters = scraped(REUSE_REPULLS)
    for dep, name, source in list(counters):
        if name == "ray_vllm_prefix_cache_hits_total":
            counters[(dep, name, source)] = 0.0
    result = checks.prefix_reuse(counters)
    assert result.passed and "prefill 0% of" in result.evidence


def test_the_healthy_recording_is_the_recorded_scrapes():
    record = json.loads((HEALTHY / "endpoint.json").read_text())
    assert {(d, m, s): v for d, m, s, v in record["after"]} == scraped(REUSE_HEALTHY)


def test_cli_flags_a_recording_whose_decode_re_pulls_whole_prompts(tmp_path):
    flagged = tmp_path / "flagged"
    shutil.copytree(HEALTHY, flagged)
    record = json.loads((flagged / "endpoint.json").read_text())
    repulls = scraped(REUSE_REPULLS)
    key = (f"Decode/{DECODE_POD}", "ray_vllm_prefix_cache_hits_total", "")
    for snapshot in (record["before"], record["after"]):
        for row in snapshot:
            if tuple(row[:3]) == key:
                row[3] = repulls[key]
    (flagged / "endpoint.json").write_text(json.dumps(record))
    done = verify_cli("--recorded", str(flagged))
    assert done.returncode == 1
    assert "PASS KV transferred, no recompute" in done.stdout
    assert "FAIL prefix cache hit rate per phase: decode re-pulls whole prompts over NIXL" in done.stdout
    assert done.stdout.splitlines()[-1] == "16/17 checks passed"


def test_requests_decode_served_without_prefill_are_reported_by_reason_and_never_fail():
    # The counter as Ray exports serve_app/pd_decode.py's Serve metric from a decode worker
    # (tests/local/test_local_disaggregated.py reads the same name from the live server).
    text = "\n".join(
        [
            "# TYPE ray_pd_prefill_fallbacks_total counter",
            'ray_pd_prefill_fallbacks_total{application="llm",deployment="Decode:qwen",reason="ActorDiedError",replica="r1"} 3.0',
            'ray_pd_prefill_fallbacks_total{application="llm",deployment="Decode:qwen",reason="no_prefill_replica",replica="r1"} 9.0',
            'ray_vllm_prefix_cache_queries_total{ReplicaId="r1"} 120.0',
        ]
    )
    result = checks.prefill_fallbacks(checks.phase_counters({f"Decode/{DECODE_POD}": text}))
    assert result.passed
    assert result.evidence.startswith(
        "decode served 12 request(s) on its own engine because prefill was gone (3 ActorDiedError, 9 no_prefill_replica)"
    )
    assert "kubectl get pods -l ray.io/group=prefill-gpu" in result.evidence
    quiet = checks.prefill_fallbacks(checks.phase_counters({f"Decode/{DECODE_POD}": text.split("\n")[-1]}))
    assert quiet.passed and quiet.evidence == "decode served no request itself for want of prefill since it started"


def stall_counters(count: float) -> dict:
    # The counter as Ray exports serve_app/kv_wait.py's engine metric from a decode worker
    # (tests/local/test_local_kv_stall.py reads it from a real engine).
    line = f'ray_pd_kv_transfer_stalls_total{{engine="0",model_name="qwen",ReplicaId="r1"}} {count}'
    return checks.phase_counters({f"Decode/{DECODE_POD}": line})


def test_a_kv_read_that_stalls_during_the_check_fails_it_naming_the_log_line():
    result = checks.kv_stalls(stall_counters(2), stall_counters(3))
    assert not result.passed
    assert "ray_pd_kv_transfer_stalls_total +1" in result.evidence
    assert "'KV transfer stalled' names it" in result.evidence


def test_kv_reads_that_stalled_before_the_check_are_reported_and_pass():
    earlier = checks.kv_stalls(stall_counters(3), stall_counters(3))
    assert earlier.passed and earlier.evidence.startswith("no KV read stalled during the check; 3 since decode started")
    none = checks.kv_stalls(stall_counters(0), stall_counters(0))
    assert none.passed and none.evidence == "no KV read stalled during the check"
