"""`car-ray attribute --address`: a job run on a Ray cluster the driver joins, not its own.

The test starts a real Ray head (`ray start --head --block --node-ip-address 127.0.0.1`) and
stops it after. Ray 2.60 still binds its gRPC servers on every interface and advertises the
machine's own address; the test joins it through 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, stop_ray_head, support_job_file

RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    port = _free_port()
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    command = [
        str(RAY),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
    ]
    with log.open("wb") as out:
        head = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 90
        while not _answers(port):
            assert head.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head did not come up in 90 s"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", port
    finally:
        try:
            stop_ray_head(head)
        finally:
            # Only `ray stop` forgets the cluster `ray start` wrote down: a stale address
            # there would send `--address auto` (and plain `ray.init()`) to a dead port.
            noted = Path("/tmp/ray/ray_current_cluster")
            with contextlib.suppress(OSError):
                if noted.read_text().strip().endswith(f":{port}"):
                    noted.unlink()


def _attribute(tmp_path: Path, tape: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "160"}
    # The driver must find the cluster from --address alone.
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_MODE", None)
    job_file = support_job_file(tmp_path / "job", tape)
    command = [sys.executable, "-m", "car_ray.cli", "attribute", str(job_file)]
    return subprocess.run(
        [*command, "--out", str(tmp_path / "out"), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_job_runs_on_the_cluster_it_is_pointed_at(
    tmp_path: Path, ray_head: tuple[str, int], demo_tape_path: Path
) -> None:
    address, port = ray_head
    result = _attribute(tmp_path, demo_tape_path, "--address", address, "--max-forks", "30")
    assert result.returncode == 0, result.stderr[-3000:]
    (job_json,) = tmp_path.glob("out/*/job.json")
    info = json.loads(job_json.read_text())
    # The driver joined the head's GCS rather than starting a Ray of its own.
    assert info["ray"]["how"] == "joined"
    assert info["ray"]["address"].rsplit(":", 1)[1] == str(port)
    assert info["ray"]["nodes"] == 1 and info["ray"]["cpus"] == 2.0
    assert info["status"] == "budget_exhausted"
    assert info["ledger"]["spent"]["forks"] <= 30
    assert "30 forks run" in result.stdout


def test_an_address_nobody_answers_on_is_a_clear_error_at_once(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    garbled = _attribute(tmp_path, demo_tape_path, "--address", "127.0.0.1", "--max-forks", "1")
    assert garbled.returncode == 2
    assert "--address '127.0.0.1' is not host:port" in garbled.stderr
    port = _free_port()
    began = time.monotonic()
    result = _attribute(
        tmp_path, demo_tape_path, "--address", f"127.0.0.1:{port}", "--max-forks", "1"
    )
    assert result.returncode == 2  # the CLI's exit code for bad input
    assert f"could not join the Ray cluster at 127.0.0.1:{port}" in result.stderr
    assert f"ray start --head --port {port}" in result.stderr
    # Ray alone retries such an address for minutes.
    assert time.monotonic() - began < 60
    assert not list(tmp_path.glob("out/*/forks/*.parquet"))
