"""Planner inputs from an environment's config: what `make plan` prints and synth enforces."""

from __future__ import annotations

from dataclasses import replace

from config.schema import AppConfig
from planner.core import PHASES, PhasePlanInputs, PlanInputs, PlanReport, plan
from planner.errors import PlanningError
from planner.models import dtype_bytes
from planner.scaling import scaling_plan


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
