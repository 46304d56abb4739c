"""What it costs to make every fork row durable when `ForkSink.add` returns, two ways.

- journal: the sink as built: each row appended to `forks/_journal.jsonl` and fdatasynced,
  compacted into one Parquet part per 1000 rows or 2 s (`ForkSink` with its defaults);
- small parts: each row written at once as its own Parquet part (write, fsync, rename,
  fsync the folder: the sink's one writer, `JobDir.write_atomic`);
- buffered: the rows kept in memory and written as one part per 1000 rows, as the sink did
  before: not durable (a killed driver lost what was buffered), the floor to compare with.

Rows are the driver's (`fork_record` of a `ForkRow`: datetimes, lists, nulls), added back to
back on the disk under `--scratch`. For each way: rows per second, wall and CPU time per row,
the share of the driver's time at 100 rows/s, the files it leaves, and how long reading the
rows back takes (what a resumed job does first).

    .venv/bin/python benchmarks/sink_durability.py [--quick] [--out benchmarks/results]

Prints a table and writes `sink_durability.json` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import DEFAULT_OUT, machine, make_console, warn_if_loaded
from rich.table import Table

from car_ray.replay import ForkRow, ForkSpec, Resample
from car_ray.results import ForkSink, fork_record
from car_ray.results._parquet import JobDir, _parquet_bytes
from car_ray.results._rows import FORK_ROWS

JOB = "bench"
RATE_PER_S = 100


def driver_row(i: int) -> dict[str, Any]:
    """A fork row as the scheduler hands it to the sink."""
    spec = ForkSpec(tape_id="tape-a", interventions={i % 7: Resample()}, seed=i)
    row = ForkRow(
        task_id=spec.task_id,
        tape_id=spec.tape_id,
        status="ok",
        outcome=float(i % 2),
        recorded_outcome=1.0,
        flipped=i % 2 == 0,
        steps_intervened=sorted(spec.interventions),
        interventions=[iv.kind for iv in spec.interventions.values()],
        tail=spec.tail,
        seed=spec.seed,
        tail_calls=3,
        retries=0,
        tokens_in=1200 + i,
        tokens_out=180,
        cost_usd=0.0021,
        latency_s=0.8,
    )
    extras = {
        "job_id": JOB,
        "stage": "screen",
        "spec": spec.model_dump_json(),
        "worker": "worker-0",
        "attempt": 0,
        "finished_at": datetime(2025, 3, 1, tzinfo=UTC) + timedelta(seconds=i),
    }
    return fork_record(row, extras)


class Buffered:
    """The sink before: one part per 1000 rows, nothing on disk in between."""

    def __init__(self, out: Path) -> None:
        self.job = JobDir.of(out, JOB)
        self.job.make_dir("forks")
        self.buffer: list[dict[str, Any]] = []
        self.seq = 0

    def add(self, row: dict[str, Any]) -> None:
        self.buffer.append(FORK_ROWS.normalize(row))
        if len(self.buffer) >= 1000:
            self.close()

    def close(self) -> None:
        if self.buffer:
            self.seq += 1
            data = _parquet_bytes(FORK_ROWS.table(self.buffer))
            self.job.write_atomic(data, "forks", f"part-{self.seq:06d}-{uuid.uuid4().hex}.parquet")
            self.buffer = []


class SmallParts(Buffered):
    """Every row its own part, on disk when `add` returns."""

    def add(self, row: dict[str, Any]) -> None:
        self.buffer.append(FORK_ROWS.normalize(row))
        self.close()


class Journal:
    """The sink as built."""

    def __init__(self, out: Path) -> None:
        self.sink = ForkSink(out, JOB)

    def add(self, row: dict[str, Any]) -> None:
        self.sink.add(row)

    def close(self) -> None:
        self.sink.close()


WAYS: dict[str, tuple[Callable[[Path], Any], bool]] = {
    "journal": (Journal, True),
    "small parts": (SmallParts, True),
    "buffered (before)": (Buffered, False),
}


@dataclass
class Cell:
    way: str
    durable_at_add: bool
    rows: int
    rows_per_s: float
    wall_us_per_row: float
    cpu_us_per_row: float
    driver_share_at_100_per_s: float
    files: int
    read_back_ms: float


def measure(way: str, rows: list[dict[str, Any]], scratch: Path, repeats: int) -> Cell:
    make, durable = WAYS[way]
    walls, cpus, reads = [], [], []
    files = 0
    for _ in range(repeats):
        out = Path(tempfile.mkdtemp(dir=scratch))
        sink = make(out)
        wall, cpu = time.perf_counter(), time.process_time()
        for row in rows:
            sink.add(row)
        sink.close()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        read = time.perf_counter()
        assert len(ForkSink.existing(out, JOB)) == len(rows)
        reads.append(time.perf_counter() - read)
        files = len(list((out / JOB / "forks").iterdir()))
    wall_s, cpu_s = statistics.median(walls), statistics.median(cpus)
    per_row = wall_s / len(rows)
    return Cell(
        way=way,
        durable_at_add=durable,
        rows=len(rows),
        rows_per_s=round(len(rows) / wall_s, 1),
        wall_us_per_row=round(per_row * 1e6, 1),
        cpu_us_per_row=round(cpu_s / len(rows) * 1e6, 1),
        driver_share_at_100_per_s=round(per_row * RATE_PER_S, 4),
        files=files,
        read_back_ms=round(statistics.median(reads) * 1000, 1),
    )


def table(cells: Sequence[Cell]) -> Table:
    out = Table(title=f"durable fork rows: {cells[0].rows} rows added back to back")
    for name in (
        "way",
        "durable at add",
        "rows/s",
        "wall µs/row",
        "CPU µs/row",
        f"driver time at {RATE_PER_S} rows/s",
        "files",
        "read back ms",
    ):
        out.add_column(name, justify="left" if name == "way" else "right")
    for c in cells:
        out.add_row(
            c.way,
            "yes" if c.durable_at_add else "no",
            f"{c.rows_per_s:,.0f}",
            f"{c.wall_us_per_row:,.0f}",
            f"{c.cpu_us_per_row:,.0f}",
            f"{c.driver_share_at_100_per_s:.1%}",
            str(c.files),
            f"{c.read_back_ms:,.1f}",
        )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="300 rows, one repeat (~5 s)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per way and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="runs per way (median)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the results")
    parser.add_argument(
        "--scratch", type=Path, default=None, help="where the sinks write (default: a temp dir)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    count, repeats = (300, 1) if args.quick else (args.rows, args.repeats)
    console = make_console()
    load_before = warn_if_loaded(console)
    rows = [driver_row(i) for i in range(count)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="car-ray-sink-", dir=args.scratch) as scratch:
        cells = [measure(way, rows, Path(scratch), repeats) for way in WAYS]
        scratch_dir = str(Path(scratch).parent)
    console.print(table(cells))
    journal, parts = cells[0], cells[1]
    console.print(
        f"small parts cost {parts.wall_us_per_row / journal.wall_us_per_row:.1f}x the "
        f"journal's wall time and {parts.cpu_us_per_row / journal.cpu_us_per_row:.1f}x its "
        f"CPU per row, and leave {parts.files} files to read back instead of {journal.files}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sink_durability.json"
    payload = {
        "benchmark": "sink_durability",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(("pyarrow",)),
        "config": {
            "rows": count,
            "repeats": repeats,
            "scratch": scratch_dir,
            "total_s": round(time.perf_counter() - started, 2),
            "load_average_1m_before": round(load_before, 2),
        },
        "rows": [asdict(c) for c in cells],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
