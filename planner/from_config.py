"""Planner inputs from an environment's config: what `make plan` prints and synth enforces."""

from __future__ import annotations

from dataclasses import replace

from config.catalog import INSTANCES
from config.schema import AppConfig
from planner.advisor import AdvisorInputs, colocated_serves_better, deployed_against_colocated
from planner.core import PHASES, PhasePlanInputs, PlanInputs, PlanReport, plan
from planner.errors import PlanningError
from planner.models import dtype_bytes
from planner.performance import efficiency_of
from planner.scaling import scaling_plan
from planner.simulate import Slo, Workload


def plan_inputs(config: AppConfig) -> PlanInputs:
    serving = config.serving
    groups = config.cluster.gpu_node_groups
    model = serving.model
    if model.config_json is None and model.hub_repo is None:
        raise PlanningError(
            f"serving.model.source {model.source!r} is not a Hugging Face id the planner knows; set "
            "serving.model.hub_id to the repo it mirrors, or serving.model.config_json to a local copy of its config.json"
        )
    # Colocated engines run on either group; plan them with decode's parallelism on each.
    prefill_spec = serving.prefill if serving.mode == "disaggregated" else serving.colocated
    decode_spec = serving.decode if serving.mode == "disaggregated" else serving.colocated
    return PlanInputs(
        model=model.hub_repo or model.source,
        config_json=model.config_json,
        prefill=PhasePlanInputs(
            instance_type=groups.prefill.instance_type,
            tensor_parallel_size=prefill_spec.tensor_parallel_size,
            nodes=groups.prefill.desired_size,
        ),
        decode=PhasePlanInputs(
            instance_type=groups.decode.instance_type,
            tensor_parallel_size=decode_spec.tensor_parallel_size,
            nodes=groups.decode.desired_size,
        ),
        dtype_bytes=dtype_bytes(serving.dtype) if serving.dtype != "auto" else 2,
        max_model_len=serving.max_model_len,
        gpu_memory_utilization=serving.gpu_memory_utilization,
        system_instance_type=config.cluster.system_node_group.instance_type,
        system_nodes=config.cluster.system_node_group.desired_size,
        nat_gateways=config.network.nat_gateways,
        interface_endpoints=len(config.network.interface_endpoints) * len(config.network.availability_zones),
        **_gcs_store(config),
        kv_backend=serving.kv_transfer.backend,
        settings=config.planner,
    )


def _gcs_store(config: AppConfig) -> dict:
    """The GCS store's node type and node count: a primary, and a replica when it is multi-AZ."""
    store = config.ray_service.gcs_fault_tolerance.store
    if not config.gcs_fault_tolerant or store is None:
        return {"gcs_store_nodes": 0}
    return {"gcs_store_node_type": store.node_type, "gcs_store_nodes": 2 if config.gcs_store_multi_az else 1}


def plan_config(config: AppConfig) -> PlanReport:
    """The plan of an environment, with what scaling costs and how long a new replica takes."""
    report = plan(plan_inputs(config))
    gpu_lines = sum(line.per_hour for line in report.cost.lines if line.item.startswith(PHASES))
    scaling = scaling_plan(
        config,
        fixed_per_hour=report.cost.per_hour - gpu_lines,
        weights_bytes=report.model.num_parameters * report.inputs.dtype_bytes,
    )
    return replace(
        report,
        scaling=scaling,
        errors=[*report.errors, *scaling.errors],
        warnings=[*report.warnings, *scaling.warnings],
    )


# vLLM's defaults where a phase's engine_kwargs set none: its V1 engine gives an OpenAI server on a
# GPU under 70 GiB a 2048-token step budget (8192 above), and 256 sequences.
DEFAULT_TOKEN_BUDGET = {False: 2048, True: 8192}
DEFAULT_MAX_NUM_SEQS = 256


def advisor_inputs(config: AppConfig, report: PlanReport) -> AdvisorInputs:
    """What the advisor simulates for an environment: its instances, parallelism, node groups' max
    sizes and the KV cache the plan found room for."""
    serving, groups = config.serving, config.cluster.gpu_node_groups
    decode_spec = serving.decode if serving.mode == "disaggregated" else serving.colocated
    kwargs = decode_spec.engine_kwargs
    gpu = INSTANCES[groups.decode.instance_type].gpu_facts
    large = gpu is not None and gpu.memory_gib >= 70
    efficiency = None
    if config.planner.prefill_mfu is not None and gpu is not None:
        efficiency = replace(efficiency_of(gpu), prefill_mfu=config.planner.prefill_mfu)
    return AdvisorInputs(
        model=report.model,
        prefill_instance=groups.prefill.instance_type,
        decode_instance=groups.decode.instance_type,
        prefill_tp=report.prefill.tensor_parallel_size,
        decode_tp=report.decode.tensor_parallel_size,
        prefill_max_nodes=groups.prefill.max_size,
        decode_max_nodes=groups.decode.max_size,
        prefill_kv_tokens=max(report.prefill.max_cached_tokens, 1),
        decode_kv_tokens=max(report.decode.max_cached_tokens, 1),
        max_model_len=serving.max_model_len,
        dtype_bytes=report.inputs.dtype_bytes,
        network_efficiency=config.planner.network_efficiency,
        max_num_seqs=int(kwargs.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)),
        token_budget=int(kwargs.get("max_num_batched_tokens", DEFAULT_TOKEN_BUDGET[large])),
        efficiency=efficiency,
        local_prefill_cap=serving.pd_max_local_prefill_tokens,
    )


def advisor_warning(config: AppConfig, report: PlanReport) -> str | None:
    """A line for synth when the config deploys P/D for its planner section's workload (typical_* and
    the SLOs) and the advisor predicts that colocated replicas on as many GPUs serve it better."""
    serving, settings = config.serving, config.planner
    if serving.mode != "disaggregated":
        return None
    workload = Workload(
        settings.typical_prompt_tokens,
        settings.typical_output_tokens,
        0.25,
        concurrency=settings.typical_concurrency,
        requests=max(100, 10 * settings.typical_concurrency),
    )
    slo = Slo(settings.ttft_slo_ms, settings.itl_slo_ms, settings.slo_percentile)
    pd, colocated = deployed_against_colocated(
        advisor_inputs(config, report),
        workload,
        slo,
        serving.prefill.max_replicas,
        serving.decode.max_replicas,
        serving.pd_min_prompt_tokens,
    )
    if not colocated_serves_better(pd, colocated, slo.percentile):
        return None
    p, c, q = pd.outcome, colocated.outcome, slo.percentile
    return (
        f"the advisor predicts that {colocated.split} replicas serve the planner section's workload "
        f"({workload.prompt_tokens} prompt / {workload.output_tokens} output tokens at concurrency "
        f"{workload.concurrency}) at least as well as the deployed {pd.split} on as many GPUs: "
        f"{c.goodput_rps:.3f} against {p.goodput_rps:.3f} good requests/s, TTFT p{q} {c.ttft_ms[q]:.0f} against "
        f"{p.ttft_ms[q]:.0f} ms, ITL p{q} {c.itl_ms[q]:.1f} against {p.itl_ms[q]:.1f} ms (targets {slo.ttft_ms:g} "
        f"and {slo.itl_ms:g} ms); P/D pays where prompts are long and the ITL target tight (`make plan` compares "
        "every split), else set serving.mode: colocated"
    )
