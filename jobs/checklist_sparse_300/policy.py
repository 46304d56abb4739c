"""The checklist review (jobs/checklist) with one planted item of 150 (step 150), waived with
probability 0.7; every model step worded four ways."""

from __future__ import annotations

from checklist.policy import Checklist, scenario

from car_ray.sim import Worded

BASE = Checklist(items=150, planted={75: 0.7})
POLICY = Worded(BASE, wordings=4)
SCENARIO = scenario(
    "checklist_sparse_300",
    BASE,
    (
        "A payout review whose every note varies its wording: one planted item of 150 "
        "(step 150), waived with probability 0.7; a waived item releases the payout."
    ),
    heavy=True,
)
