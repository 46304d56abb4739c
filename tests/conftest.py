"""Shared test set-up: the demo job, its simulated provider, a recorded tape, and a headless
Chromium to open report pages in."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, Request, sync_playwright

from car_ray.job import Job, load_job
from car_ray.replay import AiohttpUpstream, BaseUrls, ForkRunner, record
from car_ray.sim import SimServer
from car_ray.tape import Tape

ROOT = Path(__file__).resolve().parents[1]
SUPPORT_JOB = ROOT / "jobs" / "support_refund" / "job.toml"
RESEARCH_JOB = ROOT / "jobs" / "research_async" / "job.toml"
T = TypeVar("T")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The first run installs chromium (about a minute); a browser test itself takes a few seconds.
BROWSER_TIMEOUT_S = 900

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="session")
def support_job() -> Job:
    return load_job(SUPPORT_JOB)


@pytest.fixture(scope="session")
def support_sim(support_job: Job) -> Iterator[SimServer]:
    with SimServer(support_job.load("policy")) as sim:
        yield sim


def record_job(job: Job, sim: SimServer, path: Path) -> Tape:
    """Record a job's agent against a simulated provider with the job's input and seed."""
    tape, outcome = run(
        record(
            job.load("agent"),
            job.spec.agent,
            job.spec.input,
            path,
            base_urls=BaseUrls.for_server(sim.url),
            seed=job.spec.seed,
        )
    )
    assert outcome.error is None, outcome.error
    return tape


@pytest.fixture(scope="session")
def support_tape(
    support_job: Job, support_sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> Tape:
    """The demo's failure: recorded once per session with the job's seed (a wrongful refund)."""
    return record_job(support_job, support_sim, tmp_path_factory.mktemp("tapes") / "support.tape")


def http_runner(agent: Any, scorer: Any, sim: SimServer, tape: Tape) -> ForkRunner:
    """A fork runner of `tape` whose live calls go to `sim` over HTTP."""
    runner = ForkRunner(
        agent, scorer, base_urls=BaseUrls.for_server(sim.url), upstream=AiohttpUpstream()
    )
    runner.add_tape(tape)
    return runner


@pytest.fixture(scope="module")
def support_runner(
    support_job: Job, support_sim: SimServer, support_tape: Tape
) -> Iterator[ForkRunner]:
    """A fork runner for the demo's tape against the session's simulated provider."""
    r = http_runner(
        support_job.load("agent"), support_job.load("scorer"), support_sim, support_tape
    )
    yield r
    run(r.aclose())


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One embedded Ray for the whole session: starting it costs seconds and most of a GB."""
    import ray

    from car_ray.execute import init_ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_tape_path(support_tape: Tape) -> Path:
    return support_tape.path


def support_job_file(folder: Path, tape: Path, **settings: str) -> Path:
    """The demo's job.toml in `folder`, on `tape` (a fresh clone has no recorded tape), with
    `key = value` lines of the job file replaced: settings={"max_forks": "900"}."""
    text = SUPPORT_JOB.read_text().replace('tape = "support_refund.tape"', f'tape = "{tape}"')
    for key, value in settings.items():
        lines = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert len(lines) == 1, f"{SUPPORT_JOB} has no single '{key} = ' line"
        text = text.replace(lines[0], f"{key} = {value}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.toml"
    path.write_text(text)
    return path


def attribute_command(job_file: Path, out: Path | str) -> list[str]:
    return [sys.executable, "-m", "car_ray.cli", "attribute", str(job_file), "--out", str(out)]


def start_attribute(job_file: Path, out: Path | str, *, stdout: Any) -> subprocess.Popen[Any]:
    """`car-ray attribute` as a user runs it, in its own session (a signal to the session
    reaches its Ray and simulated provider too); stderr is piped, stdout goes to `stdout`."""
    return subprocess.Popen(
        attribute_command(job_file, out),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "200"},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop_ray_head(head: subprocess.Popen[Any]) -> None:
    """Stop a `ray start --head --block` by its pid, never `ray stop` (other Rays run here).
    It drains and stops what it started on SIGTERM (to it alone: its children stopped under
    it make it hang); whatever is left in its session goes with SIGKILL."""
    stop_session(head, timeout_s=60)


def stop_session(leader: subprocess.Popen[Any], *, timeout_s: float) -> None:
    """Stop a server started in its own session by its pid: SIGTERM to it alone, then
    SIGKILL to whatever is left in its session."""
    leader.terminate()
    try:
        leader.wait(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)


# -- report pages in a real browser ---------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium, installed with apt when missing; an install that fails fails the test."""
    if CHROMIUM.exists():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install it with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log: list[str] = []
    for command in ([apt, "update"], [apt, "install", "-y", "chromium"]):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=600, check=False
            )
        except subprocess.TimeoutExpired as exc:
            output = [
                o.decode() if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr)
            ]
            pytest.fail(f"{' '.join(command)} timed out after 600 s:\n" + "\n".join(output))
        log.append(f"$ {' '.join(command)}  (exit {done.returncode})\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            pytest.fail("installing chromium failed:\n" + "\n".join(log)[-6000:])
    if not CHROMIUM.exists():
        pytest.fail(f"apt installed chromium but {CHROMIUM} is missing:\n" + "\n".join(log)[-6000:])
    return CHROMIUM


@pytest.fixture
def browser(chromium: Path) -> Iterator[Browser]:
    """A fresh browser per test (under a second to start): while playwright's sync API is open
    its event loop counts as running, and other fixtures' `asyncio.run` would fail."""
    with sync_playwright() as manager:
        launched = manager.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Watched:
    """What a page said and did while it loaded: errors, dialogs, requests."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.console_errors == []
        assert self.page_errors == []
        assert self.dialogs == []
        offline = ("file://", "data:", "blob:", "about:")
        assert [url for url in self.requests if not url.startswith(offline)] == []


def open_page(
    browser: Browser,
    path: Path,
    *,
    javascript: bool = True,
    fragment: str = "",
    ready: str | None = None,
) -> Watched:
    """Open a local page in a fresh context, watching what it says and fetches; once it has
    loaded, wait for the JavaScript expression `ready` if one is given."""
    context = browser.new_context(
        java_script_enabled=javascript, viewport={"width": 1280, "height": 900}
    )
    page = context.new_page()
    page.set_default_timeout(20_000)
    watched = Watched(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            watched.console_errors.append(message.text)

    def on_dialog(dialog: Dialog) -> None:
        watched.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_request(request: Request) -> None:
        watched.requests.append(request.url)

    page.on("console", on_console)
    page.on("pageerror", lambda error: watched.page_errors.append(str(error)))
    page.on("dialog", on_dialog)
    page.on("request", on_request)
    page.goto(path.resolve().as_uri() + fragment, wait_until="load")
    if ready is not None:
        page.wait_for_function(ready)
    return watched
