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
from ._estimators import exact_shapley, wilson
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
    "Cost",
    "Deadline",
    "Headroom",
    "JobOutcome",
    "JobSource",
    "Next",
    "Progress",
    "ReservationExceeded",
    "RunLoop",
    "Scheduler",
    "SharedBudget",
    "Stage",
    "Window",
    "effective_budget",
    "exact_shapley",
    "job_arms",
    "job_id_of",
    "wilson",
]
