"""Scheduling: the attribution job (`Scheduler`), the run loop that drives many at once, the
budget ledger and fork costs, and the stages, estimators and rules of the held mechanism.

    _job        Scheduler: a job as the run loop's source of forks; its results, table, notes
    _plan       the plan: the explicit list of stages a job runs
    _context    JobContext: what a stage gets of its job (arms, seeds, rows, ledger view)
    _results    the frozen, typed results stages hand back
    _table      the attribution table, notes and answer, built from results
    _loop       RunLoop and its admission policies (window, shared budget, deadline)
    _budget     the ledger (`BudgetGovernor`), caps and costs
    _costs      fork estimates and learned reservations (`ForkCosts`)
    _tuning     every tuned constant with its evidence
    stages/     one file a stage;  estimators/ one file an estimator;  rules/ one file a rule
"""

from __future__ import annotations

from ._budget import (
    Budget,
    BudgetError,
    BudgetGovernor,
    Cost,
    Headroom,
    ReservationExceeded,
    effective_budget,
)
from ._context import Arm, JobContext, Rows, Seeds, ShapleyRules, job_arms, seed_base
from ._costs import ForkCosts
from ._interval import Interval, wilson
from ._job import (
    FAILED_STATUSES,
    SHIPPED_RULES,
    JobOutcome,
    Progress,
    Scheduler,
    job_id_of,
)
from ._loop import Admission, Deadline, JobSource, RunLoop, SharedBudget, Window
from ._plan import plan_of
from ._results import ControlResult, FlipCounts, ScreenResult, ShapleyResult, StageResult
from ._table import Results
from ._tuning import DEFAULT_MAX_FORKS
from .estimators import DeviationScreen, SeedShapley, exact_shapley
from .stages import Next, Stage

__all__ = [
    "DEFAULT_MAX_FORKS",
    "FAILED_STATUSES",
    "SHIPPED_RULES",
    "Admission",
    "Arm",
    "Budget",
    "BudgetError",
    "BudgetGovernor",
    "ControlResult",
    "Cost",
    "Deadline",
    "DeviationScreen",
    "FlipCounts",
    "ForkCosts",
    "Headroom",
    "Interval",
    "JobContext",
    "JobOutcome",
    "JobSource",
    "Next",
    "Progress",
    "ReservationExceeded",
    "Results",
    "Rows",
    "RunLoop",
    "Scheduler",
    "ScreenResult",
    "SeedShapley",
    "Seeds",
    "ShapleyResult",
    "ShapleyRules",
    "SharedBudget",
    "Stage",
    "StageResult",
    "Window",
    "effective_budget",
    "exact_shapley",
    "job_arms",
    "job_id_of",
    "plan_of",
    "seed_base",
    "wilson",
]
