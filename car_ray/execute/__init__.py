"""Executing forks at scale: Ray actors fed in batches under a bounded window."""

from __future__ import annotations

from ._ray import BatchLost, ForkWorker, Item, RayExecutor, WorkerConfig, init_ray

__all__ = ["BatchLost", "ForkWorker", "Item", "RayExecutor", "WorkerConfig", "init_ray"]
