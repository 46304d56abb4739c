"""Scheduling: the budget ledger and the statistics that decide where the next forks go."""

from __future__ import annotations

from ._budget import (
    Budget,
    BudgetError,
    BudgetGovernor,
    Cost,
    Headroom,
    ReservationExceeded,
)
from ._estimators import (
    CoalitionPlanner,
    Estimate,
    KernelShapPlanner,
    Race,
    ShapleyEstimates,
    ShapleyPlanner,
    StepAttribution,
    confidence_sequence,
    confidence_sequences,
    exact_shapley,
    shapley_coefficients,
    shapley_planner,
    wilson,
)
from ._plan import (
    FAILED_STATUSES,
    Arm,
    JobOutcome,
    Progress,
    Scheduler,
    effective_budget,
    job_arms,
    job_id_of,
)

__all__ = [
    "FAILED_STATUSES",
    "Arm",
    "Budget",
    "BudgetError",
    "BudgetGovernor",
    "CoalitionPlanner",
    "Cost",
    "Estimate",
    "Headroom",
    "JobOutcome",
    "KernelShapPlanner",
    "Progress",
    "Race",
    "ReservationExceeded",
    "Scheduler",
    "ShapleyEstimates",
    "ShapleyPlanner",
    "StepAttribution",
    "confidence_sequence",
    "confidence_sequences",
    "effective_budget",
    "exact_shapley",
    "job_arms",
    "job_id_of",
    "shapley_coefficients",
    "shapley_planner",
    "wilson",
]
