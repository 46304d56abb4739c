"""Attribution jobs run as Ray Jobs: `car-ray submit`, `jobs`, `status`, `logs`, `stop`, and
where `results` finds a submitted job's output.

The client side of a Ray head's job server (its dashboard, `http://HOST:8265`), through
Ray's `JobSubmissionClient`. A submission carries the job's folder as its `working_dir`, so
the cluster needs nothing of the job at the same paths; its entrypoint is `car-ray attribute`
joining the cluster it runs on. Ray stops a job with SIGINT (`RAY_JOB_STOP_SIGNAL`), which
`attribute` takes as Ctrl-C: forks in flight settle, rows and results are written. The
submission's metadata names the job's id and output folder, so `results ID` finds them."""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from ._notes import Note
from .job import Job
from .results import JobDir, has_job, is_uri, job_location, shown, split_job_location
from .tape import Tape

log = structlog.get_logger("car_ray.cluster")

# Where a submission's output is, in its metadata (Ray keeps metadata as str -> str).
JOB_ID_KEY = "car_ray_job_id"
OUT_KEY = "car_ray_out"
JOB_FILE_KEY = "car_ray_job_file"
# The job server's address when --address is not given, in the order Ray's `ray job` reads.
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
# Ray's stop: SIGINT (attribute's Ctrl-C: stop submitting, let forks in flight settle up to
# 5 s, write the table), and time for that before Ray's SIGKILL.
STOP_ENV = {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "60"}
STOP_WAIT_S = 90.0
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
# What Ray's job server answers (HTTP 500) while a head that has just started has no job agent
# up yet; a submission waits for one up to AGENT_WAIT_S.
NO_AGENT_YET = "No available agent to submit job"
AGENT_WAIT_S = 60.0
# Not sent to the cluster: caches, version control, editor files.
_NOT_SENT = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".mypy_cache", ".*.swp")
# Terminal control bytes other than tab and newline, in text the cluster sends back.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class ClusterError(ValueError):
    """A job server that cannot be reached or refuses, an unknown submission, a job that
    cannot be submitted: one line for the user, naming the address or the id."""


@dataclass(frozen=True)
class Submission:
    """What `submit` did: Ray's submission id, the car-ray job id, where its output goes."""

    submission_id: str
    job_id: str
    out: str
    address: str

    @property
    def folder(self) -> str:
        return job_location(self.out, self.job_id)


def job_server_address(address: str | None) -> str | None:
    """The job server to talk to: `--address`, else RAY_API_SERVER_ADDRESS, else RAY_ADDRESS
    (as Ray's `ray job` commands read them); None when there is none."""
    if address:
        return address
    for name in ADDRESS_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _require(address: str | None) -> str:
    """The job server's URL: a bare `host:port` is the dashboard's (http); `auto` and
    `ray://` addresses are left for Ray to resolve."""
    found = job_server_address(address)
    if found is None:
        raise ClusterError(
            "no cluster given: pass --address http://HEAD:8265 (the head's dashboard), or set "
            "RAY_API_SERVER_ADDRESS"
        )
    if found == "auto" or "://" in found:
        return found.rstrip("/")
    return f"http://{found}".rstrip("/")


def connect(address: str | None) -> Any:
    """A `JobSubmissionClient` for the job server at `address` (see `job_server_address`),
    sending the cluster's token when one is at hand, as `car-ray attribute --address` does
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token). `ClusterError` at once when
    nothing answers there, or the server refuses the token."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from .execute._ray import ClusterUnreachable, _probe, _token_auth_if_available

    url = _require(address)
    # Ray's notices (token mode on, each package uploaded) are not this command's output.
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    for name in (
        "ray.dashboard.modules.dashboard_sdk",
        "ray.dashboard.modules.job.sdk",
        "ray._private.runtime_env.packaging",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    where = urlsplit(url)
    if where.scheme in ("http", "https"):
        try:
            port = where.port or (443 if where.scheme == "https" else 80)
        except ValueError:
            port = None
        if not where.hostname or port is None:
            raise ClusterError(f"--address {url!r} is not a URL like http://HOST:8265")
        host = f"[{where.hostname}]" if ":" in where.hostname else where.hostname
        try:
            _probe(
                f"{host}:{port}",
                what="reach the Ray job server",
                start="ray start --head --dashboard-port {port}",
            )
        except ClusterUnreachable as exc:
            raise ClusterError(f"{exc} (--address is the head's dashboard, {url!r} here)") from None
    _token_auth_if_available()
    # Ray's client takes RAY_API_SERVER_ADDRESS (then RAY_ADDRESS) over its argument: the
    # address chosen above is the one it must use.
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    try:
        return JobSubmissionClient(url)
    except AuthenticationError as exc:
        raise ClusterError(
            f"the Ray job server at {url} refused this client: {str(exc).splitlines()[0]} "
            "(its token goes in RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names, or in "
            "~/.ray/auth_token)"
        ) from None
    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
        raise ClusterError(
            f"no Ray job server at {url}: {exc} (--address is the head's dashboard, "
            "http://HOST:8265, not its GCS port)"
        ) from None


@contextmanager
def _staged(job: Job, tapes: list[Path], out: str) -> Iterator[Path]:
    """A temporary folder holding a copy of the job's folder (under its own name, so the
    job's name and `module:attr` refs are the same on the cluster); never the output."""
    folder = job.folder.resolve()
    for tape in tapes:
        if not tape.resolve().is_relative_to(folder):
            raise ClusterError(
                f"{job.path}: the tape {tape} is outside the job's folder {folder}; `car-ray "
                "submit` sends that folder to the cluster: move the tape into it"
            )
    output = None if is_uri(out) else Path(out).resolve()

    def skipped(where: str, names: list[str]) -> set[str]:
        return set(_NOT_SENT(where, names)) | {n for n in names if Path(where, n) == output}

    with tempfile.TemporaryDirectory(prefix="car-ray-submit-") as stage:
        shutil.copytree(folder, Path(stage, folder.name), ignore=skipped)
        yield Path(stage)


def entrypoint(job: Job, out: str, extra: list[str]) -> str:
    """The command the cluster runs in the job's unpacked folder: `car-ray attribute` (its
    `python -m` form: a cluster's PATH may lack the script) joining the cluster it runs on
    (Ray sets RAY_ADDRESS for a job's driver)."""
    job_file = f"{job.folder.name}/{job.path.name}"
    args = ["python", "-m", "car_ray.cli", "attribute", job_file, "--address", "auto"]
    return "exec " + shlex.join([*args, "--out", out, *extra])


def submit(
    job: Job,
    tape: Tape,
    *,
    address: str | None,
    out: str | None = None,
    extra: list[str] | None = None,
) -> Submission:
    """Submit `car-ray attribute` of `job` on `tape` (checked here first, as `attribute`
    checks it before Ray) as a Ray Job. `out` is a folder on the cluster's head (a relative
    one is made absolute here: the same folder on a one-machine cluster) or a filesystem URI
    (s3://...: the driver on the cluster reads its credentials from its own environment)."""
    from .schedule import job_id_of

    client = connect(address)
    job_id = job_id_of(job, tape)
    out_dir = out or job.spec.out
    if is_uri(out_dir):
        JobDir.of(out_dir, job_id)  # credentials in the URI are refused before they travel
    else:
        out_dir = str(Path(out_dir).absolute())
    with _staged(job, job.tape_paths, out_dir) as stage:
        request: dict[str, Any] = {
            "entrypoint": entrypoint(job, out_dir, extra or []),
            "runtime_env": {"working_dir": str(stage), "env_vars": dict(STOP_ENV)},
            "metadata": {
                JOB_ID_KEY: job_id,
                OUT_KEY: out_dir,
                JOB_FILE_KEY: str(job.path.absolute()),
            },
        }
        waited_until = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                submission_id: str = client.submit_job(**request)
                break
            except (RuntimeError, ValueError, OSError) as exc:
                # A head that has just started answers 500 until its job agent is up.
                if NO_AGENT_YET in str(exc) and time.monotonic() < waited_until:
                    log.info("job_agent_not_ready", address=client.get_address())
                    time.sleep(1.0)
                    continue
                raise ClusterError(
                    f"the job server at {client.get_address()} refused: {exc}"
                ) from None
    return Submission(submission_id, job_id, out_dir, client.get_address())


def job_info(client: Any, submission_id: str) -> Any:
    """Ray's `JobDetails` of a submission; `ClusterError` naming it if the cluster has no
    such job."""
    try:
        return client.get_job_info(submission_id)
    except RuntimeError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            raise ClusterError(
                f"no job {submission_id!r} on the cluster at {client.get_address()} (`car-ray "
                f"jobs --address {client.get_address()}` lists them)"
            ) from None
        raise ClusterError(f"{client.get_address()}: {exc}") from None


def list_jobs(client: Any) -> list[Any]:
    """Every submitted job the cluster knows, oldest first."""
    try:
        jobs = client.list_jobs()
    except RuntimeError as exc:
        raise ClusterError(f"{client.get_address()}: {exc}") from None
    submitted = [j for j in jobs if j.submission_id]
    return sorted(submitted, key=lambda j: j.start_time or 0)


def describe(info: Any) -> dict[str, Any]:
    """A submission as plain data: id, status, Ray's message, the car-ray job and output
    folder (when car-ray submitted it), and start and end times (ISO 8601, UTC)."""
    meta = info.metadata or {}
    job_id, out = meta.get(JOB_ID_KEY), meta.get(OUT_KEY)
    return {
        "submission_id": info.submission_id,
        "status": str(getattr(info.status, "value", info.status)),
        "message": info.message or "",
        "job_id": job_id,
        "folder": job_location(out, job_id) if job_id and out else None,
        "job_file": meta.get(JOB_FILE_KEY),
        "started": _iso_ms(info.start_time),
        "ended": _iso_ms(info.end_time),
    }


def _iso_ms(epoch_ms: int | None) -> str | None:
    from datetime import UTC, datetime

    if not epoch_ms:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def logs(client: Any, submission_id: str) -> str:
    """The job's output so far (its driver's stdout and stderr)."""
    job_info(client, submission_id)
    return clean(str(client.get_job_logs(submission_id)))


def follow_logs(client: Any, submission_id: str, write: Callable[[str], None]) -> str:
    """Write the job's output as it comes, until the job ends; returns its final status."""
    from ._aio import run as run_loop

    job_info(client, submission_id)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(submission_id):
            write(clean(chunk))

    run_loop(tail())
    return wait_for(client, submission_id, timeout_s=30.0)


def wait_for(client: Any, submission_id: str, timeout_s: float) -> str:
    """The job's status once it is SUCCEEDED, FAILED or STOPPED, or when `timeout_s` ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = describe(job_info(client, submission_id))["status"]
        if status in TERMINAL or time.monotonic() > deadline:
            return str(status)
        time.sleep(0.5)


def stop(client: Any, submission_id: str) -> bool:
    """Ask the cluster to stop the job (SIGINT to its driver, then SIGKILL after 60 s);
    False if it had already ended."""
    job_info(client, submission_id)
    try:
        return bool(client.stop_job(submission_id))
    except RuntimeError as exc:
        raise ClusterError(f"{client.get_address()}: {exc}") from None


@dataclass(frozen=True)
class Found:
    """A job's output folder, and where else its tape may be: a submitted job ran from a
    copy of its folder that the cluster may have removed; the submitter's is here."""

    folder: str
    tape_path: str | None = None


def results_folder(target: str, out: str, address: str | None) -> Found:
    """The output folder `car-ray results` reads: `target` as `car-ray show` finds it (a
    folder, or a job id or name under `out`), else a submission on the cluster at `address`
    (or RAY_ADDRESS), from the output folder its metadata names."""
    from .attribute import find_job

    try:
        return Found(find_job(target, out))
    except ValueError as missing:
        if job_server_address(address) is None:
            raise ValueError(
                f"{missing}; a submission id needs --address (or RAY_API_SERVER_ADDRESS, or "
                "RAY_ADDRESS)"
            ) from None
    client = connect(address)
    info = describe(job_info(client, target))
    folder = info["folder"]
    if folder is None:
        raise ClusterError(f"{target} was not submitted by `car-ray submit`: no results to read")
    if has_job(folder):
        return Found(str(folder), _submitted_tape(info["job_file"]))
    if info["status"] in ("PENDING", "RUNNING"):
        raise ClusterError(
            f"no results yet: job {target} is {info['status']} and has not written "
            f"{folder}/job.json (`car-ray logs {target} --follow` shows its progress)"
        )
    if info["status"] == "FAILED":
        raise ClusterError(
            f"job {target} FAILED before it wrote {folder}/job.json: {info['message']} "
            f"(`car-ray logs {target}` says why)"
        )
    raise ClusterError(
        f"{folder} is not on this machine: job {target} wrote it on the cluster's head; run "
        f"`car-ray results {folder}` there"
    )


def partial_note(folder: str, outcome: Any) -> Note | None:
    """What a job's output holds when its job.json still says `running`: the job runs, or
    it was killed before it could write its table. The rows it streamed are on disk."""
    from .results import ForkSink

    if outcome.status != "running":
        return None
    out, job_id = split_job_location(folder)
    rows = ForkSink.existing(out, job_id).num_rows
    where = (
        "Parquet parts, and this machine's staging journal"
        if is_uri(folder)
        else "Parquet parts and _journal.jsonl"
    )
    return Note(
        kind="partial",
        severity="error",
        text=f"PARTIAL: {shown(folder)} holds no finished run: job.json says 'running' (the "
        f"job still runs, or it was killed before it wrote its table). {rows} fork rows are "
        f"saved in {shown(folder)}/forks ({where}); run the job again on the same output to "
        "resume it and write the table",
        figures={"rows": rows},
    )


def _submitted_tape(job_file: str | None) -> str | None:
    """The tape of the job file a submission was made from, if it is still on this side."""
    from .job import JobFileError, load_job

    try:
        path = load_job(job_file).tape_path if job_file else None
    except JobFileError:
        return None
    return str(path) if path else None


def clean(text: str) -> str:
    """Text from the cluster for a terminal: control bytes shown, never obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
