"""Job output as a user reads it: fork parts, attribution and job.json through pyarrow and DuckDB,
across flushes, stale temporary files, resume, bad rows and a writer killed mid-job."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs

from car_ray._notes import Note
from car_ray.replay import ForkRow, ForkSpec, Resample
from car_ray.results import (
    ATTRIBUTION_SCHEMA,
    FORK_SCHEMA,
    ForkSink,
    JobInfo,
    OutputError,
    SchemaError,
    _output,
    fork_record,
    write_attribution,
)

JOB = "job-1"
FINISHED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def make_row(i: int, *, scored: bool = True, error: str | None = None) -> dict[str, Any]:
    """A fork row as the driver builds it: a real `ForkRow` plus the job's fields."""
    spec = ForkSpec(tape_id="tape-a", interventions={i % 3: Resample()}, seed=i)
    row = ForkRow(
        task_id=spec.task_id,
        tape_id=spec.tape_id,
        status="ok" if error is None else "error",
        outcome=float(i % 2) if scored else None,
        recorded_outcome=1.0,
        flipped=(i % 2 == 0) if scored else None,
        steps_intervened=sorted(spec.interventions),
        interventions=[iv.kind for iv in spec.interventions.values()],
        tail=spec.tail,
        seed=spec.seed,
        tail_calls=3,
        retries=i % 2,
        tokens_in=100 + i,
        tokens_out=20 + i,
        cost_usd=0.001 * i,
        latency_s=0.05,
        error=error,
    )
    return fork_record(
        row,
        {
            "job_id": JOB,
            "stage": "screen",
            "spec": spec.model_dump_json(),
            "worker": f"worker-{i % 2}",
            "attempt": 1,
            "finished_at": FINISHED + timedelta(seconds=i),
        },
    )


def by_task(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["task_id"])


def duckdb_read(pattern: str) -> pa.Table:
    """What DuckDB reads from `read_parquet(pattern)`, as Arrow."""
    relation = duckdb.sql(f"SELECT * FROM read_parquet('{pattern}')")
    assert relation is not None
    return relation.to_arrow_table()


def duckdb_rows(glob: str) -> list[dict[str, Any]]:
    return by_task(duckdb_read(glob).to_pylist())


def forks_dir(out: Path) -> Path:
    return out / JOB / "forks"


def visible_parts(out: Path) -> list[Path]:
    return sorted(forks_dir(out).glob("part-*.parquet"))


def test_fork_schema_holds_every_fork_row_field_in_order() -> None:
    own = list(ForkRow.model_fields)
    assert FORK_SCHEMA.names[: len(own)] == own
    assert FORK_SCHEMA.names[len(own) :] == [
        "job_id",
        "stage",
        "spec",
        "worker",
        "attempt",
        "finished_at",
    ]


def test_rows_from_several_flushes_read_back_identically_by_pyarrow_and_duckdb(
    tmp_path: Path,
) -> None:
    # The first flush has outcome, flipped and error all null; divergence is null everywhere:
    # with a per-batch inferred schema those columns would be typed `null` and break readers.
    rows = [make_row(i, scored=False) for i in range(4)]
    rows += [make_row(i, error=f"boom {i}" if i % 3 == 0 else None) for i in range(4, 11)]
    with ForkSink(tmp_path, JOB, flush_rows=4) as sink:
        for row in rows:
            assert sink.add(row)
    assert sink.parts_written == 3 and sink.rows_written == 11
    assert len(visible_parts(tmp_path)) == 3

    expected = by_task(rows)
    dataset = pads.dataset(forks_dir(tmp_path), format="parquet").to_table()
    assert dataset.schema.equals(FORK_SCHEMA)
    assert by_task(dataset.to_pylist()) == expected
    assert by_task(pq.read_table(forks_dir(tmp_path)).to_pylist()) == expected
    assert duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet") == expected
    assert ForkSink.existing(tmp_path, JOB).to_pylist() == rows  # in write order


def test_a_stale_temp_file_is_invisible_to_readers_and_removed_on_reopen(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(5)]
    with ForkSink(tmp_path, JOB, flush_rows=5) as sink:
        for row in rows:
            sink.add(row)
    # What a writer killed before its rename leaves behind: a torn file under a dot name.
    stale = forks_dir(tmp_path) / ".part-000002-0123abcd.parquet.0123abcd.tmp"
    stale.write_bytes(b"PAR1 torn")

    assert len(pads.dataset(forks_dir(tmp_path), format="parquet").to_table()) == 5
    assert len(pq.read_table(forks_dir(tmp_path))) == 5
    assert len(duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet")) == 5

    with capture_logs() as logs:
        reopened = ForkSink(tmp_path, JOB)
    assert not stale.exists()
    assert [e["event"] for e in logs] == ["removed_stale_temp_file"]
    assert logs[0]["path"].endswith(stale.name)
    assert reopened.existing_task_ids() == {r["task_id"] for r in rows}


def test_resume_sees_written_task_ids_and_drops_them(tmp_path: Path) -> None:
    first = [make_row(i) for i in range(6)]
    with ForkSink(tmp_path, JOB, flush_rows=4) as sink:
        for row in first:
            sink.add(row)

    resumed = ForkSink(tmp_path, JOB, flush_rows=4)
    assert resumed.existing_task_ids() == {r["task_id"] for r in first}
    assert resumed.seen(first[0]["task_id"])
    # At-least-once delivery from a retried actor: the same forks come back, plus new ones.
    accepted = [resumed.add(row) for row in [*first[3:], *[make_row(i) for i in range(6, 9)]]]
    assert accepted == [False] * 3 + [True] * 3
    assert resumed.duplicates_dropped == 3
    resumed.close()

    table = ForkSink.existing(tmp_path, JOB)
    assert table.to_pylist() == [*first, *[make_row(i) for i in range(6, 9)]]
    seqs = [int(p.name.split("-")[1]) for p in visible_parts(tmp_path)]
    assert sorted(seqs) == [1, 2, 3]  # the resumed sink numbers its parts after the old ones


def test_a_duplicate_within_one_run_is_dropped_even_before_it_is_flushed(tmp_path: Path) -> None:
    with ForkSink(tmp_path, JOB, flush_rows=100) as sink:
        assert sink.add(make_row(1))
        assert not sink.add(make_row(1))
        assert sink.add(make_row(2))
    assert sink.duplicates_dropped == 1
    assert len(ForkSink.existing(tmp_path, JOB)) == 2


def test_existing_is_an_empty_table_with_the_schema_before_any_write(tmp_path: Path) -> None:
    table = ForkSink.existing(tmp_path, "never-ran")
    assert len(table) == 0 and table.schema.equals(FORK_SCHEMA)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"tokens_in": "5"}, "tokens_in"),
        ({"tokens_in": True}, "tokens_in"),
        ({"attempt": 2**40}, "attempt"),
        ({"outcome": "high"}, "outcome"),
        ({"flipped": 1}, "flipped"),
        ({"stage": "warmup"}, "stage"),
        ({"status": "fine"}, "status"),
        ({"steps_intervened": ["2"]}, "steps_intervened"),
        ({"finished_at": datetime(2025, 1, 1)}, "finished_at"),  # naive: which zone?
        ({"finished_at": None}, "finished_at"),
        ({"job_id": "another-job"}, "job_id"),
    ],
)
def test_a_schema_violation_names_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    row = make_row(1) | change
    with ForkSink(tmp_path, JOB) as sink, pytest.raises(SchemaError, match=f"'{field}'") as err:
        sink.add(row)
    assert row["task_id"] in str(err.value)
    assert sink.rows_written == 0


def test_a_missing_required_field_is_named(tmp_path: Path) -> None:
    row = make_row(1)
    del row["spec"]
    with ForkSink(tmp_path, JOB) as sink, pytest.raises(SchemaError, match="'spec' is missing"):
        sink.add(row)


def test_fork_record_refuses_extras_that_overwrite_the_forks_own_fields() -> None:
    row = ForkRow.model_validate(
        {k: v for k, v in make_row(1).items() if k in ForkRow.model_fields}
    )
    with pytest.raises(SchemaError, match="'outcome'"):
        fork_record(row, {"outcome": 0.0})


def test_timestamps_in_other_zones_are_stored_as_the_same_instant(tmp_path: Path) -> None:
    local = datetime(2025, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    with ForkSink(tmp_path, JOB) as sink:
        sink.add(make_row(1) | {"finished_at": local})
    (stored,) = ForkSink.existing(tmp_path, JOB).column("finished_at").to_pylist()
    assert stored == FINISHED and stored.utcoffset() == timedelta(0)


def test_rows_are_flushed_when_the_interval_passes(tmp_path: Path) -> None:
    now = [100.0]
    sink = ForkSink(tmp_path, JOB, flush_rows=1000, flush_interval_s=2.0, clock=lambda: now[0])
    sink.add(make_row(0))
    now[0] = 101.9
    sink.add(make_row(1))
    assert visible_parts(tmp_path) == []
    now[0] = 102.0
    sink.add(make_row(2))  # due: the interval is checked on add
    assert len(visible_parts(tmp_path)) == 1 and sink.rows_written == 3

    sink.add(make_row(3))
    now[0] = 103.0
    assert sink.maybe_flush() == 0  # only one second since the last flush
    now[0] = 104.0
    assert sink.maybe_flush() == 1
    assert sink.maybe_flush() == 0  # nothing buffered: no empty part
    assert len(visible_parts(tmp_path)) == 2
    sink.close()
    assert len(ForkSink.existing(tmp_path, JOB)) == 4


def attribution_rows() -> list[dict[str, Any]]:
    return [
        {
            "job_id": JOB,
            "step": 2,
            "step_kind": "llm",
            "label": "sim-model",
            "intervention": "resample",
            "flip_rate": 0.8,
            "flip_lo": 0.7,
            "flip_hi": 0.9,
            "flip_n": 120,
            "phi": 0.5,
            "phi_lo": 0.4,
            "phi_hi": 0.6,
            "phi_se": 0.05,
            "necessity": 0.8,
            "necessity_lo": 0.7,
            "necessity_hi": 0.9,
            "necessity_n": 120,
            "sufficiency": 0.3,
            "sufficiency_lo": 0.2,
            "sufficiency_hi": 0.4,
            "sufficiency_n": 60,
            "rank": 1,
            "confidence": 0.95,
        },
        # A step the race eliminated before Shapley: no φ, necessity or sufficiency, no rank.
        {
            "step": 1,
            "step_kind": "tool",
            "label": "lookup_order",
            "intervention": "observation",
            "flip_rate": 0.05,
            "flip_lo": 0.0,
            "flip_hi": 0.2,
            "flip_n": 20,
            "necessity_n": 0,
            "sufficiency_n": 0,
        },
    ]


def test_attribution_parquet_round_trips(tmp_path: Path) -> None:
    path = write_attribution(tmp_path, JOB, attribution_rows())
    assert path == str(tmp_path / JOB / "attribution.parquet")
    table = pq.read_table(path)
    assert table.schema.equals(ATTRIBUTION_SCHEMA)
    expected = [
        {name: r.get(name) for name in ATTRIBUTION_SCHEMA.names} for r in attribution_rows()
    ]
    assert table.to_pylist() == expected
    from_duckdb = duckdb_read(path)
    assert from_duckdb.to_pylist() == expected

    write_attribution(tmp_path, JOB, attribution_rows()[:1])  # replaces, leaves no temp file
    assert len(pq.read_table(path)) == 1
    assert sorted(p.name for p in (tmp_path / JOB).iterdir()) == ["attribution.parquet"]


def test_an_attribution_row_with_a_bad_kind_names_the_field(tmp_path: Path) -> None:
    bad = attribution_rows()[0] | {"step_kind": "agent"}
    with pytest.raises(SchemaError, match=r"\(step=2\): field 'step_kind'"):
        write_attribution(tmp_path, JOB, [bad])
    assert not (tmp_path / JOB / "attribution.parquet").exists()


def test_job_json_round_trips(tmp_path: Path) -> None:
    assert JobInfo.read(tmp_path, JOB) is None
    note = Note(kind="screen", text="étape ✓", figures={"forks": 3})
    info = JobInfo(job_id=JOB, status="running", notes=[note], wall_s=0.25)
    path = info.write(tmp_path)
    assert JobInfo.read(tmp_path, JOB) == info
    written = {"kind": "screen", "severity": "info", "text": "étape ✓", "figures": {"forks": 3}}
    data = {"version": 2, "job_id": JOB, "status": "running", "notes": [written], "wall_s": 0.25}
    assert json.loads(Path(path).read_text("utf-8")) == data  # only the keys that were set
    assert Path(path).read_text("utf-8").startswith('{\n  "version": 2')  # pretty, for people

    info.status = "done"
    info.write(tmp_path)
    assert JobInfo.read(tmp_path, JOB) == info
    assert sorted(p.name for p in (tmp_path / JOB).iterdir()) == ["job.json"]
    info.wall_s = float("nan")
    with pytest.raises(ValueError, match=r"job\.json"):
        info.write(tmp_path)


def test_a_bad_job_id_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("job id '../escape'")):
        ForkSink(tmp_path, "../escape")
    assert list(tmp_path.iterdir()) == []


def test_any_pyarrow_filesystem_uri_holds_the_same_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pyarrow's in-memory mock filesystem stands in for S3 and friends (write, then move).
    memory = pafs.FileSystem.from_uri("mock:///")[0]
    monkeypatch.setattr(_output, "_from_uri", lambda uri: (memory, uri.split("://", 1)[1]))
    out = "mock://bucket/runs"
    with ForkSink(out, JOB, flush_rows=2) as sink:
        for i in range(5):
            sink.add(make_row(i))
    with memory.open_output_stream(f"bucket/runs/{JOB}/forks/.part-9-x.parquet.ab.tmp") as f:
        f.write(b"torn")
    resumed = ForkSink(out, JOB)
    assert resumed.existing_task_ids() == {make_row(i)["task_id"] for i in range(5)}
    assert not resumed.add(make_row(4))
    names = [i.base_name for i in memory.get_file_info(pafs.FileSelector(resumed.path))]
    assert len(names) == 3 and all(n.startswith("part-") for n in names)
    assert ForkSink.existing(out, JOB).to_pylist() == [make_row(i) for i in range(5)]

    write_attribution(out, JOB, attribution_rows())
    JobInfo(job_id=JOB, status="done").write(out)
    assert JobInfo.read(out, JOB) == JobInfo(job_id=JOB, status="done")
    with memory.open_input_file(f"bucket/runs/{JOB}/attribution.parquet") as f:
        assert len(pq.read_table(f)) == 2


# A writer that fills parts of ten rows as fast as it can. With "hold" it stops for good in
# its fourth rename (the part is written and fsynced under its temporary name), so the kill
# lands exactly between write and rename; with "free" the kill lands wherever it lands.
CRASH_WRITER = """
import os, sys, time
from datetime import UTC, datetime
from car_ray.results import ForkSink

out, mode = sys.argv[1], sys.argv[2]
real_replace, renames = os.replace, [0]

def replace(src, dst):
    renames[0] += 1
    if mode == "hold" and renames[0] == 4:
        print("holding", flush=True)
        time.sleep(600)
    real_replace(src, dst)

os.replace = replace
sink = ForkSink(out, "job-1", flush_rows=10, flush_interval_s=1e9)
for i in range(10**7):
    sink.add({
        "task_id": f"t{i:07d}", "tape_id": "tape-a", "status": "ok", "outcome": 1.0,
        "recorded_outcome": 1.0, "flipped": False, "steps_intervened": [1],
        "interventions": ["resample"], "tail": "live", "seed": i, "tail_calls": 2,
        "retries": 0, "tokens_in": 10, "tokens_out": 5, "cost_usd": 0.0, "latency_s": 0.0,
        "error": "x" * 2000, "fresh_draws": 1, "job_id": "job-1", "stage": "race", "spec": "{}",
        "worker": "w", "attempt": 1, "finished_at": datetime.now(UTC),
    })
"""


def run_crash_writer(out: Path, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(out), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if mode == "hold":
            assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        else:
            deadline = time.monotonic() + 30
            while len(visible_parts(out)) < 5 and time.monotonic() < deadline:
                time.sleep(0.002)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["hold", "free"])
def test_a_writer_killed_mid_job_leaves_only_whole_readable_parts(
    tmp_path: Path, mode: str
) -> None:
    run_crash_writer(tmp_path, mode)

    parts = visible_parts(tmp_path)
    assert len(parts) >= (3 if mode == "hold" else 5)
    for part in parts:
        assert pq.read_table(part).num_rows == 10  # whole: no part holds a partial batch
    if mode == "hold":
        assert len(parts) == 3
        (temp,) = [p for p in forks_dir(tmp_path).iterdir() if p.name.startswith(".")]
        assert temp.name.endswith(".tmp")
    names = [p.name for p in forks_dir(tmp_path).iterdir()]
    assert all(n.startswith((".", "part-")) or n == "_journal.jsonl" for n in names)

    ids = [f"t{i:07d}" for i in range(10 * len(parts))]  # parts are written in order
    glob = f"{forks_dir(tmp_path)}/*.parquet"
    assert [r["task_id"] for r in duckdb_rows(glob)] == ids
    dataset = pads.dataset(forks_dir(tmp_path), format="parquet")
    assert sorted(dataset.to_table(columns=["task_id"]).column("task_id").to_pylist()) == ids

    resumed = ForkSink(tmp_path, JOB)
    # Every row `add` took is there once: the parts' rows, then the journal's (in "hold",
    # the ten of the part that was never renamed).
    seen = sorted(resumed.existing_task_ids())
    assert seen[: len(ids)] == ids and seen == [f"t{i:07d}" for i in range(len(seen))]
    if mode == "hold":
        assert len(seen) == 40
    assert not [p for p in forks_dir(tmp_path).iterdir() if p.name.startswith(".")]


def test_part_files_carry_the_explicit_schema_without_car_ray(tmp_path: Path) -> None:
    with ForkSink(tmp_path, JOB) as sink:
        sink.add(make_row(0, scored=False))
    (part,) = visible_parts(tmp_path)
    schema = pq.read_schema(part)
    assert schema.field("outcome").type == pa.float64()
    assert schema.field("error").type == pa.string()
    assert schema.field("finished_at").type == pa.timestamp("us", tz="UTC")


# A driver that journals rows of `make_row` (datetimes, lists) and prints each index once
# `add` has returned; a resumed one skips what is on disk, as the scheduler does. With "hold"
# it stops for good in its first journal clear: the part is written, the journal still full.
JOURNAL_WRITER = """
import sys, time
from car_ray.results import ForkSink, _parquet
from tests.test_results import make_row

out, total, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "hold":
    def clear(self):
        print("holding", flush=True)
        time.sleep(600)
    _parquet._Journal.clear = clear
sink = ForkSink(out, "job-1", flush_rows=7, flush_interval_s=0.05)
have = sink.existing_task_ids()
for i in range(total):
    row = make_row(i)
    if row["task_id"] not in have:
        assert sink.add(row)
        print(i, flush=True)
sink.close()
print("closed", flush=True)
"""
ROOT = Path(__file__).resolve().parents[1]


def run_journal_writer(
    out: Path, total: int, *, kill_after_s: float | None = None, hold: bool = False
) -> tuple[list[int], list[str]]:
    """Run the writer; SIGKILL it `kill_after_s` after its first acknowledged row (or once
    it holds). Returns the indices `add` acknowledged and everything it printed."""
    mode = "hold" if hold else "free"
    proc = subprocess.Popen(
        [sys.executable, "-c", JOURNAL_WRITER, str(out), str(total), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        if kill_after_s is not None or hold:
            deadline = time.monotonic() + 30
            while not lines and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            if hold:
                while "holding\n" not in lines and time.monotonic() < deadline:
                    time.sleep(0.001)
            time.sleep(kill_after_s or 0.0)
            assert proc.poll() is None, "the writer ended before it was killed"
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    return [int(line) for line in lines if line.strip().isdigit()], lines


@pytest.mark.timeout(90)
def test_no_row_add_acknowledged_is_lost_when_the_driver_is_killed_at_random(
    tmp_path: Path,
) -> None:
    rng = random.Random(3)
    acked: set[int] = set()
    before: set[int] = set()
    journal_held_rows = 0
    for _ in range(3):
        taken, _ = run_journal_writer(tmp_path, 10**6, kill_after_s=rng.uniform(0.05, 0.6))
        acked |= set(taken)
        on_disk = ForkSink.existing(tmp_path, JOB).to_pylist()
        index = {make_row(i)["task_id"]: i for i in range(max(acked) + 2)}
        indices = [index[r["task_id"]] for r in on_disk]
        # Every acknowledged row, once, each exactly as it was added (datetimes, lists,
        # nulls); besides them only the one whose `add` the kill interrupted (durable, not
        # yet acknowledged) may be there.
        assert len(indices) == len(set(indices))
        assert acked <= set(indices)
        assert set(indices) - acked - before <= {max(taken) + 1}
        assert sorted(indices) == list(range(len(indices)))
        before = set(indices)
        assert by_task(on_disk) == by_task([make_row(i) for i in indices])
        journal_held_rows += len(indices) - len(duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet"))
    # The journal is what kept them: at each kill some rows were in no part yet.
    assert journal_held_rows > 0

    total = max(acked) + 20
    taken, printed = run_journal_writer(tmp_path, total)
    assert printed[-1] == "closed\n" and not acked & set(taken)
    expected = by_task([make_row(i) for i in range(total)])
    assert by_task(ForkSink.existing(tmp_path, JOB).to_pylist()) == expected
    # Closed, the journal is compacted away: the parts alone hold every row, once.
    assert duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet") == expected
    assert not (forks_dir(tmp_path) / "_journal.jsonl").exists()


@pytest.mark.timeout(60)
def test_rows_in_both_a_part_and_the_journal_count_once(tmp_path: Path) -> None:
    # Killed between writing a part and clearing the journal: its rows are in both.
    taken, _ = run_journal_writer(tmp_path, 10**6, hold=True)
    in_parts = duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet")
    # The rows acknowledged, and the one whose `add` was flushing when it stopped.
    written = [*taken, max(taken, default=-1) + 1]
    assert in_parts == by_task([make_row(i) for i in written])
    assert (forks_dir(tmp_path) / "_journal.jsonl").stat().st_size > 0
    assert by_task(ForkSink.existing(tmp_path, JOB).to_pylist()) == in_parts

    with ForkSink(tmp_path, JOB) as resumed:
        assert resumed.existing_task_ids() == {r["task_id"] for r in in_parts}
        assert resumed.add(make_row(100))
    rows = duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet")
    assert rows == by_task([*in_parts, make_row(100)])


def test_a_torn_last_journal_line_is_left_out_and_cut_before_the_next_row(
    tmp_path: Path,
) -> None:
    sink = ForkSink(tmp_path, JOB, flush_rows=100)
    local = datetime(2025, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    rows = [make_row(0, scored=False), make_row(1) | {"finished_at": local}, make_row(2)]
    for row in rows:
        sink.add(row)
    # What a kill in the middle of `add`'s write leaves: part of a line, never acknowledged.
    journal = forks_dir(tmp_path) / "_journal.jsonl"
    with journal.open("ab") as f:
        f.write(b'{"task_id": "torn", "tape_id": "ta')
    stored = [r | {"finished_at": r["finished_at"].astimezone(UTC)} for r in rows]
    assert ForkSink.existing(tmp_path, JOB).to_pylist() == stored

    resumed = ForkSink(tmp_path, JOB, flush_rows=100)
    assert resumed.add(make_row(3))
    lines = journal.read_bytes().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == [
        r["task_id"] for r in [*rows, make_row(3)]
    ]
    resumed.close()
    assert ForkSink.existing(tmp_path, JOB).to_pylist() == [*stored, make_row(3)]
    assert not journal.exists() and len(visible_parts(tmp_path)) == 1


def test_a_whole_but_unreadable_last_journal_line_is_left_out_and_cut(tmp_path: Path) -> None:
    # A crash can leave a long line's last page (with its newline) on disk and not an
    # earlier one: whole, unreadable, never acknowledged. Resume must not stop on it.
    sink = ForkSink(tmp_path, JOB, flush_rows=100)
    rows = [make_row(0), make_row(1)]
    for row in rows:
        sink.add(row)
    journal = forks_dir(tmp_path) / "_journal.jsonl"
    with journal.open("ab") as f:
        f.write(b"\0" * 40 + b'ed", "job_id": "x"}\n')
    assert [r["task_id"] for r in ForkSink.existing(tmp_path, JOB).to_pylist()] == [
        r["task_id"] for r in rows
    ]
    resumed = ForkSink(tmp_path, JOB, flush_rows=100)
    assert resumed.add(make_row(2))
    lines = journal.read_bytes().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == [
        r["task_id"] for r in [*rows, make_row(2)]
    ]
    resumed.close()


@pytest.mark.parametrize(
    ("code", "until"),
    [(errno.ENOSPC, "there is room"), (errno.EROFS, "it is writable again")],
)
def test_a_full_or_read_only_disk_refuses_the_row_in_one_line_and_keeps_every_row_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, until: str
) -> None:
    sink = ForkSink(tmp_path, JOB, flush_rows=4)
    for i in range(6):
        sink.add(make_row(i))  # rows 0-3 in a part, 4 and 5 in the journal

    def full(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(_output, "sync_data", full)
    with pytest.raises(OutputError) as refused:
        sink.add(make_row(6))
    message = str(refused.value)
    assert "\n" not in message
    assert f"{forks_dir(tmp_path)}/_journal.jsonl: {os.strerror(code)}. " in message
    assert f"run the same command again once {until} to resume the job" in message
    assert not sink.seen(make_row(6)["task_id"])  # not taken: the caller knows it is not kept
    with pytest.raises(OutputError, match=r"part-000002-.*\.parquet: "):
        sink.close()  # the last part cannot be written either; the journal keeps its rows

    monkeypatch.undo()
    # The refused row's bytes were cut off the journal: it reads cleanly, rows 0-5 once.
    assert ForkSink.existing(tmp_path, JOB).to_pylist() == [make_row(i) for i in range(6)]
    with ForkSink(tmp_path, JOB, flush_rows=4) as resumed:
        assert resumed.add(make_row(6))
    assert duckdb_rows(f"{forks_dir(tmp_path)}/*.parquet") == by_task(
        [make_row(i) for i in range(7)]
    )
