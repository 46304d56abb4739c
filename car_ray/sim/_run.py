"""Running the simulated provider: in a background thread, a child process, or the foreground."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import uvicorn

from car_ray.providers import Draws

from ._policy import ScenarioPolicy, load_policy
from ._server import STATS_PATH, SimApp

LOOPBACK = "127.0.0.1"
# The line `serve` prints once its socket listens; `SimProcess` reads the URL from it.
READY_PREFIX = "car-ray sim listening on "
_BACKLOG = 4096


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket: connections queue in the backlog until uvicorn accepts them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only then, and without
    # it a keep-alive response's body waits on the client's delayed ACK (~40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _config(app: SimApp, *, own_logging: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        # httptools parses faster; h11 is the pure-Python fallback uvicorn always has.
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        # In-process, leave the host program's logging configuration alone.
        log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None,
        access_log=False,
        backlog=_BACKLOG,
        limit_concurrency=None,
        timeout_graceful_shutdown=2,
    )


class _Endpoint:
    """The base URLs an SDK client needs, given the server's root URL."""

    _url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the simulated provider is not running: use it as a context manager")
        return self._url

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url


class SimServer(_Endpoint):
    """The simulated provider on 127.0.0.1 in a background thread of this process.

    `with SimServer(policy) as sim:` starts it on a free port and stops it on exit; `sim.app`
    holds the counters.
    """

    def __init__(
        self,
        policy: ScenarioPolicy,
        *,
        latency_s: float = 0.0,
        rate_429: float = 0.0,
        rate_5xx: float = 0.0,
        retry_after_s: float = 0.05,
        fault_seed: int = 0,
        draws: Draws = "coupled",
        start_timeout_s: float = 10.0,
    ) -> None:
        self.app = SimApp(
            policy,
            latency_s=latency_s,
            rate_429=rate_429,
            rate_5xx=rate_5xx,
            retry_after_s=retry_after_s,
            fault_seed=fault_seed,
            draws=draws,
        )
        self.start_timeout_s = start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def requests_served(self) -> int:
        return self.app.served

    def start(self) -> Self:
        """Bind a free port, start serving, and return once uvicorn accepts connections."""
        if self._thread is not None:
            raise RuntimeError("this SimServer is already running")
        sock = _bind(LOOPBACK, 0)
        server = uvicorn.Server(_config(self.app, own_logging=False))
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="car-ray-sim", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not server.started:
            if not thread.is_alive():
                sock.close()
                raise RuntimeError("the simulated provider's server thread exited while starting")
            if time.monotonic() > deadline:
                server.should_exit = True
                thread.join(5)
                raise TimeoutError(
                    f"the simulated provider did not start within {self.start_timeout_s} s"
                )
            time.sleep(0.002)
        self._server, self._thread, self._url = server, thread, _url_of(sock)
        return self

    def stop(self) -> None:
        """Stop accepting, finish the requests in flight, and join the thread."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(10)
        self._server, self._thread, self._url = None, None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SimProcess(_Endpoint):
    """The simulated provider in a child process (`python -m car_ray.sim`), out of the client's way.

    The policy is named `module:attr` so the child can import it; folders in `search_path` are
    tried first. The child is terminated (then killed) on exit.
    """

    def __init__(
        self,
        policy_ref: str,
        *,
        latency_s: float = 0.0,
        rate_429: float = 0.0,
        rate_5xx: float = 0.0,
        retry_after_s: float = 0.05,
        fault_seed: int = 0,
        draws: Draws = "coupled",
        search_path: Sequence[Path] = (),
        start_timeout_s: float = 30.0,
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            "car_ray.sim",
            "--policy",
            policy_ref,
            "--host",
            LOOPBACK,
            "--port",
            "0",
            "--latency-ms",
            repr(latency_s * 1000),
            "--rate-429",
            repr(rate_429),
            "--rate-5xx",
            repr(rate_5xx),
            "--retry-after-ms",
            repr(retry_after_s * 1000),
            "--fault-seed",
            str(fault_seed),
            "--draws",
            draws,
        ]
        for folder in search_path:
            self.command += ["--path", str(folder)]
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def stats(self) -> dict[str, Any]:
        """The child's counters, fetched from GET /_car_ray/stats."""
        with urllib.request.urlopen(self.url + STATS_PATH, timeout=10) as response:
            stats: dict[str, Any] = json.load(response)
        return stats

    @property
    def requests_served(self) -> int:
        return int(self.stats()["served"])

    def start(self) -> Self:
        """Start the child and return once it has printed the URL it listens on."""
        if self._process is not None:
            raise RuntimeError("this SimProcess is already running")
        # stderr goes to a file: nobody must drain it, and it explains a failed start.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        self._process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr
        )
        try:
            line = self._read_ready_line()
        except BaseException:
            self.stop()
            raise
        self._url = line[len(READY_PREFIX) :].split()[0]
        return self

    def _read_ready_line(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + self.start_timeout_s
        buffer = b""
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"the simulated provider did not start within {self.start_timeout_s} s: "
                    f"{self._stderr_tail()}"
                )
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                self._process.wait(5)
                raise RuntimeError(
                    f"the simulated provider exited with code {self._process.returncode} "
                    f"before listening: {self._stderr_tail()}"
                )
            buffer += chunk
        line = buffer.decode().splitlines()[0]
        if not line.startswith(READY_PREFIX):
            raise RuntimeError(f"the simulated provider printed {line!r}, not its URL")
        return line

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return "(no stderr)"
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return text[-2000:] or "(stderr empty)"

    def stop(self) -> None:
        """Terminate the child (kill it if it lingers) and release its pipes."""
        process, self._process, self._url = self._process, None, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(
    policy_ref: str,
    host: str,
    port: int,
    latency_ms: float,
    rate_429: float,
    rate_5xx: float,
    fault_seed: int,
    *,
    retry_after_ms: float = 50.0,
    search_path: Sequence[Path] = (),
    draws: Draws = "coupled",
) -> None:
    """Serve the policy named `module:attr` on host:port in the foreground until interrupted.

    Once the socket listens, one line `car-ray sim listening on URL ...` goes to stdout.
    """
    policy = load_policy(policy_ref, search_path)
    app = SimApp(
        policy,
        latency_s=latency_ms / 1000,
        rate_429=rate_429,
        rate_5xx=rate_5xx,
        retry_after_s=retry_after_ms / 1000,
        fault_seed=fault_seed,
        draws=draws,
    )
    sock = _bind(host, port)
    url = _url_of(sock)
    print(f"{READY_PREFIX}{url} (OpenAI base_url {url}/v1, Anthropic base_url {url})", flush=True)
    uvicorn.Server(_config(app, own_logging=True)).run(sockets=[sock])
