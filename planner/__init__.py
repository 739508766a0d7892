"""Pre-deployment planner: GPU memory fit, KV-transfer cost against prefill time, and hourly cost.

Its thresholds and calibration are the config's :class:`~config.schema.PlannerSettings` (re-exported here).
"""

from config.schema import PlannerSettings
from planner.core import (
    CostBreakdown,
    CostLine,
    PhasePlan,
    PhasePlanInputs,
    PlanInputs,
    PlanReport,
    TransferRow,
    cost_breakdown,
    plan,
    prefill_flops,
)
from planner.errors import FIELDS, PlanningError
from planner.models import KNOWN_MODELS, ModelArchitecture, dtype_bytes, estimate_parameters, load_architecture
from planner.report import render_text

__all__ = [
    "FIELDS",
    "KNOWN_MODELS",
    "CostBreakdown",
    "CostLine",
    "ModelArchitecture",
    "PhasePlan",
    "PhasePlanInputs",
    "PlanInputs",
    "PlanReport",
    "PlannerSettings",
    "PlanningError",
    "TransferRow",
    "cost_breakdown",
    "dtype_bytes",
    "estimate_parameters",
    "load_architecture",
    "plan",
    "prefill_flops",
    "render_text",
]
