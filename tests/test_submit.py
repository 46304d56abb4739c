"""`car-ray submit` and the commands around it, against a real Ray head and its job server.

The head is `ray start --head --block` from the venv: its GCS, dashboard and agents on free
ports of their own on 127.0.0.1 (Ray's gRPC servers still bind every interface, as in
test_cluster), its own temp dir and its own token (never ~/.ray's, never the default ports:
other Rays run on this machine). It is stopped by its pid, never by `ray stop`, and the test
checks that no process of it is left."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from .conftest import ROOT, stop_ray_head

VENV_BIN = Path(sys.executable).parent
TOKEN = secrets.token_hex(32)
SUPPORT = ROOT / "jobs" / "support_refund"


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports nobody listens on now (all bound at once, then let go)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    state = _proc(pid, "stat").rpartition(b")")[2].split()[:1]
    return bool(state) and state != [b"Z"]


def _processes_of(root: int, marker: str) -> set[int]:
    """The processes under `root` and every process whose command line or environment
    names `marker` (the head's temp dir): what the head started, reparented or not."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    parent = {}
    for pid in pids:
        fields = _proc(pid, "stat").rpartition(b")")[2].split()
        if len(fields) > 1:
            parent[pid] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    key = marker.encode()
    return found | {p for p in pids if key in _proc(p, "cmdline") or key in _proc(p, "environ")}


@dataclass
class Head:
    url: str
    process: subprocess.Popen[bytes]
    temp_dir: str
    seen: set[int] = field(default_factory=set)


@contextlib.contextmanager
def ray_head(log: Path) -> Iterator[Head]:
    """A Ray head with its job server, for the block; stopped by its own pid after."""
    # Short: Ray's socket paths live under it and a Unix socket path has ~107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="crs-", dir="/tmp")
    gcs, dashboard, agent_http, agent_grpc, runtime_env, metrics, node, objects, *workers = (
        _free_ports(8 + 24)
    )
    command = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--port",
        str(gcs),
        "--node-ip-address",
        "127.0.0.1",
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard),
        "--dashboard-agent-listen-port",
        str(agent_http),
        "--dashboard-agent-grpc-port",
        str(agent_grpc),
        "--runtime-env-agent-port",
        str(runtime_env),
        "--metrics-export-port",
        str(metrics),
        "--node-manager-port",
        str(node),
        "--object-manager-port",
        str(objects),
        "--worker-port-list",
        ",".join(map(str, workers)),
        "--temp-dir",
        temp_dir,
        "--num-cpus",
        "2",
        "--disable-usage-stats",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    # As a user starts it: from the environment car-ray is installed in (the job's `python`
    # is the first on the head's PATH), with token authentication and its own token.
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=TOKEN,
        RAY_USAGE_STATS_ENABLED="0",
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    head = Head(f"http://127.0.0.1:{dashboard}", process, temp_dir)
    try:
        deadline = time.monotonic() + 120
        while not _job_server_up(head.url):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head's job server did not come up"
            time.sleep(0.5)
        yield head
    finally:
        head.seen = _processes_of(process.pid, temp_dir)
        try:
            stop_ray_head(process)
        finally:
            deadline = time.monotonic() + 30
            while any(_alive(p) for p in head.seen) and time.monotonic() < deadline:
                time.sleep(0.2)
            shutil.rmtree(temp_dir, ignore_errors=True)


def _job_server_up(url: str) -> bool:
    request = urllib.request.Request(
        f"{url}/api/version", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_A", "RAY_API"))}
    # The client finds the token as Ray's CLI does (RAY_AUTH_MODE unset: a token at hand).
    env.update(RAY_AUTH_TOKEN=TOKEN, COLUMNS="200", RAY_USAGE_STATS_ENABLED="0")
    env.update(extra)
    return env


def start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`car-ray ARGS` as a user runs it, in the background (its output piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "car_ray.cli", *args],
        cwd=cwd,
        env=env or _env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def car_ray(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`car-ray ARGS` as a user runs it, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "car_ray.cli", *args],
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _job_folder(parent: Path, **replace: str) -> Path:
    """The demo job's folder, copied under `parent` (its tape is recorded on submit)."""
    folder = parent / "support_refund"
    shutil.copytree(SUPPORT, folder, ignore=shutil.ignore_patterns("__pycache__", "*.tape"))
    text = (folder / "job.toml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    (folder / "job.toml").write_text(text)
    return folder


def _done(folder: Path) -> int:
    try:
        return int(json.loads((folder / "job.json").read_text())["progress"]["done"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_job_submitted_to_a_head_is_followed_stopped_and_read_back(tmp_path: Path) -> None:
    first = _job_folder(tmp_path / "one")
    # A long job to stop: every arm 300 times, slowly, on one worker.
    second = _job_folder(
        tmp_path / "two",
        **{
            'method = "auto"': 'method = "uniform"\nforks_per_step = 300',
            "concurrency = 96": "concurrency = 2",
            "workers = 2": "workers = 1",
            "sim_latency_ms = 0": "sim_latency_ms = 200",
        },
    )
    with ray_head(tmp_path / "head.log") as head, contextlib.ExitStack() as cleanup:
        address = ("--address", head.url)
        submitted = car_ray(
            tmp_path, "submit", "one/support_refund/job.toml", *address, "--out", "out1"
        )
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        sid1 = submitted.stdout.strip()
        assert sid1.startswith("raysubmit_") and "\n" not in sid1
        assert f"car-ray logs {sid1} --follow" in submitted.stderr
        follow = start(tmp_path, "logs", sid1, "--follow", *address)
        cleanup.callback(follow.kill)  # if the test fails before it ends
        # A wrong token, an unknown id: one line each, exit 2.
        refused = start(tmp_path, "jobs", *address, env=_env(RAY_AUTH_TOKEN="0" * 64))
        unknown = start(tmp_path, "status", "raysubmit_nope", *address)
        # The tape was recorded on this side, in the job's folder, and went with it.
        shutil.copy(first / "support_refund.tape", second / "support_refund.tape")
        # The second job runs beside the first (fork workers take no CPU of their own).
        submitted = car_ray(tmp_path, "submit", "two/support_refund/job.toml", *address)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        sid2 = submitted.stdout.strip()
        (out2,) = {
            line.rsplit(" ", 1)[1]
            for line in submitted.stderr.splitlines()
            if "its output:" in line
        }
        # A relative --out (here the job file's "out") is made absolute on this side.
        assert out2.startswith(str(tmp_path / "out") + os.sep)

        _, errors = refused.communicate(timeout=180)
        assert refused.returncode == 2
        assert f"the Ray job server at {head.url} refused this client" in errors
        assert "RAY_AUTH_TOKEN" in errors
        _, errors = unknown.communicate(timeout=180)
        assert unknown.returncode == 2
        assert f"no job 'raysubmit_nope' on the cluster at {head.url}" in errors

        # Stop the second job once rows stream in.
        deadline = time.monotonic() + 150
        while _done(Path(out2)) < 1:
            assert time.monotonic() < deadline, car_ray(tmp_path, "logs", sid2, *address).stdout
            time.sleep(0.5)
        stopped = car_ray(tmp_path, "stop", sid2, *address)
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert f"{sid2}: STOPPED" in stopped.stderr
        # The address from RAY_ADDRESS, as Ray's CLI takes it.
        status = start(tmp_path, "status", sid2, env=_env(RAY_ADDRESS=head.url))
        # Its rows are readable: stopped as Ctrl-C stops a job, it wrote its table so far.
        partial = car_ray(tmp_path, "results", sid2, *address)
        assert partial.returncode == 130, partial.stdout[-3000:] + partial.stderr[-2000:]
        assert "re-drawn steps, by blame (the steps to fix) (interrupted)" in partial.stdout
        out, errors = status.communicate(timeout=180)
        assert out.startswith(f"{sid2}: STOPPED"), out + errors
        (saved,) = [line for line in partial.stdout.splitlines() if line.startswith("interrupted:")]
        rows = int(saved.split()[1])
        parquet = ds.dataset(Path(out2) / "forks", format="parquet")
        assert 0 < rows == parquet.count_rows() < 2700  # mid-run: 9 arms x 300 were asked

        # The first job, followed to its end.
        logs, errors = follow.communicate(timeout=240)
        assert follow.returncode == 0, logs[-3000:] + errors[-2000:]
        assert f"{sid1}: SUCCEEDED" in errors
        assert "finished (complete)" in logs
        verdicts = [line for line in logs.splitlines() if line.startswith("verdict:")]
        assert len(verdicts) == 1 and "the agent went wrong at step 4," in verdicts[0]
        # Read back from its Parquet and job.json: the same verdict, the planted cause first.
        listed = start(tmp_path, "jobs", *address)
        results = car_ray(tmp_path, "results", sid1, *address, "--json")
        assert results.returncode == 0, results.stderr[-3000:]
        summary = json.loads(results.stdout)
        assert summary["status"] == "complete" and summary["verdict"] == verdicts[0]
        assert summary["folder"].startswith(str(tmp_path / "out1") + os.sep)
        assert any(r["rank"] == 1 and r["step"] == 4 for r in summary["attribution"])
        out, errors = listed.communicate(timeout=180)
        assert listed.returncode == 0, errors
        rows_of = {
            line.split("│")[1].strip(): line for line in out.splitlines() if "raysubmit_" in line
        }
        assert "SUCCEEDED" in rows_of[sid1] and summary["job_id"][:20] in rows_of[sid1]
        assert "STOPPED" in rows_of[sid2]

    # The head and everything it started are gone, and only by its own pids.
    assert head.process.returncode is not None
    left = [p for p in head.seen if _alive(p)]
    assert not left, [_proc(p, "cmdline")[:200] for p in left]


def test_a_job_server_nobody_answers_on_is_a_clear_error_at_once(tmp_path: Path) -> None:
    (port,) = _free_ports(1)
    began = time.monotonic()
    result = car_ray(tmp_path, "jobs", "--address", f"http://127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"could not reach the Ray job server at 127.0.0.1:{port}" in result.stderr
    assert time.monotonic() - began < 60
    nowhere = car_ray(tmp_path, "results", "raysubmit_abc")
    assert nowhere.returncode == 2
    assert "a submission id needs --address (or RAY_API_SERVER_ADDRESS" in nowhere.stderr


def test_a_head_without_its_job_agent_yet_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head that has just started answers 500 "No available agent to submit job" until its
    job agent is up: the submission waits for it (seen in CI on a loaded machine). Any other
    refusal is an error at once."""
    from car_ray import cluster
    from car_ray._scenario import ensure_tape
    from car_ray.job import load_job

    class Client:
        def __init__(self, failures: list[str]) -> None:
            self.failures = failures
            self.calls = 0

        def get_address(self) -> str:
            return "http://127.0.0.1:8265"

        def submit_job(self, **_: object) -> str:
            self.calls += 1
            if self.failures:
                raise RuntimeError(self.failures.pop(0))
            return "raysubmit_ok"

    busy = (
        "Request failed with status code 500: "
        "No available agent to submit job, please try again later."
    )
    job = load_job(SUPPORT / "job.toml")
    tape = ensure_tape(job)
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    waiting = Client([busy, busy])
    monkeypatch.setattr(cluster, "connect", lambda address: waiting)
    sent = cluster.submit(job, tape, address="127.0.0.1:8265", out=str(tmp_path / "out"))
    assert sent.submission_id == "raysubmit_ok" and waiting.calls == 3
    refusing = Client(["Request failed with status code 400: bad entrypoint"])
    monkeypatch.setattr(cluster, "connect", lambda address: refusing)
    with pytest.raises(cluster.ClusterError, match=r"refused: .*bad entrypoint"):
        cluster.submit(job, tape, address="127.0.0.1:8265", out=str(tmp_path / "out"))
    assert refusing.calls == 1
