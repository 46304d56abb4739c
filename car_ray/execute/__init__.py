"""Executing forks at scale: Ray actors fed in batches under a bounded window."""

from __future__ import annotations

from ._health import NoWorkers
from ._local import LocalExecutor
from ._ray import (
    BatchLost,
    ClusterUnreachable,
    ForkWorker,
    Item,
    RayExecutor,
    WorkerConfig,
    cluster_info,
    init_ray,
)

__all__ = [
    "BatchLost",
    "ClusterUnreachable",
    "ForkWorker",
    "Item",
    "LocalExecutor",
    "NoWorkers",
    "RayExecutor",
    "WorkerConfig",
    "cluster_info",
    "init_ray",
]
