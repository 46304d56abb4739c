"""The one row model per table and the versioned job.json model, against output an older
car-ray wrote (tests/data/main_output: written at f4157cc, before these models): its Parquet
parts, journal, attribution table and job.json read, resume and rewrite unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from car_ray.cli import app
from car_ray.replay import ForkRow, Int32
from car_ray.results import (
    ATTRIBUTION_SCHEMA,
    FORK_SCHEMA,
    JOB_JSON_VERSION,
    ForkRecord,
    ForkSink,
    JobInfo,
    JobJsonError,
    Ledger,
    SchemaError,
    arrow_schema,
    read_attribution,
    write_attribution,
)
from car_ray.results._rows import FORK_ROWS, RowShape
from car_ray.schedule import Budget, BudgetGovernor, Cost

from .test_results import make_row

DATA = Path(__file__).parent / "data" / "main_output"
JOB = "support_refund-85f9a5398303ec68"
OLD = DATA / JOB


@pytest.fixture
def old_output(tmp_path: Path) -> Path:
    """A copy of the older car-ray's output folder (`<out>`; the job is `<out>/JOB`)."""
    shutil.copytree(OLD, tmp_path / "out" / JOB)
    return tmp_path / "out"


def _old_part() -> Path:
    (part,) = (OLD / "forks").glob("part-*.parquet")
    return part


# -- the fork row ---------------------------------------------------------------------------------


# Columns added after the older parts were written: nullable, so those parts still read.
ADDED = ("reproduced", "drawn")


def test_the_derived_fork_schema_is_the_one_older_parts_were_written_with() -> None:
    written = pq.read_schema(_old_part())
    added = [FORK_SCHEMA.field(name) for name in ADDED]
    assert all(f.nullable for f in added)
    kept = pa.schema([f for f in FORK_SCHEMA if f.name not in ADDED])
    assert written.equals(kept), written
    # An older part reads under today's schema, the added columns null.
    old = pads.dataset([str(_old_part())], schema=FORK_SCHEMA, format="parquet").to_table()
    assert old.num_rows and all(old.column(name).null_count == old.num_rows for name in ADDED)
    assert arrow_schema(ForkRecord) == FORK_SCHEMA
    # The widths and nulls the model's annotations carry: Int32, `X | None`, aware datetimes.
    assert FORK_SCHEMA.field("steps_intervened").type == pa.list_(pa.int32())
    assert FORK_SCHEMA.field("attempt").type == pa.int32()
    assert FORK_SCHEMA.field("seed").type == pa.int64()
    assert FORK_SCHEMA.field("finished_at").type == pa.timestamp("us", tz="UTC")
    assert FORK_SCHEMA.field("outcome").nullable and FORK_SCHEMA.field("worker").nullable
    assert not FORK_SCHEMA.field("fresh_draws").nullable  # a default is not a null
    assert FORK_SCHEMA.names[: len(ForkRow.model_fields)] == list(ForkRow.model_fields)


def test_a_job_resumes_on_fork_rows_an_older_car_ray_wrote(old_output: Path) -> None:
    before = ForkSink.existing(old_output, JOB).to_pylist()
    # The older part's rows, each with the columns added since as nulls.
    old_rows = [r | dict.fromkeys(ADDED) for r in pq.read_table(_old_part()).to_pylist()]
    # The part's 40 rows, then the 3 its journal held (a killed driver's), each once.
    assert len(before) == 43 and before[:40] == old_rows
    assert [r["status"] for r in before[40:]] == ["provider_error"] * 3

    new = make_row(1) | {"job_id": JOB}  # a fork of this run, as the driver builds it
    with ForkSink(old_output, JOB) as sink:
        assert sink.existing_task_ids() == {r["task_id"] for r in before}
        assert not sink.add(old_rows[7])  # written before: resume never duplicates it
        assert sink.add(new)
    forks = old_output / JOB / "forks"
    assert not (forks / "_journal.jsonl").exists()  # compacted into the new part
    parts = sorted(forks.glob("part-*.parquet"))
    assert len(parts) == 2 and pq.read_schema(parts[1]).equals(FORK_SCHEMA)
    # Readers see one dataset, old and new parts alike: the older part's added columns null.
    table = pads.dataset(forks, format="parquet", schema=FORK_SCHEMA).to_table()
    assert table.num_rows == 44 and table.schema.equals(FORK_SCHEMA)
    counted = duckdb.sql(f"select count(*) from read_parquet('{forks}/*.parquet')").fetchall()
    assert counted == [(44,)]
    both = f"read_parquet('{forks}/*.parquet', union_by_name = true)"
    nulls = duckdb.sql(f"select count(*) from {both} where reproduced is null").fetchall()
    assert nulls == [(44,)]
    after = ForkSink.existing(old_output, JOB).to_pylist()
    assert after[:40] == old_rows and {r["task_id"] for r in after} == {
        *(r["task_id"] for r in before),
        new["task_id"],
    }


def test_journal_lines_read_and_write_as_an_older_car_ray_wrote_them() -> None:
    """An older journal line reads, and is written back with its own keys and values, the
    columns added since as nulls."""
    lines = (OLD / "forks" / "_journal.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    for line in lines:
        written = json.loads(FORK_ROWS.to_json(FORK_ROWS.from_json(line)))
        old = json.loads(line)
        assert set(written) == set(old) | set(ADDED) and not set(old) & set(ADDED)
        assert {k: written[k] for k in old} == old and all(written[k] is None for k in ADDED)


def test_a_new_column_is_one_line_in_the_model() -> None:
    class Regional(ForkRecord):
        region: str | None = None
        shard: Int32 = 0

    shape = RowShape.of("fork row", "task_id", Regional)
    assert shape.schema.names == [*FORK_SCHEMA.names, "region", "shard"]
    assert shape.schema.field("region") == pa.field("region", pa.string(), nullable=True)
    assert shape.schema.field("shard") == pa.field("shard", pa.int32(), nullable=False)
    row = pq.read_table(_old_part()).to_pylist()[0]
    assert shape.normalize(row | {"shard": 3})["region"] is None
    with pytest.raises(SchemaError, match=r"field 'shard' is 2147483648 .*int32 range"):
        shape.normalize(row | {"shard": 2**31})
    # A Literal's values are the allowed ones, with no list kept beside the model.
    with pytest.raises(SchemaError, match=r"field 'stage' is 'sweep' .*one of arms, controls"):
        shape.normalize(row | {"stage": "sweep", "shard": 0})


def test_a_field_with_no_arrow_type_is_refused_by_name() -> None:
    class Odd(ForkRecord):
        extra: dict[str, int]

    with pytest.raises(TypeError, match=r"row field 'extra'"):
        arrow_schema(Odd)


# -- the attribution row --------------------------------------------------------------------------


# Attribution columns added after the older table was written: nullable, so it still reads.
ADDED_ATTRIBUTION = ("replaced",)


def test_attribution_rows_written_before_read_and_rewrite_unchanged(tmp_path: Path) -> None:
    old = pq.read_table(OLD / "attribution.parquet")
    kept = pa.schema([f for f in ATTRIBUTION_SCHEMA if f.name not in ADDED_ATTRIBUTION])
    assert old.schema.equals(kept), old.schema
    assert all(ATTRIBUTION_SCHEMA.field(name).nullable for name in ADDED_ATTRIBUTION)
    rows = read_attribution(DATA, JOB)
    assert rows is not None and rows == old.to_pylist()
    # Rewritten, the older rows keep every value and read None in the columns added since.
    write_attribution(tmp_path, JOB, rows)
    again = pq.read_table(tmp_path / JOB / "attribution.parquet")
    assert again.schema.equals(ATTRIBUTION_SCHEMA)
    assert again.select(kept.names).equals(old)
    assert all(again.column(name).null_count == again.num_rows for name in ADDED_ATTRIBUTION)


# -- job.json -------------------------------------------------------------------------------------


def test_a_job_json_without_a_version_reads_as_version_1_and_rewrites_byte_for_byte(
    old_output: Path,
) -> None:
    text = (OLD / "job.json").read_text("utf-8")
    assert '"version"' not in text
    info = JobInfo.read(DATA, JOB)
    assert info is not None and info.version == 1 and not info.model_extra
    assert info.status == "budget_exhausted" and info.tape is not None and info.ledger
    assert info.ledger.spent.forks == 40 and info.ledger.open == {}
    assert info.stages["shapley"].forks > 0 and info.shapley_candidates == [2, 4]
    # The same keys, order and values; the version is the one line added.
    assert info.to_json() == text.replace("{\n", '{\n  "version": 1,\n', 1)
    info.write(old_output)
    assert JobInfo.read(old_output, JOB) == info


def test_a_job_json_of_the_first_runner_still_reads() -> None:
    # As the first runner wrote it (6bd246a): epoch times, no open reservations, no code
    # digests, `ray.embedded`, a three-key progress.
    caps = {"max_forks": 100, "max_usd": None, "max_tokens": None, "max_wall_s": None}
    first = {
        "job_id": "job-1",
        "status": "budget_exhausted",
        "request": {"agent": "a:b", "scorer": "a:c"},
        "tape": {"id": "t" * 64, "path": "job/demo.tape", "steps": 7},
        "budget": caps,
        "started": 1763900000.5,
        "versions": {"car_ray": "0.1.0", "ray": "2.60.0", "pyarrow": "26.0.1"},
        "ray": {"embedded": True, "address": "127.0.0.1:6379", "nodes": 1, "cpus": 2.0},
        "workers": [101, 102],
        "ledger": {
            "caps": caps,
            "spent": {"forks": 90, "usd": 0.0, "tokens": 9000},
            "reserved": {"forks": 10, "usd": 0.0, "tokens": 1000},
            "remaining": {"forks": 0, "usd": None, "tokens": None, "wall_s": None},
            "in_flight": 10,
            "settled": 90,
            "lost": 0,
            "elapsed_s": 12.5,
            "exhausted": "max_forks",
        },
        "progress": {"done": 90, "lost": 0, "stage": "race"},
        "finished": 1763900013.0,
        "wall_s": 12.5,
        "lost_forks": 0,
        "stages": {"screen": {"forks": 90, "wall_s": 10.0}},
        "recorded_outcome": 1.0,
    }
    info = JobInfo.parse(json.dumps(first).encode(), "out/job-1/job.json")
    assert info.version == 1 and info.started == 1763900000.5 and not info.code
    assert info.ledger is not None and info.ledger.open is None  # so all reserved is carried
    assert (
        info.ray is not None and info.ray.how is None and info.ray.model_extra == {"embedded": True}
    )
    assert json.loads(info.to_json()) == {"version": 1, **first}


def test_car_ray_show_reads_a_job_an_older_car_ray_wrote(old_output: Path) -> None:
    shown = CliRunner().invoke(app, ["show", str(old_output / JOB), "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout)
    assert summary["status"] == "budget_exhausted" and summary["spent"]["forks"] == 40
    # It ended on its budget (its top never separated): a lead, not a step to fix; the
    # injected tool result it replaced is the root.
    assert summary["verdict"].startswith("verdict: the tool result at step 1"), summary
    assert "; most likely the agent went wrong at step 4, where" in summary["verdict"]


def test_a_job_json_from_a_newer_car_ray_is_refused_naming_the_file(old_output: Path) -> None:
    path = old_output / JOB / "job.json"
    data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    newer = JOB_JSON_VERSION + 1
    path.write_text(json.dumps({**data, "version": newer}), "utf-8")
    with pytest.raises(JobJsonError, match=rf"job\.json version {newer}, written by a newer"):
        JobInfo.read(old_output, JOB)
    shown = CliRunner().invoke(app, ["show", str(old_output / JOB)], env={"COLUMNS": "300"})
    assert shown.exit_code != 0
    assert str(path) in shown.output and "Upgrade car-ray" in shown.output
    # A key of the wrong type is named, with the file.
    path.write_text(json.dumps({**data, "ledger": {"spent": {"forks": "many"}}}), "utf-8")
    with pytest.raises(JobJsonError, match=r"job\.json: key 'ledger\.spent\.forks'"):
        JobInfo.read(old_output, JOB)


def test_the_ledger_model_holds_every_key_of_the_governors_snapshot() -> None:
    governor = BudgetGovernor(Budget(max_forks=10, max_usd=1.0), carried=Cost(1, 0.01, 10))
    assert governor.try_reserve("a#0", Cost(1, 0.02, 100))
    assert governor.try_reserve("b#0", Cost(1, 0.02, 100))
    governor.settle("a#0", Cost(1, 0.01, 50))
    snapshot = governor.snapshot()
    ledger = Ledger.model_validate(snapshot)
    assert not ledger.model_extra, "a snapshot key the job.json model does not declare"
    assert ledger.model_dump(mode="json") == json.loads(json.dumps(snapshot))
