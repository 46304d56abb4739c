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
from ._loop import Admission, Deadline, JobSource, RunLoop, SharedBudget, Window
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
from ._stages import Next, Stage

__all__ = [
    "FAILED_STATUSES",
    "Admission",
    "Arm",
    "Budget",
    "BudgetError",
    "BudgetGovernor",
    "CoalitionPlanner",
    "Cost",
    "Deadline",
    "Estimate",
    "Headroom",
    "JobOutcome",
    "JobSource",
    "KernelShapPlanner",
    "Next",
    "Progress",
    "Race",
    "ReservationExceeded",
    "RunLoop",
    "Scheduler",
    "ShapleyEstimates",
    "ShapleyPlanner",
    "SharedBudget",
    "Stage",
    "StepAttribution",
    "Window",
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
