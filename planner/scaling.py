"""What scaling costs: each GPU group at its minimum and maximum, room for a NewCluster upgrade, and
how long a new serving replica takes to answer when it needs a new node.

The time to a replica is four steps, each an estimate from a config field (``planner.*``) so that a
measured deploy (``make verify`` prints the last replica's start time) can replace it:

- node boot: EC2 launch to a Ready Kubernetes node;
- image pull: the serving image's compressed layers downloaded, then unpacked, both written to the
  root volume, so at the volume's provisioned throughput (ECR through the VPC endpoint is faster);
- weights: from Hugging Face through the NAT gateway (then on local disk), or streamed from the
  S3 mirror at the node's network rate (Run:ai Model Streamer); and their NAT data-processing cost;
- engine start: vLLM's compile, CUDA graph capture and KV-cache allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from config import catalog
from config.schema import AppConfig, GpuNodeGroupConfig
from serve_app.spec import PHASES, PhaseSpec

GIB = 2**30
GB = 1e9


@dataclass(frozen=True)
class GroupScaling:
    phase: str
    instance_type: str
    min_size: int
    max_size: int
    steady_nodes: int  # what the serving cluster holds at its Serve minimum
    upgrade_nodes: int  # what a NewCluster upgrade holds: the old cluster and the new one
    price_per_hour: float


@dataclass(frozen=True)
class ReplicaTime:
    """Seconds from "Ray wants another worker" to "it serves", for one way of getting the weights."""

    source: str
    node_boot: float
    image_pull: float
    weights: float
    engine_start: float
    nat_gb: float  # bytes through the NAT gateway per new replica (GB)

    @property
    def total(self) -> float:
        return self.node_boot + self.image_pull + self.weights + self.engine_start

    @property
    def nat_cost(self) -> float:
        return self.nat_gb * catalog.NAT_GATEWAY_PER_GB


@dataclass(frozen=True)
class ScalingPlan:
    groups: list[GroupScaling]
    fixed_per_hour: float  # system nodes, NAT, endpoints, control plane
    idle_minutes: int
    replica_times: dict[str, list[ReplicaTime]]  # per phase, the configured source first
    errors: list[str]
    warnings: list[str]

    def per_hour(self, which: str) -> float:
        nodes = {"min": lambda g: g.min_size, "max": lambda g: g.max_size}[which]
        return round(self.fixed_per_hour + sum(nodes(g) * g.price_per_hour for g in self.groups), 4)


def replicas_per_node(group: GpuNodeGroupConfig, spec: PhaseSpec) -> int:
    return max(1, catalog.replicas_per_node(group.instance_type, spec.tensor_parallel_size, spec.gpu_fraction))


def _group_scaling(config: AppConfig, phase: str, spec: PhaseSpec) -> GroupScaling:
    group: GpuNodeGroupConfig = getattr(config.cluster.gpu_node_groups, phase)
    steady = max(group.min_size, math.ceil(spec.min_replicas / replicas_per_node(group, spec)))
    return GroupScaling(
        phase=phase,
        instance_type=group.instance_type,
        min_size=group.min_size,
        max_size=group.max_size,
        steady_nodes=steady,
        upgrade_nodes=2 * steady,
        price_per_hour=catalog.INSTANCES[group.instance_type].price_per_hour,
    )


def replica_times(config: AppConfig, phase: str, weights_bytes: float) -> list[ReplicaTime]:
    """The configured weight source first, then the other, for comparison."""
    settings = config.planner
    group: GpuNodeGroupConfig = getattr(config.cluster.gpu_node_groups, phase)
    facts = catalog.INSTANCES[group.instance_type]
    disk = group.root_volume_throughput_mibps * 2**20
    image = (settings.image_compressed_gib + settings.image_unpacked_gib) * GIB / disk
    hf_rate = min(settings.hf_download_mibps * 2**20, disk)
    s3_rate = (settings.s3_stream_gbps or facts.network_gbps * settings.network_efficiency) * GB / 8
    common = {
        "node_boot": settings.node_boot_seconds,
        "image_pull": image,
        "engine_start": settings.engine_start_seconds,
    }
    hf = ReplicaTime("Hugging Face through NAT", weights=weights_bytes / hf_rate, nat_gb=weights_bytes / GB, **common)
    s3 = ReplicaTime("S3 mirror, streamed", weights=weights_bytes / s3_rate, nat_gb=0.0, **common)
    return [s3, hf] if config.serving.model.is_s3 else [hf, s3]


def scaling_plan(config: AppConfig, *, fixed_per_hour: float, weights_bytes: float) -> ScalingPlan:
    serving = config.serving
    groups_config = config.cluster.gpu_node_groups
    errors: list[str] = []
    warnings: list[str] = []
    if serving.mode == "disaggregated":
        groups = [_group_scaling(config, phase, serving.phase(phase)) for phase in PHASES]
    else:
        # Colocated engines land on either group; each group is planned with the colocated spec.
        groups = [_group_scaling(config, phase, serving.colocated) for phase in PHASES]
    for group in groups:
        field = f"cluster.gpu_node_groups.{group.phase}.max_size"
        if group.max_size < group.upgrade_nodes:
            message = (
                f"{field}={group.max_size} leaves no room for a NewCluster upgrade: the serving cluster holds "
                f"{group.steady_nodes} {group.phase} node(s) and the new one needs {group.steady_nodes} more until "
                f"it takes over; raise max_size to at least {group.upgrade_nodes}, or expect the upgrade to wait "
                "for capacity"
            )
            (errors if config.production else warnings).append(message)
    phases = PHASES if serving.mode == "disaggregated" else ()
    for phase in phases:
        spec, group = serving.phase(phase), getattr(groups_config, phase)
        if spec.min_replicas == 0 and group.min_size > 0:
            warnings.append(
                f"serving.{phase}.min_replicas is 0 but cluster.gpu_node_groups.{phase}.min_size is "
                f"{group.min_size}: the idle node(s) are paid for anyway; set min_size: 0 (and desired_size: 0) to "
                "scale the phase to zero"
            )
    return ScalingPlan(
        groups=groups,
        fixed_per_hour=fixed_per_hour,
        idle_minutes=config.cluster.autoscaling.scale_down_idle_minutes,
        replica_times={phase: replica_times(config, phase, weights_bytes) for phase in PHASES},
        errors=errors,
        warnings=warnings,
    )
