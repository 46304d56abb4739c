"""Executing forks: the `Executor` protocol, Ray actors fed in batches under a bounded window
(`RayExecutor`), and the same in this process (`LocalExecutor`)."""

from __future__ import annotations

from ._health import NoWorkers
from ._local import LocalExecutor, MemorySink, NoExecutor
from ._protocol import BatchLost, Executor, Item, Row, RowSink, Verified, run_item
from ._ray import (
    AgentCode,
    ClusterUnreachable,
    ForkWorker,
    RayExecutor,
    WorkerConfig,
    cluster_info,
    init_ray,
)

__all__ = [
    "AgentCode",
    "BatchLost",
    "ClusterUnreachable",
    "Executor",
    "ForkWorker",
    "Item",
    "LocalExecutor",
    "MemorySink",
    "NoExecutor",
    "NoWorkers",
    "RayExecutor",
    "Row",
    "RowSink",
    "Verified",
    "WorkerConfig",
    "cluster_info",
    "init_ray",
    "run_item",
]
