"""A model call that goes around car-ray, caught: while car-ray records or forks in a process,
the SDKs' base-URL environment variables point at a local endpoint that answers every
request with an error naming the fix, and counts what it was asked. And the tracing agent
frameworks send to their vendors on their own (the OpenAI Agents SDK's, LangSmith's,
Logfire's, an OpenTelemetry SDK's exporters) is off wherever car-ray runs an agent
(`quiet_telemetry`): it would carry the run's data, and some of it the user's API key, off
the machine from every fork."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import structlog

log = structlog.get_logger("car_ray.replay")

# The variables the openai and anthropic SDKs (and the frameworks built on them) read for a
# client built without a base URL.
ENV = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")
# What turns each framework's own tracing off, read from the environment when it first
# traces: set, for good, in a process that loads, records or forks an agent
# (`quiet_telemetry`). OpenTelemetry's exporters the environment configures are off; the SDK
# itself is not (Ray's own metrics use it).
QUIET = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LOGFIRE_SEND_TO_LOGFIRE": "false",
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}
FIX = (
    "this model call went around car-ray (a client built without ctx), so it would not be "
    "recorded or forked: use ctx.openai() / ctx.async_openai() / ctx.anthropic(), or give "
    "your own client http_client=ctx.http_client (ctx.async_http_client) and "
    "base_url=ctx.base_url('openai' | 'anthropic')"
)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.server.hits.append(f"{self.command} {self.path}")
        log.warning("call_around_car_ray", method=self.command, path=self.path)
        body = json.dumps(
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": f"car-ray: {FIX}"},
            }
        ).encode()
        # 400: not retried by the SDKs, and raised to the agent with the message.
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: list[str] = []


class Tripwire:
    """The endpoint and the environment that points at it, shared by every user in this
    process (`tripwire()`): the endpoint starts with the first and serves until the process
    ends (a client built while it was set keeps its address, and must keep meeting it); the
    environment is set while anyone uses it and restored by the last. `hits` are the calls
    it answered, as "METHOD /path"."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _users: ClassVar[int] = 0
    _server: ClassVar[_Server | None] = None
    _saved: ClassVar[dict[str, str | None]] = {}

    @classmethod
    def acquire(cls) -> _Server:
        with cls._lock:
            if cls._server is None:
                server = _Server()
                threading.Thread(
                    target=server.serve_forever, name="car-ray-tripwire", daemon=True
                ).start()
                cls._server = server
            if cls._users == 0:
                url = f"http://127.0.0.1:{cls._server.server_address[1]}"
                cls._saved = {name: os.environ.get(name) for name in ENV}
                os.environ["OPENAI_BASE_URL"] = url + "/v1"
                os.environ["ANTHROPIC_BASE_URL"] = url
                quiet_telemetry()
            cls._users += 1
            return cls._server

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users > 0:
                return
            for name, value in cls._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def quiet_telemetry() -> None:
    """Turn off, in this process and for good, the tracing agent frameworks send to their
    vendors (`QUIET`): for the OpenAI Agents SDK, whose exporter posts every run's spans with
    the user's OPENAI_API_KEY to a fixed URL even when its model calls meet the tripwire;
    LangSmith (it also keeps the variables it read, which are forgotten here); Logfire; and
    the OpenTelemetry exporters the environment configures. A process that loads, records or
    forks an agent is car-ray's: nothing it runs is traced off the machine. An exporter the
    agent's own code builds with an endpoint is not reached by any of these."""
    os.environ.update(QUIET)
    utils = sys.modules.get("langsmith.utils")
    forget = getattr(getattr(utils, "get_env_var", None), "cache_clear", None)
    if callable(forget):
        forget()


class Tripped:
    """The calls the tripwire answered since a `tripwire()` began (any of this process's)."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._start = len(server.hits)

    @property
    def calls(self) -> list[str]:
        return self._server.hits[self._start :]


@contextmanager
def tripwire() -> Iterator[Tripped]:
    """While inside: a client built without ctx calls the tripwire, which answers with an
    error naming the fix."""
    server = Tripwire.acquire()
    try:
        yield Tripped(server)
    finally:
        Tripwire.release()
