"""An executor in this process: the same submit / wait / verify as the Ray executor, forks
run on one private event loop. For tests and benchmarks that measure statistics, not
throughput (no worker can die here, so nothing is ever a `BatchLost`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from ..replay import DivergenceError, ForkRunner
from ._ray import BatchLost, Item


class LocalExecutor:
    def __init__(self, runner: ForkRunner, name: str = "local") -> None:
        self.runner = runner
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._pending: list[Item] = []

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def verify(self, tape_id: str) -> dict[str, Any]:
        try:
            self.loop.run_until_complete(self.runner.replay(tape_id))
        except DivergenceError as exc:
            return {"ok": False, "divergence": exc.render()}
        return {"ok": True, "recorded_outcome": self.runner.recorded_outcome(tape_id)}

    def submit(self, items: Sequence[Item]) -> None:
        self._pending.extend(items)

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[dict[str, Any]] | BatchLost]:
        if not self._pending:
            return []
        batch, self._pending = self._pending, []
        return [self.loop.run_until_complete(self._run(batch))]

    async def _run(self, batch: list[Item]) -> list[dict[str, Any]]:
        async def one(item: Item) -> dict[str, Any]:
            try:
                row = await self.runner.run(item.spec, item.limit)
            except Exception as exc:
                row = self.runner.error_row(item.spec, f"{type(exc).__name__}: {exc}")
            return {
                **row.model_dump(),
                "stage": item.stage,
                "spec": item.spec.model_dump_json(),
                "worker": self.name,
                "attempt": item.attempt,
            }

        return list(await asyncio.gather(*(one(i) for i in batch)))

    def shutdown(self) -> None:
        self.loop.run_until_complete(self.runner.aclose())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
