"""The planner's error type and the configuration field names its messages point at."""

from __future__ import annotations


class PlanningError(ValueError):
    """The inputs cannot be planned at all (unknown model or instance type, invalid value)."""


# Messages name the config field a person has to change. Kept in one table so that a rename
# in the config tree is a one-line change here rather than a hunt through message strings.
FIELDS: dict[str, str] = {
    "model": "serving.model.source",
    "config_json": "serving.model.config_json",
    "dtype": "serving.dtype",
    "max_model_len": "serving.max_model_len",
    "gpu_memory_utilization": "serving.gpu_memory_utilization",
    "kv_transfer.backend": "serving.kv_transfer.backend",
    "tensor_parallel_size": "serving.{phase}.tensor_parallel_size",
    "instance_type": "cluster.gpu_node_groups.{phase}.instance_type",
    "system_instance_type": "cluster.system_node_group.instance_type",
    "gcs_store_node_type": "ray_service.gcs_fault_tolerance.store.node_type",
    "max_transfer_share": "planner.max_transfer_share",
    "fail_on_transfer_share": "planner.fail_on_transfer_share",
    "typical_prompt_tokens": "planner.typical_prompt_tokens",
}


def field_name(key: str, phase: str = "") -> str:
    return FIELDS[key].format(phase=phase)
