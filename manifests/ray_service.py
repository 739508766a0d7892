"""The RayService and its serve Service as data, built from the config; no CDK here, so tests and
KubeRay's mirrored rules take them alone."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from typing import Any

from config import catalog
from config.schema import AppConfig, RayServiceConfig
from config.token_rotation import GENERATION_ANNOTATION
from config.versions import MODEL_STREAMER_PACKAGES, MODEL_STREAMER_SHA256, MODEL_STREAMER_WHEEL_FILES
from manifests import api_keys, gcs_store, hf_token
from manifests.contract import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    EFA_RESOURCE,
    GCS_PORT,
    GPU_RESOURCE,
    GPU_ROLE,
    HEAD_CONTAINER,
    METRICS_PORT,
    METRICS_PORT_NAME,
    PHASE_LABEL,
    PHASE_RESOURCE,
    PHASES,
    ROLE_LABEL,
    SERVE_PORT,
    STREAMER_WHEELS_PREFIX,
    SYSTEM_NODE_SELECTOR,
    WORKER_CONTAINER,
    gpu_tolerations,
    worker_group_name,
)

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# With rollout: new_cluster, a hash of the Serve config (serve_app's asset URI, named by its content
# hash, and the serving spec) on every pod template: KubeRay hashes pod-template annotations into
# the cluster spec (not RayService annotations, not serveConfigV2), so a change of either starts a
# NewCluster upgrade.
SERVING_REVISION = "pd-serving/serving-revision"
# ray_service.auth_token_generation on every pod template: raising it starts a NewCluster upgrade,
# whose RayCluster gets a Secret of its own with a new token (KubeRay's reconcileAuthSecret).
AUTH_TOKEN_GENERATION = "pd-serving/ray-auth-token-generation"
# Where a streaming worker's init container installs the model streamer; on the Ray container's
# PYTHONPATH, which Ray keeps for every worker process behind a working_dir's path
# (ray/_private/runtime_env/working_dir.py, set_pythonpath_in_context).
MODEL_STREAMER_DIR = "/opt/model-streamer"
# Kubelet, the device plugins, the CNI and kube-proxy need some of each node for themselves.
NODE_RESERVED_CPUS = 4
NODE_MEMORY_SHARE = 0.8


# What the Ray containers give up without a cost: no privilege escalation (no setuid binary runs), and
# the default capabilities a model server never uses (raw sockets, device nodes, chroot, ports
# below 1024, capability and audit changes). Root's file and process capabilities (CHOWN,
# DAC_OVERRIDE, FOWNER, FSETID, KILL, SETUID, SETGID) stay: the image runs as root and what Ray,
# pip and vLLM write as root was not audited for them.
UNUSED_CAPABILITIES = ["AUDIT_WRITE", "MKNOD", "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"]
# A container that only runs one small program drops every capability.
NO_CAPABILITIES = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# The container runtime's default seccomp filter, for pods that run no GPU code (the head, the mirror
# Job); the GPU workers keep the node's default until a GPU node has shown CUDA, NCCL and EFA under it.
RUNTIME_DEFAULT_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}


def ray_container_security(*, add: list[str] | None = None) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"drop": list(UNUSED_CAPABILITIES)}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def _pod_ip_env(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _region_env(config: AppConfig) -> list[dict[str, str]]:
    # EKS Pod Identity supplies credentials, not a region; naming it keeps Ray's S3 downloads
    # (boto3) and the Run:ai streamer (AWS C++ SDK, reads either name) from guessing one.
    return [{"name": name, "value": config.aws.region} for name in ("AWS_REGION", "AWS_DEFAULT_REGION")]


# The serving image's boto3 (Pod Identity credentials, the VPC's S3 gateway endpoint) fetches each
# wheel once: a bounded wait, so an unreachable or empty mirror stops the pod in seconds.
_FETCH_WHEELS = """
import os, sys
import boto3
from botocore.config import Config
bucket, prefix, directory, *names = sys.argv[1:]
s3 = boto3.client("s3", config=Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 2}))
os.makedirs(directory, exist_ok=True)
for name in names:
    s3.download_file(bucket, prefix + "/" + name, os.path.join(directory, name))
"""


def streamer_wheels_location(config: AppConfig) -> tuple[str, str] | None:
    """(bucket, prefix) of the model streamer's wheels when the engines stream from the stack's own
    mirror, which `make mirror-model` fills with them; None when the pods install them from PyPI."""
    model = config.serving.model
    if not (model.streams and model.is_s3 and config.model_mirror.enabled):
        return None
    bucket = model.source.removeprefix("s3://").split("/", 1)[0]
    return (bucket, STREAMER_WHEELS_PREFIX) if bucket == config.mirror_bucket else None


def model_streamer_install_script(
    *,
    wheels_from: tuple[str, str] | None = None,
    target: str = MODEL_STREAMER_DIR,
    scratch: str = "/tmp/model-streamer",
    termination_log: str = "/dev/termination-log",
    pinned: Mapping[str, tuple[str, str]] | None = None,
) -> str:
    """The init container's shell script: pip installs exactly the pinned wheels, each checked against
    its hash, from the stack's mirror bucket (``wheels_from``) or else from PyPI, giving up at once
    when they are out of reach; the reason goes to the termination message, which Kubernetes shows in
    the pod's status. ``pinned`` maps each requirement to its wheel's file name and sha256."""
    pinned = pinned or {
        package: (MODEL_STREAMER_WHEEL_FILES[package], MODEL_STREAMER_SHA256[package])
        for package in MODEL_STREAMER_PACKAGES
    }
    requirements = f"{scratch}/requirements.txt"
    lines = " ".join(shlex.quote(f"{package} --hash=sha256:{sha256}") for package, (_, sha256) in pinned.items())
    pip = [
        "python -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps",
        "--only-binary=:all: --require-hashes",
    ]
    steps = [f"mkdir -p {shlex.quote(scratch)}", f"printf '%s\\n' {lines} > {shlex.quote(requirements)}"]
    if wheels_from:
        bucket, prefix = wheels_from
        wheels = f"{scratch}/wheels"
        steps.append(
            "python -c " + shlex.join([_FETCH_WHEELS, bucket, prefix, wheels, *(name for name, _ in pinned.values())])
        )
        pip.append(f"--no-index --find-links {shlex.quote(wheels)}")
        failure = (
            f"cannot fetch the Run:ai model streamer's wheels from s3://{bucket}/{prefix}/ (run `make mirror-model`, "
            "which puts them there), or a wheel's hash differs from config/versions.py; the pod stops here"
        )
    else:
        pip.append("--retries 0 --timeout 20")
        failure = (
            "cannot install the Run:ai model streamer from PyPI (through the VPC's NAT gateway), or a wheel's hash "
            "differs from config/versions.py; the pod stops here"
        )
    pip.append(f"--target {shlex.quote(target)} -r {shlex.quote(requirements)}")
    steps.append(" ".join(pip))
    log = shlex.quote(termination_log)
    return f"{{ {' && '.join(steps)}; }} || {{ echo {shlex.quote(failure)} | tee {log} >&2; exit 1; }}"


def add_model_streamer(group: dict[str, Any], image: str, *, wheels_from: tuple[str, str] | None = None) -> None:
    """Installs vLLM's Run:ai streamer into the group's pods before Ray starts (the image lacks it)."""
    pod = group["template"]["spec"]
    (container,) = pod["containers"]
    mount = {"name": "model-streamer", "mountPath": MODEL_STREAMER_DIR}
    # Requests equal to limits, as the Ray container's: a Guaranteed pod, which the kubelet evicts last.
    resources = {"cpu": "1", "memory": "1Gi"}
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    env += [e for e in container.get("env", []) if e["name"] in ("AWS_REGION", "AWS_DEFAULT_REGION")]
    pod.setdefault("initContainers", []).append(
        {
            "name": "install-model-streamer",
            "image": image,
            # The serving image's own Python, pip and boto3 (/opt/venv): the wheels from the mirror
            # bucket through the S3 gateway endpoint, or from PyPI through the NAT gateway.
            "command": ["/bin/sh", "-c", model_streamer_install_script(wheels_from=wheels_from)],
            "env": env,
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "securityContext": dict(NO_CAPABILITIES),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [mount],
        }
    )
    pod.setdefault("volumes", []).append({"name": "model-streamer", "emptyDir": {"sizeLimit": "1Gi"}})
    container.setdefault("volumeMounts", []).append({**mount, "readOnly": True})
    container.setdefault("env", []).append({"name": "PYTHONPATH", "value": MODEL_STREAMER_DIR})


def head_group(config: AppConfig, *, image: str, service_account: str) -> dict[str, Any]:
    head = config.ray_service.head
    resources = {"cpu": head.cpu, "memory": head.memory}
    return {
        # The head schedules no replicas (num-cpus 0 and no phase resource: every Serve replica, the
        # ingress included, asks for one or the other): it runs the GCS, the dashboard and the Serve
        # controller, and serves no request.
        "rayStartParams": {"num-cpus": "0", "num-gpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "spec": {
                "serviceAccountName": service_account,
                # The autoscaler sidecar in this pod reads and scales the RayCluster through the
                # Kubernetes API, so the head keeps its service account token (the workers do not).
                "securityContext": dict(RUNTIME_DEFAULT_SECCOMP),
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "containers": [
                    {
                        "name": HEAD_CONTAINER,
                        "securityContext": ray_container_security(),
                        "image": image,
                        "resources": {"requests": resources, "limits": resources},
                        # The NVIDIA container hook fails on nodes without a driver otherwise.
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, *_region_env(config)],
                        "ports": [
                            {"containerPort": GCS_PORT, "name": "gcs-server"},
                            {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
                            {"containerPort": CLIENT_PORT, "name": "client"},
                            {"containerPort": SERVE_PORT, "name": "serve"},
                            {"containerPort": METRICS_PORT, "name": METRICS_PORT_NAME},
                        ],
                        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                    }
                ],
            }
        },
    }


def worker_group(
    config: AppConfig, phase: str, *, image: str, service_account: str, serving_replicas: int | None = None
) -> dict[str, Any]:
    group = getattr(config.cluster.gpu_node_groups, phase)
    facts = catalog.INSTANCES[group.instance_type]
    cpus = max(1, facts.vcpus - NODE_RESERVED_CPUS)
    memory_gib = int(facts.memory_gib * NODE_MEMORY_SHARE)
    # Half of the pod's memory may back /dev/shm: NIXL stages KV blocks there when the buffer
    # device is cpu, and vLLM's workers exchange tensors through it.
    shm_gib = memory_gib // 2
    resources = {
        "cpu": str(cpus),
        "memory": f"{memory_gib}Gi",
        GPU_RESOURCE: str(facts.gpu_count),
        EFA_RESOURCE: str(facts.efa_interfaces),
    }
    side_channel = config.serving.side_channel_port(phase)
    return {
        "groupName": worker_group_name(phase),
        # KubeRay builds a NewCluster upgrade's cluster with these; the serving cluster's own count
        # (Ray's autoscaler's, read by `make deploy`) keeps the capacity that serves. The cluster hash
        # leaves replicas out, so the count never starts an upgrade itself.
        "replicas": group.desired_size
        if serving_replicas is None
        else min(max(serving_replicas, group.min_size), group.max_size),
        "minReplicas": group.min_size,
        "maxReplicas": group.max_size,
        # KubeRay takes a group's Ray resources from rayStartParams or from this map, never both
        # (validateRayGroupResources); the map turns CPU and GPU into --num-cpus/--num-gpus and
        # the phase resource into --resources. Memory comes from the container limit.
        "rayStartParams": {},
        "resources": {"CPU": str(cpus), "GPU": str(facts.gpu_count), PHASE_RESOURCE[phase]: "1"},
        "template": {
            # Ray's autoscaler removes idle worker pods itself; Cluster Autoscaler must not evict
            # a serving worker to pack nodes (it removes a node once Ray has emptied it).
            "metadata": {"annotations": {SAFE_TO_EVICT: "false"}},
            "spec": {
                "serviceAccountName": service_account,
                # Nothing on a worker calls the Kubernetes API; Pod Identity and the CSI driver get
                # tokens of their own (a projected volume, the driver's tokenRequests).
                "automountServiceAccountToken": False,
                "nodeSelector": {ROLE_LABEL: GPU_ROLE, PHASE_LABEL: phase},
                "tolerations": gpu_tolerations(),
                "containers": [
                    {
                        "name": WORKER_CONTAINER,
                        "image": image,
                        "resources": {"requests": resources, "limits": resources},
                        "env": [
                            *kv_transport_env(config.serving.kv_transfer.backend),
                            _pod_ip_env("VLLM_HOST_IP"),
                            *_region_env(config),
                        ],
                        # IPC_LOCK: EFA pins the memory it registers (NIXL's KV buffers, libfabric).
                        "securityContext": ray_container_security(add=["IPC_LOCK"]),
                        "ports": [
                            {"containerPort": side_channel, "name": "nixl-side"},
                            {"containerPort": METRICS_PORT, "name": METRICS_PORT_NAME},
                        ],
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                    }
                ],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}}],
            },
        },
    }


# Pod Security Standards for the serving namespace. Enforced: privileged, the strictest level every
# pod there passes: the GPU workers add IPC_LOCK, which baseline refuses (it allows only the runtime's
# default capabilities), and a namespace's label admits no per-pod exception. Audited and warned:
# baseline, so that anything else that would break it shows (tests/consumers/test_pod_security.py
# lists each pod's level and its violations).
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/audit": "baseline",
    "pod-security.kubernetes.io/audit-version": "latest",
    "pod-security.kubernetes.io/warn": "baseline",
    "pod-security.kubernetes.io/warn-version": "latest",
}


def namespace(rs: RayServiceConfig) -> dict[str, Any]:
    """The serving namespace, labelled for Pod Security admission."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": rs.namespace, "labels": dict(POD_SECURITY_LABELS)},
    }


def serve_service_name(rs: RayServiceConfig) -> str:
    """KubeRay's name for a RayService's serve Service (``GenerateServeServiceName``)."""
    return f"{rs.name}-serve-svc"


def serve_service(rs: RayServiceConfig) -> dict[str, Any] | None:
    """The RayService's ``serveService``: an internal NLB in front of Serve, when the config asks for one."""
    exposure = rs.endpoint
    if not exposure.internal_nlb:
        return None
    return {
        "metadata": {
            "name": serve_service_name(rs),
            "annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-type": "external",
                "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
                "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
            },
        },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerSourceRanges": list(exposure.allowed_cidrs),
            "ports": [{"name": "serve", "port": SERVE_PORT, "targetPort": SERVE_PORT}],
        },
    }


def owned_serve_service(rs: RayServiceConfig) -> dict[str, Any] | None:
    """The NLB's Service as an object of the stack's own, created before the RayService.

    KubeRay would create it owned by the RayService, and deleting the RayService returns before
    the Service's load-balancer finalizer has run; the stack would then delete the controller and
    the nodes, leaving the NLB, its security group and ENIs in the VPC. An existing Service is not
    adopted: KubeRay only replaces its spec (selector included) when it points it at a new
    RayCluster (``reconcileServices`` in rayservice_controller.go, v1.7.0). So the stack owns it,
    with no selector of its own, and deletes it after the RayService with ``kubectl delete``, which
    waits for the finalizer, before the controller and the nodes go.
    """
    service = serve_service(rs)
    if service is None:
        return None
    metadata = {**service["metadata"], "namespace": rs.namespace}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": service["spec"]}


def mount_hf_token(group: dict[str, Any]) -> None:
    """The gated model's token as a file in the group's pods, named by HF_TOKEN_PATH (no value in env)."""
    pod = group["template"]["spec"]
    pod.setdefault("volumes", []).append(hf_token.pod_volume())
    container = pod["containers"][0]
    container.setdefault("volumeMounts", []).append(hf_token.container_mount())
    container.setdefault("env", []).append(hf_token.container_env())


def serving_revision(serve_config_v2: str) -> str:
    return hashlib.sha256(serve_config_v2.encode()).hexdigest()[:16]


# NIXL's transport settings, by backend, and nothing of the other's. LIBFABRIC: EFA's provider, fork-safe
# (Ray forks its workers). UCX: TCP on the pod's own interface (the VPC CNI names it eth0), which keeps UCX
# off EFA's "srd" transport; the fallback when the EFA path fails (docs/troubleshooting.md). The Ray-to-Ray
# network policy and the nodes' security groups already admit TCP between the GPU pods on the ports UCX
# picks (the kernel's ephemeral range, outside the ports the policy keeps closed).
KV_TRANSPORT_ENV: dict[str, dict[str, str]] = {
    "LIBFABRIC": {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"},
    "UCX": {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "eth0"},
}


def kv_transport_env(backend: str) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in KV_TRANSPORT_ENV[backend].items()]


def annotate(group: dict[str, Any], key: str, value: str) -> None:
    metadata = group["template"].setdefault("metadata", {})
    metadata.setdefault("annotations", {})[key] = value


def ray_service(
    config: AppConfig,
    *,
    serve_config_v2: str,
    head_service_account: str,
    worker_service_account: str,
    gcs_store_host: str | None = None,
    gcs_token_generation: int = 1,
    serving_replicas: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The RayService of an environment; ``serve_config_v2`` is the Serve YAML of its spec, the head and
    the GPU workers run as their service accounts (the head's also runs KubeRay's Redis cleanup Job),
    ``gcs_store_host`` the GCS store's primary endpoint (required when GCS fault tolerance is on),
    ``gcs_token_generation`` the store token generation the head starts with (config/token_rotation.py),
    and ``serving_replicas`` each phase's worker replicas in the serving cluster now, when known."""
    rs = config.ray_service
    image = rs.image_for(config.aws.region)
    spec: dict[str, Any] = {
        "serveConfigV2": serve_config_v2,
        # A change to the cluster spec brings up a new RayCluster and moves traffic once its
        # Serve app is healthy; the old one keeps serving in-flight requests for the delay.
        # (NewClusterWithIncrementalUpgrade would need the Gateway API and ignores serveService.)
        "upgradeStrategy": {"type": "NewCluster"},
        "rayClusterDeletionDelaySeconds": config.deletion_delay_seconds,
        # Requests never go through the head: KubeRay keeps its ray.io/serve label false, so the
        # serve Service (and the NLB) reach only the proxies on the workers (updateHeadPodServeLabel,
        # rayservice_controller.go, v1.7.0). Ray 2.58 still starts an idle proxy on the head
        # (serve/_private/controller.py, _update_proxy_nodes adds the controller's node).
        "excludeHeadPodFromServeSvc": True,
        "rayClusterConfig": {
            "rayVersion": rs.ray_version,
            # Ray's token authentication (Ray 2.52+): KubeRay creates a Secret with a random token for
            # each RayCluster (no secretName: raycluster_controller.go, reconcileAuthSecret), puts
            # RAY_AUTH_MODE and RAY_AUTH_TOKEN into the head, the workers, their wait-gcs-ready init
            # containers and the autoscaler sidecar (common/pod.go, SetContainerTokenAuthEnvVars:
            # skipped in a container that sets them itself, which none here does), and sends the token
            # on its own dashboard calls (dashboardclient, x-ray-authorization). The GCS, the raylets,
            # the dashboard and its job and Serve APIs, and the client server then refuse a caller
            # without it; Serve's HTTP proxy and the metrics port stay open (the network policies
            # and the API key cover those). "mode" must be said: an empty one enables nothing.
            "authOptions": {"mode": "token"},
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {
                # Ray 2.58 runs autoscaler v2 under KubeRay whatever the spec says (`ray start --head`
                # sets RAY_enable_autoscaler_v2=1 when KubeRay's variables are present). Saying so
                # lets KubeRay set the pods up for it (common/pod.go: restartPolicy Never), so a
                # worker whose Ray died is replaced, not restarted in place out of the autoscaler's view.
                "version": "v2",
                # Ray drops an idle worker pod after as long as Cluster Autoscaler keeps an idle node.
                "idleTimeoutSeconds": config.cluster.autoscaling.scale_down_idle_minutes * 60,
                # KubeRay gives the sidecar no securityContext of its own (common/pod.go, BuildAutoscalerContainer).
                "securityContext": dict(NO_CAPABILITIES),
            },
            "headGroupSpec": head_group(config, image=image, service_account=head_service_account),
            "workerGroupSpecs": [
                worker_group(
                    config,
                    phase,
                    image=image,
                    service_account=worker_service_account,
                    serving_replicas=(serving_replicas or {}).get(phase),
                )
                for phase in PHASES
            ],
        },
    }
    groups = [spec["rayClusterConfig"]["headGroupSpec"], *spec["rayClusterConfig"]["workerGroupSpecs"]]
    revision = serving_revision(serve_config_v2) if rs.rollout == "new_cluster" else None
    for group in groups:
        if revision:
            annotate(group, SERVING_REVISION, revision)
        annotate(group, AUTH_TOKEN_GENERATION, str(rs.auth_token_generation))
    # Only the engine replicas on the GPU workers read the token (Ray loads the model config there);
    # on the head, a missing or unreadable secret would hold the whole cluster at ContainerCreating.
    if config.serving.model.hf_token_secret:
        for group in spec["rayClusterConfig"]["workerGroupSpecs"]:
            mount_hf_token(group)
    # The keyed ingress runs on a GPU worker (serve_app.spec: never on the head).
    if config.ray_service.endpoint.api_key_secrets:
        for group in spec["rayClusterConfig"]["workerGroupSpecs"]:
            api_keys.mount(group)
            if config.ray_service.endpoint.cache_isolation == "per_key":
                api_keys.mount_salt(group)
    if config.serving.model.streams:
        for group in spec["rayClusterConfig"]["workerGroupSpecs"]:
            add_model_streamer(group, image, wheels_from=streamer_wheels_location(config))
    if config.gcs_fault_tolerant:
        if not gcs_store_host:
            raise ValueError("GCS fault tolerance is on: ray_service() needs the store's host (gcs_store_host)")
        # The GCS keeps its tables in the store; a restarted head reads them back and the workers'
        # raylets reconnect (KubeRay gives them RAY_gcs_rpc_server_reconnect_timeout_s=600).
        options = gcs_store.fault_tolerance_options(gcs_store_host)
        spec["rayClusterConfig"]["gcsFaultToleranceOptions"] = options
        gcs_store.mount_on_head(
            spec["rayClusterConfig"]["headGroupSpec"],
            address=options["redisAddress"],
            ca_bundle=rs.serving_image_facts().ca_bundle,
        )
        # A new generation changes the head's pod template: KubeRay builds a new RayCluster, whose head
        # reads the rotated token. Left out at 1, so that the first generation changes nothing.
        if gcs_token_generation > 1:
            annotate(spec["rayClusterConfig"]["headGroupSpec"], GENERATION_ANNOTATION, str(gcs_token_generation))
    service = serve_service(rs)
    if service:
        spec["serveService"] = service
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": rs.name, "namespace": rs.namespace, "labels": {"app.kubernetes.io/name": rs.name}},
        "spec": spec,
    }
