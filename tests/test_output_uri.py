"""Job output on s3://, against a real S3-compatible server: moto's standalone server, an HTTP
process on 127.0.0.1 started here and stopped by its pid. Real `car-ray attribute` processes
write to it; pyarrow reads their output back as one dataset; a killed driver resumes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from car_ray.attribute import attribute, find_job
from car_ray.cli import app
from car_ray.job import load_job
from car_ray.results import (
    ForkSink,
    JobBusy,
    JobDir,
    JobInfo,
    _lock,
    hold_job,
    job_location,
    shown,
    split_job_location,
)
from car_ray.results._output import staging_folder
from car_ray.schedule import job_id_of
from car_ray.tape import Tape, load_tape

from .conftest import (
    ROOT,
    SUPPORT_JOB,
    attribute_command,
    start_attribute,
    stop_session,
    support_job_file,
)

BUCKET = "car-ray-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pafs.S3FileSystem]:
    """moto's S3 server on 127.0.0.1 with one bucket, and the environment a user sets for an
    S3-compatible endpoint (the AWS variables pyarrow reads). Stopped by its pid after."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "not-a-real-secret-8f2c",
        "AWS_DEFAULT_REGION": "us-east-1",
        "CAR_RAY_STAGING": str(tmp_path_factory.mktemp("staging")),
    }
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, "moto's server exited at start"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, "moto's server never listened"
            time.sleep(0.1)
        fs = pafs.S3FileSystem(
            endpoint_override=env["AWS_ENDPOINT_URL"], allow_bucket_creation=True
        )
        fs.create_dir(BUCKET)
        yield fs
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_session(server, timeout_s=10)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "200"}


def _forks(s3: pafs.S3FileSystem, folder: str) -> list[dict[str, Any]]:
    """The fork rows as any reader sees them: the Parquet parts under `<folder>/forks` on S3."""
    dataset = pads.dataset(f"{folder}/forks", format="parquet", filesystem=s3)
    return dataset.to_table().to_pylist()


def _job_json(s3: pafs.S3FileSystem, folder: str) -> dict[str, Any]:
    with s3.open_input_stream(f"{folder}/job.json") as f:
        value: dict[str, Any] = json.loads(f.read())
        return value


def _job_id(job_file: Path, tape: Path) -> str:
    return job_id_of(load_job(job_file), load_tape(tape))


def test_an_attribution_on_s3_reads_as_one_dataset_shows_and_resumes(
    s3: pafs.S3FileSystem, ray_local: None, support_tape: Tape
) -> None:
    job = load_job(SUPPORT_JOB)
    out = f"s3://{BUCKET}/run"
    job_id = job_id_of(job, support_tape)
    folder = f"{BUCKET}/run/{job_id}"

    first = Console(file=io.StringIO(), width=200)
    attribute(job, tape=support_tape, out=out, max_forks=20, console=first)
    rows = _forks(s3, folder)
    assert rows and len(rows) <= 20
    assert _job_json(s3, folder)["runs"] == 1

    # The same job with a larger cap resumes on the same URI: no fork runs twice.
    second = Console(file=io.StringIO(), width=200)
    where, outcome = attribute(job, tape=support_tape, out=out, max_forks=40, console=second)
    assert where == f"{out}/{job_id}"
    assert f"resuming: {len(rows)} rows on disk" in second.file.getvalue()
    after = _forks(s3, folder)
    ids = [r["task_id"] for r in after]
    assert len(ids) == len(set(ids)), "a fork was written twice"
    assert {r["task_id"] for r in rows} < set(ids)
    info = _job_json(s3, folder)
    assert info["runs"] == 2 and info["resumed_rows"] == len(rows)
    assert info["status"] == outcome.status
    assert info["ledger"]["spent"]["forks"] <= 40
    # The attribution table is an object beside the parts, read as it is.
    with s3.open_input_file(f"{folder}/attribution.parquet") as f:
        attribution = pq.read_table(f).to_pylist()
    assert {r["job_id"] for r in attribution} == {job_id}
    assert len(attribution) == len(outcome.attribution)
    assert s3.get_file_info(f"{folder}/report.html").size > 100_000
    # Nothing left behind: no lock object, no temporary object, no staging journal.
    names = {i.base_name for i in s3.get_file_info(pafs.FileSelector(folder, recursive=True))}
    assert "run.lock" not in names and not any(n.endswith(".tmp") for n in names)
    assert not os.path.exists(staging_folder(JobDir.of(out, job_id)))

    # `show` reads the job back from the URI: the verdict the run ended with.
    shown_ = CliRunner().invoke(app, ["show", f"{out}/{job_id}", "--json"])
    assert shown_.exit_code == 0, shown_.output
    summary = json.loads(shown_.stdout)
    assert summary["folder"] == f"{out}/{job_id}" and summary["job_id"] == job_id
    assert summary["verdict"] == info["verdict"]
    # A job id (or a prefix of it) is looked up under an --out URI as under a folder.
    assert find_job(job_id[:12], out) == f"{out}/{job_id}"
    # No secret of the environment reaches what car-ray printed.
    for text in (first.file.getvalue(), second.file.getvalue(), shown_.output):
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text


def test_a_driver_killed_mid_run_on_s3_resumes_with_no_flushed_row_lost(
    s3: pafs.S3FileSystem, tmp_path: Path, demo_tape_path: Path
) -> None:
    job_file = support_job_file(
        tmp_path / "job", demo_tape_path, sim_latency_ms="30", max_forks="80", concurrency="16"
    )
    out = f"s3://{BUCKET}/killed"
    job_id = _job_id(job_file, demo_tape_path)
    folder = f"{BUCKET}/killed/{job_id}"
    parts = pafs.FileSelector(f"{folder}/forks", allow_not_found=True)
    first = start_attribute(job_file, out, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        written: list[str] = []
        while time.monotonic() < deadline:
            written = [i.path for i in s3.get_file_info(parts) if i.base_name.startswith("part-")]
            if written:
                break
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.1)
        assert written, "the first run never wrote a part"
        assert first.poll() is None, "the first run ended before the kill"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        # The driver's own Ray and simulated provider die with its session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    # What reached S3 (whole parts only), and what this machine also journaled since.
    flushed = {r["task_id"] for r in _forks(s3, folder)}
    before = ForkSink.existing(out, job_id).to_pylist()
    assert flushed and flushed <= {r["task_id"] for r in before}
    # The killed run's lease object is still there; its holder is gone, so it is free.
    assert s3.get_file_info(f"{folder}/run.lock").type == pafs.FileType.File

    second = subprocess.run(
        attribute_command(job_file, out),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    after = _forks(s3, folder)
    ids = [r["task_id"] for r in after]
    assert len(ids) == len(set(ids)), "a fork was written twice"
    assert flushed <= set(ids), "a row flushed to S3 before the kill is gone"
    assert {r["task_id"] for r in before} <= set(ids), "a journaled row is gone"
    final = _job_json(s3, folder)
    assert final["resumed_rows"] == len(before) and final["runs"] == 2
    assert final["ledger"]["spent"]["forks"] <= 80


def test_one_run_holds_an_s3_output_and_a_run_that_lost_it_writes_no_part(
    s3: pafs.S3FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = f"s3://{BUCKET}/lease"
    with hold_job(out, "job-1") as held:
        held.check()
        busy = rf"pid {os.getpid()} on {socket.gethostname()}"
        with pytest.raises(JobBusy, match=busy), hold_job(out, "job-1"):
            pass
    with hold_job(out, "job-1"):  # released at the end of the block: free again
        pass
    assert s3.get_file_info(f"{BUCKET}/lease/job-1/run.lock").type == pafs.FileType.NotFound

    # A lease of another host holds until it expires (its holder may be running there).
    lease = JobDir.of(out, "job-3")
    elsewhere = {"owner": "x", "pid": 1, "host": "elsewhere", "since": "then"}
    lease.write_atomic(json.dumps({**elsewhere, "expires": time.time() + 60}).encode(), "run.lock")
    with pytest.raises(JobBusy, match="pid 1 on elsewhere, since then"), hold_job(out, "job-3"):
        pass
    lease.write_atomic(json.dumps({**elsewhere, "expires": time.time() - 1}).encode(), "run.lock")
    with hold_job(out, "job-3") as held:
        held.check()

    # A run whose lease was taken over (it could not renew in time) stops writing parts; the
    # rows it took stay in its journal.
    monkeypatch.setattr(_lock, "LEASE_S", 0.6)
    job = JobDir.of(out, "job-2")
    with hold_job(out, "job-2") as held:
        other = {"owner": "another", "pid": 1, "host": "elsewhere", "since": "now", "expires": 0}
        job.write_atomic(json.dumps(other).encode(), "run.lock")
        time.sleep(0.6)
        with pytest.raises(JobBusy, match="pid 1 on elsewhere"):
            held.check()
        sink = ForkSink(out, "job-2", flush_rows=1000, guard=held.check)
        sink.add(_row("job-2"))
        with pytest.raises(JobBusy):
            sink.flush()
    assert ForkSink.existing(out, "job-2").num_rows == 1  # journaled, on this machine
    assert not [
        i for i in s3.get_file_info(pafs.FileSelector(job.join("forks"), allow_not_found=True))
    ]


def test_credentials_in_an_output_uri_are_refused_without_being_printed(
    s3: pafs.S3FileSystem, tmp_path: Path, demo_tape_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = support_job_file(tmp_path / "job", demo_tape_path)
    command = ["attribute", str(job_file), "--out", f"s3://AKIAX:hunter2@{BUCKET}/r"]
    refused = CliRunner().invoke(app, command)
    assert refused.exit_code == 2
    assert "hunter2" not in refused.output
    assert "AWS_SECRET_ACCESS_KEY" in refused.stderr
    show = CliRunner().invoke(app, ["show", f"s3://AKIAX:hunter2@{BUCKET}/r/job-1"])
    assert show.exit_code == 2 and "hunter2" not in show.output
    assert "carries credentials" in show.stderr
    # Locations: the job id goes before a query; messages print neither query nor user.
    uri = f"s3://{BUCKET}/run?endpoint_override=127.0.0.1:9000&scheme=http"
    folder = job_location(uri, "job-1")
    assert folder == f"s3://{BUCKET}/run/job-1?endpoint_override=127.0.0.1:9000&scheme=http"
    assert split_job_location(folder) == (uri, "job-1")
    assert shown(folder) == f"s3://{BUCKET}/run/job-1"

    # An endpoint that does not answer is one line that names the output, not a traceback.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    unreachable = CliRunner().invoke(app, ["show", f"s3://{BUCKET}/run/job-1"])
    assert unreachable.exit_code == 2
    (line,) = unreachable.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot reach s3://{BUCKET}/run/job-1: ")
    assert "AWS_ENDPOINT_URL" in line


def _row(job_id: str) -> dict[str, Any]:
    from datetime import UTC, datetime

    return {
        "task_id": "t1", "tape_id": "tape-a", "status": "ok", "outcome": 1.0,
        "recorded_outcome": 1.0, "flipped": False, "steps_intervened": [1],
        "interventions": ["resample"], "tail": "live", "seed": 1, "tail_calls": 2,
        "retries": 0, "tokens_in": 10, "tokens_out": 5, "cost_usd": 0.0, "latency_s": 0.0,
        "error": None, "fresh_draws": 1, "job_id": job_id, "stage": "race", "spec": "{}",
        "worker": "w", "attempt": 1, "finished_at": datetime.now(UTC),
    }  # fmt: skip


def test_a_file_uri_is_a_local_folder_with_its_journal_and_lock(tmp_path: Path) -> None:
    out = f"file://{tmp_path}/runs"
    with hold_job(out, "job-1"), ForkSink(out, "job-1", flush_rows=1000) as sink:
        sink.add(_row("job-1"))
        # A local folder keeps its journal beside the parts (no staging folder).
        assert (tmp_path / "runs/job-1/forks/_journal.jsonl").stat().st_size > 0
        assert (tmp_path / "runs/job-1/run.lock").exists()
    JobInfo(job_id="job-1", status="done").write(out)
    assert find_job("job-1", out) == f"{out}/job-1"
    assert find_job(f"{out}/job-1") == f"{out}/job-1"
    (part,) = (tmp_path / "runs/job-1/forks").glob("part-*.parquet")
    assert pq.read_table(part).column("task_id").to_pylist() == ["t1"]


def test_a_batch_reads_failing_runs_from_s3_and_writes_its_traces_there(
    s3: pafs.S3FileSystem, tmp_path: Path
) -> None:
    """`car-ray batch --from s3://...`: a night's recording folder copied to an object store
    (tapes, marks, manifest) is read there; a run marked passed is left out, a damaged one is
    reported, the others name their planted cause, and the output is one dataset on S3."""
    from car_ray.batch import batch_forks, find_tapes, read_manifest_for, run_batch
    from car_ray.recorder import mark_tape, read_manifest

    traces = tmp_path / "night"
    subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "nightly" / "generate.py"), str(traces),
         "--count", "3", "--corrupt", "1", "--seed", "5"],
        check=True, cwd=ROOT, env=_env(),
    )  # fmt: skip
    good = sorted(n for n, e in read_manifest(traces).items() if e.planted != "corrupt")
    mark_tape(traces / good[0], failed=False, reason="the customer was right after all")
    pafs.copy_files(
        str(traces),
        f"{BUCKET}/night",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=s3,
    )
    source = f"s3://{BUCKET}/night"
    given = find_tapes(source, [])
    assert len(given) == 3 and all(g.startswith(source + "/") for g in given)
    assert not any(g.endswith("/" + good[0]) for g in given)
    manifest = read_manifest_for(None, source)
    assert len(manifest) == 4

    job = load_job(ROOT / "jobs" / "nightly" / "job.toml")
    quiet = Console(file=io.StringIO(), width=120)
    result = run_batch(
        job, given, out=f"s3://{BUCKET}/out", max_forks=300, manifest=manifest, console=quiet
    )
    assert result.exit_code == 0, result.rows
    rows = {r.tape.rsplit("/", 1)[1]: r for r in result.rows}
    assert all(r.tape.startswith(source + "/") for r in result.rows)
    statuses = sorted(r.status for r in rows.values())
    assert statuses == ["complete", "complete", "corrupt"], rows
    for name, row in rows.items():
        if row.status == "complete":
            assert row.top_step == manifest[name]["step"], row
    # What it wrote is on S3, every trace's forks readable as one dataset.
    assert result.folder.startswith(f"s3://{BUCKET}/out/")
    forks = batch_forks(result.folder).to_table().to_pylist()
    assert len(forks) == result.info.spent.forks > 0
    assert {f["trace"] for f in forks} == {
        r.folder.removeprefix("trace=") for r in rows.values() if r.status == "complete"
    }
