"""Whether a prefill/decode deployment fits, whether moving its KV cache pays off, and what it costs.

Every estimate is first-order and its calibration is the config's own :class:`PlannerSettings`
(``planner:`` in an environment's file), so numbers measured on a real GPU run can replace the
defaults without touching the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from config import catalog
from config.catalog import INSTANCES, InstanceFacts
from config.schema import PlannerSettings
from planner.errors import PlanningError, field_name
from planner.models import ModelArchitecture, load_architecture
from planner.performance import efficiency_of
from serve_app.spec import PHASES

GIB = 2**30
HOURS_PER_MONTH = 24 * 30
# vLLM allocates KV cache in blocks of this many tokens, so capacity rounds down.
KV_BLOCK_TOKENS = 16
# The prompt/output token ratio from which prefill interference justifies its own nodes.
PREFILL_HEAVY_RATIO = 4.0


@dataclass(frozen=True)
class PhasePlanInputs:
    instance_type: str
    tensor_parallel_size: int = 1
    nodes: int = 1


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner needs; ``model`` is a Hugging Face id or an architecture, and ``settings``
    the thresholds and calibration (a config's ``planner`` section as it is)."""

    model: str | ModelArchitecture
    prefill: PhasePlanInputs
    decode: PhasePlanInputs
    dtype_bytes: int = 2
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.9
    prompt_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    config_json: str | Path | None = None
    system_instance_type: str = "m7i.xlarge"
    system_nodes: int = 1
    nat_gateways: int = 1
    interface_endpoints: int = 0  # endpoints × AZs, each billed per hour
    eks_extended_support: bool = False
    # The GCS fault-tolerance store (ElastiCache): its node type and node count (0: no store).
    gcs_store_node_type: str = "cache.t4g.small"
    gcs_store_nodes: int = 0
    # serving.kv_transfer.backend: LIBFABRIC over EFA, or UCX over TCP (the fallback).
    kv_backend: str = "LIBFABRIC"
    settings: PlannerSettings = field(default_factory=PlannerSettings)


# UCX's TCP transport moves a transfer over one connection, and EC2 limits one flow (5-tuple) to 10 Gbit/s
# between instances in the same cluster placement group, where the GPU groups run
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html).
SINGLE_FLOW_GBPS = 10.0


@dataclass(frozen=True)
class PhasePlan:
    phase: str
    instance_type: str
    gpu: str
    tensor_parallel_size: int
    nodes: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_cache_bytes_per_gpu: int  # negative when weights and overhead already exceed the budget
    max_cached_tokens: int
    max_concurrency_at_max_model_len: float
    fits: bool
    problem: str | None


@dataclass(frozen=True)
class TransferRow:
    prompt_tokens: int
    prefill_seconds: float
    kv_bytes: int
    transfer_seconds: float
    transfer_share: float


@dataclass(frozen=True)
class CostLine:
    item: str
    count: int
    unit_per_hour: float
    per_hour: float


@dataclass(frozen=True)
class CostBreakdown:
    lines: list[CostLine]
    per_hour: float
    per_month: float
    prices_as_of: str
    region: str


@dataclass(frozen=True)
class PlanReport:
    inputs: PlanInputs
    model: ModelArchitecture
    prefill: PhasePlan
    decode: PhasePlan
    bandwidth_bytes_per_second: float
    transfer_rows: list[TransferRow]
    skipped_prompt_lengths: list[int]
    errors: list[str]
    warnings: list[str]
    verdict: str
    cost: CostBreakdown
    scaling: object | None = None  # planner.scaling.ScalingPlan, when planned from a config

    @property
    def ok(self) -> bool:
        return not self.errors


def instance_facts(instance_type: str, what: str) -> InstanceFacts:
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise PlanningError(
            f"{what}={instance_type!r} is not in config/catalog.py; known types: "
            + ", ".join(catalog.known_instance_types())
        ) from None


def prefill_flops(model: ModelArchitecture, tokens: int) -> float:
    """2 FLOPs per prompt token per weight the token multiplies (not the embedding, a lookup, nor the
    LM head, which runs once, for the token the prefill samples), plus 2·layers·tokens²·(heads·head_dim)
    for causal attention.

    QKᵀ and AV are each 2·T²·d FLOPs per layer; the causal mask halves their sum.
    """
    attention = 2 * model.num_layers * tokens**2 * model.num_attention_heads * model.head_dim
    return 2 * model.matmul_parameters * tokens + attention + 2 * model.hidden_size * model.vocab_size


def prefill_mfu(facts: InstanceFacts, settings: PlannerSettings) -> float:
    """The configured MFU, else the GPU family's (planner/performance.py efficiency_of)."""
    if settings.prefill_mfu is not None:
        return settings.prefill_mfu
    if facts.gpu_facts is None:
        raise PlanningError(f"{facts.instance_type} has no GPU to prefill on")
    return efficiency_of(facts.gpu_facts).prefill_mfu


def prefill_seconds(model: ModelArchitecture, tokens: int, facts: InstanceFacts, tp: int, mfu: float) -> float:
    if facts.gpu_facts is None:
        raise PlanningError(f"{facts.instance_type} has no GPU to prefill on")
    peak = facts.gpu_facts.peak_bf16_tflops * 1e12
    return prefill_flops(model, tokens) / (tp * peak * mfu)


def _smallest_fitting_tp(model: ModelArchitecture, dtype_bytes: int, budget: float, overhead: float) -> int | None:
    for tp in (1, 2, 4, 8):
        if model.num_attention_heads % tp == 0 and model.num_parameters * dtype_bytes / tp + overhead <= budget:
            return tp
    return None


def _example_instance(gpu: str, count: int) -> str:
    """The cheapest catalog type with ``count`` of this GPU, as a hint for the message."""
    candidates = [f for f in INSTANCES.values() if f.gpu == gpu and f.gpu_count >= count]
    return f" (e.g. {min(candidates, key=lambda f: f.price_per_hour).instance_type})" if candidates else ""


def _plan_phase(phase: str, p: PhasePlanInputs, model: ModelArchitecture, inputs: PlanInputs) -> PhasePlan:
    facts = instance_facts(p.instance_type, field_name("instance_type", phase))
    if facts.gpu_facts is None:
        raise PlanningError(f"{field_name('instance_type', phase)}={p.instance_type!r} has no GPU")
    if p.tensor_parallel_size < 1 or p.nodes < 0:
        raise PlanningError(f"{field_name('tensor_parallel_size', phase)} must be at least 1 and nodes at least 0")
    tp, settings, util = p.tensor_parallel_size, inputs.settings, inputs.gpu_memory_utilization
    tp_field, type_field = field_name("tensor_parallel_size", phase), field_name("instance_type", phase)
    gpu = facts.gpu_facts
    weights = math.ceil(model.num_parameters * inputs.dtype_bytes / tp)
    kv_token = model.kv_bytes_per_token(inputs.dtype_bytes)
    # With TP above the KV head count vLLM replicates heads, so each GPU still holds at least one.
    kv_token_gpu = kv_token // model.num_kv_heads * math.ceil(model.num_kv_heads / tp)
    budget = util * gpu.memory_gib * GIB
    overhead = settings.runtime_overhead_gib * GIB
    kv_cache = int(budget - weights - overhead)
    block = KV_BLOCK_TOKENS * kv_token_gpu
    cached = max(kv_cache, 0) // block * KV_BLOCK_TOKENS
    problem = None
    where = f"{phase} ({p.instance_type}, {gpu.model} {gpu.memory_gib:g} GiB)"
    if tp > facts.gpu_count:
        problem = (
            f"{tp_field}={tp} exceeds the {facts.gpu_count} GPU(s) of {p.instance_type}: lower it "
            f"or set {type_field} to a type with {tp} GPUs{_example_instance(gpu.model, tp)}"
        )
    elif model.num_attention_heads % tp:
        problem = (
            f"{tp_field}={tp} does not divide the {model.num_attention_heads} attention heads of "
            f"{model.name}: choose a divisor of {model.num_attention_heads}"
        )
    elif cached == 0:
        need = _smallest_fitting_tp(model, inputs.dtype_bytes, budget, overhead)
        fix = (
            f"set {tp_field}={need} on a type with {need} GPUs{_example_instance(gpu.model, need)}"
            + f" or set {type_field} to a GPU with more memory"
            if need and need > tp
            else f"set {type_field} to a GPU with more memory"
        )
        problem = (
            f"{model.name} does not fit on {where}: weights take {weights / GIB:.1f} GiB per GPU at "
            f"{inputs.dtype_bytes} bytes a parameter ({field_name('dtype')}) and {tp_field}={tp}, plus {settings.runtime_overhead_gib:g} GiB overhead, against "
            f"{field_name('gpu_memory_utilization')}={util:g} × {gpu.memory_gib:g} GiB = "
            f"{budget / GIB:.2f} GiB: {fix}"
        )
    elif cached < inputs.max_model_len:
        problem = (
            f"{field_name('max_model_len')}={inputs.max_model_len} does not fit on {where}: the KV cache "
            f"left after weights at {field_name('gpu_memory_utilization')}={util:g} holds {cached} tokens; "
            f"lower {field_name('max_model_len')} to at most {cached}, raise "
            f"{field_name('gpu_memory_utilization')} or {tp_field}, or choose a larger instance for {type_field}"
        )
    return PhasePlan(
        phase=phase,
        instance_type=p.instance_type,
        gpu=gpu.model,
        tensor_parallel_size=tp,
        nodes=p.nodes,
        weight_bytes_per_gpu=weights,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_token_per_gpu=kv_token_gpu,
        kv_cache_bytes_per_gpu=kv_cache,
        max_cached_tokens=cached,
        max_concurrency_at_max_model_len=cached / inputs.max_model_len,
        fits=problem is None,
        problem=problem,
    )


def cost_breakdown(inputs: PlanInputs) -> CostBreakdown:
    """Hourly on-demand cost from the dated table; data transfer and NAT data processing excluded."""
    lines: list[CostLine] = []

    def add(item: str, count: int, unit: float) -> None:
        if count:
            lines.append(CostLine(item, count, unit, round(count * unit, 6)))

    system = instance_facts(inputs.system_instance_type, field_name("system_instance_type"))
    add(f"system nodes ({system.instance_type})", inputs.system_nodes, system.price_per_hour)
    for phase in PHASES:
        p: PhasePlanInputs = getattr(inputs, phase)
        facts = instance_facts(p.instance_type, field_name("instance_type", phase))
        add(f"{phase} nodes ({p.instance_type})", p.nodes, facts.price_per_hour)
    add("NAT gateways", inputs.nat_gateways, catalog.NAT_GATEWAY_PER_HOUR)
    add("interface endpoints (per AZ)", inputs.interface_endpoints, catalog.INTERFACE_ENDPOINT_PER_AZ_HOUR)
    if inputs.gcs_store_nodes:
        store = catalog.CACHE_NODES.get(inputs.gcs_store_node_type)
        if store is None:
            raise PlanningError(
                f"{field_name('gcs_store_node_type')}={inputs.gcs_store_node_type!r} is not in config/catalog.py "
                "CACHE_NODES; known types: " + ", ".join(sorted(catalog.CACHE_NODES))
            )
        add(f"GCS store nodes ({store.node_type}, Valkey)", inputs.gcs_store_nodes, store.price_per_hour)
    # Extended support replaces the standard rate rather than adding to it.
    if inputs.eks_extended_support:
        add("EKS control plane (extended support)", 1, catalog.EKS_EXTENDED_SUPPORT_PER_HOUR)
    else:
        add("EKS control plane", 1, catalog.EKS_CONTROL_PLANE_PER_HOUR)
    hourly = round(sum(line.per_hour for line in lines), 6)
    return CostBreakdown(lines, hourly, round(hourly * HOURS_PER_MONTH, 2), catalog.PRICES_AS_OF, catalog.PRICES_REGION)


def _verdict(inputs: PlanInputs, errors: list[str], row: TransferRow) -> str:
    if errors:
        return f"not deployable as configured: fix the {len(errors)} error(s) first."
    settings = inputs.settings
    ratio = settings.typical_prompt_tokens / max(settings.typical_output_tokens, 1)
    heavy = ratio >= PREFILL_HEAVY_RATIO
    why = (
        f"at {row.prompt_tokens}-token prompts moving the KV cache takes {row.transfer_share:.0%} "
        f"of the {row.prefill_seconds:.2f} s prefill"
    )
    limit = f"{field_name('max_transfer_share')}={settings.max_transfer_share:g}"
    if row.transfer_share > settings.max_transfer_share:
        return f"not worth it: {why}, above {limit}, so the transfer eats what a separate prefill node saves."
    if not heavy:
        return (
            f"marginal: {why}, but prompts are only {ratio:.1f}× the {settings.typical_output_tokens}-token "
            "outputs, so decode dominates and co-located replicas would use the GPUs as well."
        )
    if row.transfer_share > settings.max_transfer_share / 2:
        return f"marginal: {why}, close to {limit}; a faster network would make the split pay."
    return (
        f"worth it: {why} and prompts are {ratio:.0f}× the outputs, so a dedicated prefill node keeps "
        "long prefills out of the decode batches."
    )


def plan(inputs: PlanInputs) -> PlanReport:
    """Check fit, transfer cost and price; raise :class:`PlanningError` only when nothing can be planned."""
    if not 0 < inputs.gpu_memory_utilization <= 1:
        raise PlanningError(f"{field_name('gpu_memory_utilization')} must be in (0, 1]")
    if inputs.max_model_len < 1:
        raise PlanningError(f"{field_name('max_model_len')} must be at least 1")
    model = inputs.model
    if isinstance(model, str):
        model = load_architecture(model, inputs.config_json)
    settings = inputs.settings
    phases = {ph: _plan_phase(ph, getattr(inputs, ph), model, inputs) for ph in PHASES}
    errors = [pp.problem for pp in phases.values() if pp.problem]
    if model.max_position_embeddings and inputs.max_model_len > model.max_position_embeddings:
        errors.append(
            f"{field_name('max_model_len')}={inputs.max_model_len} exceeds the {model.max_position_embeddings}"
            f"-token context of {model.name}: lower it to at most {model.max_position_embeddings}"
        )

    pre = INSTANCES[inputs.prefill.instance_type]
    dec = INSTANCES[inputs.decode.instance_type]
    link_gbps = min(pre.network_gbps, dec.network_gbps)
    if inputs.kv_backend == "UCX":
        link_gbps = min(link_gbps, SINGLE_FLOW_GBPS)
    bandwidth = link_gbps * 1e9 / 8 * settings.network_efficiency
    kv_token = model.kv_bytes_per_token(inputs.dtype_bytes)

    def row(tokens: int) -> TransferRow:
        seconds = prefill_seconds(model, tokens, pre, inputs.prefill.tensor_parallel_size, prefill_mfu(pre, settings))
        transfer = tokens * kv_token / bandwidth
        return TransferRow(tokens, seconds, tokens * kv_token, transfer, transfer / seconds)

    rows = [row(t) for t in inputs.prompt_lengths if t <= inputs.max_model_len]
    skipped = [t for t in inputs.prompt_lengths if t > inputs.max_model_len]

    warnings: list[str] = []
    over = [r for r in rows if r.transfer_share > settings.max_transfer_share]
    if over:
        message = (
            f"KV transfer exceeds {field_name('max_transfer_share')}={settings.max_transfer_share:g} of prefill "
            f"time at {', '.join(str(r.prompt_tokens) for r in over)}-token prompts (up to "
            f"{max(r.transfer_share for r in over):.0%}): choose instances with more network bandwidth for "
            f"{field_name('instance_type', 'prefill')} and {field_name('instance_type', 'decode')}"
        )
        (errors if settings.fail_on_transfer_share else warnings).append(message)
    if inputs.kv_backend == "UCX":
        efa_gbps = min(pre.network_gbps, dec.network_gbps)
        warnings.append(
            f"{field_name('kv_transfer.backend')} is UCX: KV moves over one TCP flow, at most {link_gbps:g} of the "
            f"instances' {efa_gbps:g} Gbit/s (EC2's single-flow limit in a cluster placement group), so each transfer "
            f"below takes {efa_gbps / link_gbps:.1f}x what LIBFABRIC over EFA would; set it back once `make verify` "
            "shows the EFA path healthy"
        )
    for facts in dict.fromkeys((pre, dec)):
        used_by = " and ".join(ph for ph in PHASES if getattr(inputs, ph).instance_type == facts.instance_type)
        if not facts.supports_efa:
            warnings.append(
                f"{facts.instance_type} ({used_by}) has no EFA: NIXL moves KV over TCP, slower than estimated; "
                f"choose an EFA-capable type for {field_name('instance_type', used_by.split()[0])}"
            )
        elif not facts.gpudirect_rdma:
            warnings.append(
                f"{facts.instance_type} ({used_by}) has no GPUDirect RDMA: NIXL stages KV through host memory, "
                "an extra PCIe copy per side that the transfer estimate leaves out"
            )

    typical = row(min(settings.typical_prompt_tokens, inputs.max_model_len))
    return PlanReport(
        inputs=inputs,
        model=model,
        prefill=phases["prefill"],
        decode=phases["decode"],
        bandwidth_bytes_per_second=bandwidth,
        transfer_rows=rows,
        skipped_prompt_lengths=skipped,
        errors=errors,
        warnings=warnings,
        verdict=_verdict(inputs, errors, typical),
        cost=cost_breakdown(inputs),
    )
