"""Facts about EC2 instance types and GPUs that synth-time checks and the planner rely on.

Synth never calls a pricing or EC2 API, so the facts live here, dated and sourced. When AWS
changes a price or ships a new type, edit this table (and its date); nothing else hard-codes them.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_AS_OF = "2026-11"
PRICES_REGION = "us-east-1"
PRICES_SOURCE = "https://aws.amazon.com/ec2/pricing/on-demand/ (Linux, on-demand)"
INSTANCE_FACTS_SOURCE = (
    "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (accelerated computing), "
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types"
)


# kubernetes/autoscaler at cluster-autoscaler-1.36.1, cluster-autoscaler/cloudprovider/aws/
# aws_cloud_provider.go: GPULabel and availableGPUTypes, the GPU types its AWS provider knows.
AUTOSCALER_GPU_TYPES_SOURCE = (
    "https://github.com/kubernetes/autoscaler/blob/cluster-autoscaler-1.36.1/"
    "cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go"
)


@dataclass(frozen=True)
class GpuFacts:
    """One GPU model. Peak TFLOPS is dense BF16 tensor throughput from the vendor datasheet.

    ``autoscaler_gpu_type`` is the value of the GPU type in Cluster Autoscaler's AWS provider
    (``availableGPUTypes``, AUTOSCALER_GPU_TYPES_SOURCE), None where that list has none (H100).
    """

    model: str
    memory_gib: float
    peak_bf16_tflops: float
    memory_bandwidth_gbps: float
    autoscaler_gpu_type: str | None


GPUS: dict[str, GpuFacts] = {
    "L4": GpuFacts("L4", 22.5, 121.0, 300.0, "nvidia-l4"),
    "L40S": GpuFacts("L40S", 44.5, 362.0, 864.0, "nvidia-l40s"),
    "A10G": GpuFacts("A10G", 22.0, 70.0, 600.0, "nvidia-a10g"),
    "A100-40GB": GpuFacts("A100-40GB", 40.0, 312.0, 1555.0, "nvidia-tesla-a100"),
    "H100": GpuFacts("H100", 80.0, 989.0, 3350.0, None),
}


@dataclass(frozen=True)
class InstanceFacts:
    """One EC2 instance type.

    ``efa_interfaces`` is the maximum number of EFA interfaces (0: no EFA). ``gpudirect_rdma``
    says whether NIXL can read KV cache straight from GPU memory over EFA; without it the KV
    buffer must be staged in host memory.
    """

    instance_type: str
    vcpus: int
    memory_gib: int
    network_gbps: float
    efa_interfaces: int
    gpu: str | None
    gpu_count: int
    gpudirect_rdma: bool
    price_per_hour: float

    @property
    def gpu_facts(self) -> GpuFacts | None:
        return GPUS[self.gpu] if self.gpu else None

    @property
    def supports_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def autoscaler_gpu_type(self) -> str | None:
        """The value of Cluster Autoscaler's GPU label for this type's GPU (None: no GPU, or none known)."""
        facts = self.gpu_facts
        return facts.autoscaler_gpu_type if facts else None


def _gpu(name, vcpus, mem, gbps, efa, gpu, count, rdma, price):
    return InstanceFacts(name, vcpus, mem, gbps, efa, gpu, count, rdma, price)


INSTANCES: dict[str, InstanceFacts] = {
    f.instance_type: f
    for f in (
        _gpu("g6.xlarge", 4, 16, 10, 0, "L4", 1, False, 0.8048),
        _gpu("g6.2xlarge", 8, 32, 10, 0, "L4", 1, False, 0.9776),
        _gpu("g6.8xlarge", 32, 128, 25, 1, "L4", 1, False, 2.0144),
        _gpu("g6.12xlarge", 48, 192, 40, 1, "L4", 4, False, 4.6016),
        _gpu("g6.16xlarge", 64, 256, 25, 1, "L4", 1, False, 3.3968),
        _gpu("g6.24xlarge", 96, 384, 50, 1, "L4", 4, False, 6.6752),
        _gpu("g6.48xlarge", 192, 768, 100, 1, "L4", 8, False, 13.3504),
        _gpu("g6e.8xlarge", 32, 256, 25, 1, "L40S", 1, False, 4.5286),
        _gpu("g6e.12xlarge", 48, 384, 100, 1, "L40S", 4, False, 10.4926),
        _gpu("g5.8xlarge", 32, 128, 25, 1, "A10G", 1, False, 2.448),
        _gpu("g5.12xlarge", 48, 192, 40, 1, "A10G", 4, False, 5.672),
        _gpu("p4d.24xlarge", 96, 1152, 400, 4, "A100-40GB", 8, True, 21.9576),
        _gpu("p5.48xlarge", 192, 2048, 3200, 32, "H100", 8, True, 55.04),
        InstanceFacts("m7i.xlarge", 4, 16, 12.5, 0, None, 0, False, 0.2016),
        InstanceFacts("m7i.2xlarge", 8, 32, 12.5, 0, None, 0, False, 0.4032),
        InstanceFacts("m7i.4xlarge", 16, 64, 12.5, 0, None, 0, False, 0.8064),
    )
}

# Regional services billed per hour, same source and date as the instance prices.
NAT_GATEWAY_PER_HOUR = 0.045
# NAT gateway data processing, per GB through it (https://aws.amazon.com/vpc/pricing/); a gateway
# endpoint (S3) costs nothing per GB.
NAT_GATEWAY_PER_GB = 0.045
EKS_CONTROL_PLANE_PER_HOUR = 0.10
EKS_EXTENDED_SUPPORT_PER_HOUR = 0.60
INTERFACE_ENDPOINT_PER_AZ_HOUR = 0.01


@dataclass(frozen=True)
class OnDemandQuota:
    """The EC2 Service Quotas entry that caps running on-demand vCPUs of an instance family."""

    code: str
    name: str


# https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html (codes from
# `aws service-quotas list-service-quotas --service-code ec2`). New accounts often have 0 or a
# few vCPUs of G and VT, which fails a GPU node group about 25 minutes into a deploy.
ON_DEMAND_QUOTAS = {
    "G": OnDemandQuota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "P": OnDemandQuota("L-417A185B", "Running On-Demand P instances"),
    "Standard": OnDemandQuota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}


def on_demand_quota(instance_type: str) -> OnDemandQuota:
    family = instance_type[0].upper()
    if family in ("G", "V"):
        return ON_DEMAND_QUOTAS["G"]
    if family == "P":
        return ON_DEMAND_QUOTAS["P"]
    return ON_DEMAND_QUOTAS["Standard"]


def replicas_per_node(instance_type: str, tensor_parallel_size: int, gpu_fraction: float) -> int:
    """How many engine replicas of that parallelism and GPU share fit on one node of the type."""
    return int(INSTANCES[instance_type].gpu_count / (tensor_parallel_size * gpu_fraction))


def known_instance_types(*, gpu: bool | None = None) -> list[str]:
    """Instance types in the table, optionally only those with (or without) GPUs."""
    return sorted(name for name, f in INSTANCES.items() if gpu is None or (f.gpu is not None) == gpu)


# --- Amazon ElastiCache (the GCS fault-tolerance store) ------------------------------------------
# Valkey node-based clusters, on-demand, per node-hour, us-east-1, from
# https://aws.amazon.com/elasticache/pricing/ (Valkey nodes are priced 20% below Redis OSS nodes
# of the same type). Unlike the EC2 prices these were not read from a dated copy of the price
# list: treat them as estimates and check the page for your region. Memory is what a node offers for data, from
# https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/CacheNodes.SupportedTypes.html.
CACHE_PRICES_SOURCE = "https://aws.amazon.com/elasticache/pricing/ (Valkey, node-based, on-demand)"


@dataclass(frozen=True)
class CacheNodeFacts:
    """One ElastiCache node type: its memory for data and its on-demand price as a Valkey node."""

    node_type: str
    memory_gib: float
    price_per_hour: float


CACHE_NODES: dict[str, CacheNodeFacts] = {
    f.node_type: f
    for f in (
        CacheNodeFacts("cache.t4g.micro", 0.5, 0.0128),
        CacheNodeFacts("cache.t4g.small", 1.37, 0.0256),
        CacheNodeFacts("cache.t4g.medium", 3.09, 0.0520),
        CacheNodeFacts("cache.m7g.large", 6.38, 0.1264),
        CacheNodeFacts("cache.r7g.large", 13.07, 0.1752),
    )
}
