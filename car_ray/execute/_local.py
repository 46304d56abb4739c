"""An executor and a sink in this process: `LocalExecutor` has the same submit / wait / verify
as the Ray executor, forks run on one private event loop, for tests and benchmarks that
measure statistics, not throughput (no worker can die here, so nothing is ever a
`BatchLost`); `MemorySink` keeps rows in a list; `NoExecutor` is for a scheduler that only
estimates (a dry run)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ..replay import DivergenceError, ForkRunner
from ._protocol import BatchLost, Item, Row, Verified, run_item


class LocalExecutor:
    """Runs every fork on `runner`, or a job's forks on the runner `add_job` gave it (jobs of
    different agents in one run loop)."""

    def __init__(self, runner: ForkRunner, name: str = "local") -> None:
        self.runner = runner
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._pending: list[Item] = []
        self._runners: dict[str, ForkRunner] = {}

    def add_job(self, job_id: str, runner: ForkRunner) -> None:
        """Run the forks of `job_id` (`Item.job_id`) on `runner`."""
        self._runners[job_id] = runner

    def _runner_of(self, tape_id: str) -> ForkRunner:
        for runner in [self.runner, *self._runners.values()]:
            try:
                runner.tape(tape_id)
            except KeyError:
                continue
            return runner
        return self.runner  # it raises the KeyError that names the tape

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def verify(self, tape_id: str) -> Verified:
        try:
            runner = self._runner_of(tape_id)
            self.loop.run_until_complete(runner.replay(tape_id))
        except DivergenceError as exc:
            return {"ok": False, "divergence": exc.render()}
        return {"ok": True, "recorded_outcome": runner.recorded_outcome(tape_id)}

    def submit(self, items: Sequence[Item]) -> None:
        self._pending.extend(items)

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[Row] | BatchLost]:
        if not self._pending:
            return []
        batch, self._pending = self._pending, []
        return [self.loop.run_until_complete(self._run(batch))]

    async def _run(self, batch: list[Item]) -> list[Row]:
        runners = self._runners
        forks = (run_item(runners.get(i.job_id, self.runner), i, self.name) for i in batch)
        return list(await asyncio.gather(*forks))

    def shutdown(self) -> None:
        for runner in [self.runner, *self._runners.values()]:
            self.loop.run_until_complete(runner.aclose())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class NoExecutor:
    """An executor for a scheduler that only plans and estimates (`--dry-run`): it runs
    nothing, and a fork handed to it is a bug."""

    in_flight = 0

    def verify(self, tape_id: str) -> Verified:
        raise RuntimeError("this scheduler only estimates: it has no executor to replay on")

    def submit(self, items: Sequence[Item]) -> None:
        raise RuntimeError("this scheduler only estimates: it has no executor to run forks")

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[Row] | BatchLost]:
        return []


class MemorySink:
    """Keeps rows in a list; refuses a task id it already holds (as the Parquet sink does)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._ids: set[str] = set()

    def add(self, row: Row) -> bool:
        if row["task_id"] in self._ids:
            return False
        self._ids.add(row["task_id"])
        self.rows.append(row)
        return True

    def maybe_flush(self) -> None:
        return None

    def flush(self) -> None:
        return None
