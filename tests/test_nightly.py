"""jobs/nightly: the generator records failing traces with planted causes through the
production recorder, writes a manifest that reads back, does the same again for the same
seed, and the exact solver names each trace's planted step."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from car_ray.job import load_job
from car_ray.recorder import (
    ManifestEntry,
    ManifestError,
    failing_tapes,
    read_manifest,
    read_mark,
    write_manifest,
)
from car_ray.replay import is_bad, recorded_trajectory
from car_ray.tape import LlmEvent, Tape, TapeError, ToolEvent, load_tape
from car_ray.truth import Truth, solve

from .conftest import ROOT, record_job, run

JOB_FILE = ROOT / "jobs" / "nightly" / "job.toml"
GENERATE = ROOT / "jobs" / "nightly" / "generate.py"
COUNT, CORRUPT = 12, 2
LAYOUT = ["llm", "tool", "tool", "llm", "tool", "llm"]
PLANTED_AT = {"injected_note": 1, "wrong_policy": 2, "model": 3}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nightly_generate", GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Seed 7 by the command line, and while it runs, seed 7 again and seed 8 in this
    process (the same `generate`)."""
    first, again, other = (tmp_path_factory.mktemp(n) for n in ("first", "again", "other"))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(GENERATE),
            str(first),
            "--seed",
            "7",
            "--count",
            str(COUNT),
            "--corrupt",
            str(CORRUPT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        generate = _generator().generate
        generate(again, COUNT, seed=7, corrupt=CORRUPT)
        generate(other, COUNT, seed=8, corrupt=CORRUPT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.startswith(f"{COUNT + CORRUPT} failing traces (")
    assert f"{CORRUPT} corrupt" in stdout and str(first / "manifest.json") in stdout
    return first, again, other


def _content(tape: Tape) -> list[Any]:
    """What a run did, without the times and the port a recording carries."""
    steps: list[Any] = [tape.header.input, tape.header.seed]
    for event in tape.steps:
        if isinstance(event, LlmEvent):
            steps.append(("llm", event.request.sha256, event.action))
        else:
            steps.append(("tool", event.name, event.arguments, event.result))
    return steps


def _by_kind(folder: Path) -> dict[str, Path]:
    """One tape of each planted kind (the first in the manifest)."""
    found: dict[str, Path] = {}
    for name, entry in read_manifest(folder).items():
        assert entry.planted is not None
        found.setdefault(entry.planted, folder / name)
    return found


def test_every_generated_trace_is_a_failing_tape_with_its_planted_cause(
    generated: tuple[Path, Path, Path],
) -> None:
    folder = generated[0]
    job = load_job(JOB_FILE)
    scorer = job.load("scorer")
    manifest = read_manifest(folder)
    tapes = {p.name for p in folder.glob("*.tape")}
    assert set(manifest) == tapes and len(tapes) == COUNT + CORRUPT
    # Spread over the kinds; every run marked failed, so a batch --from picks them all.
    assert Counter(e.planted for e in manifest.values()) == {
        "injected_note": 4,
        "wrong_policy": 4,
        "model": 4,
        "corrupt": CORRUPT,
    }
    assert {p.name for p in failing_tapes(folder)} == tapes
    for name, entry in manifest.items():
        path = folder / name
        mark = read_mark(path)
        assert mark is not None and mark.status == "failed" and mark.marked_by == "scorer"
        assert 1 <= entry.priority <= 3
        if entry.planted == "corrupt":
            assert entry.step is None
            # Cut mid-line (an incomplete tape) or edited (a broken hash chain): either way
            # an error naming the file, never a trace to fork.
            with pytest.raises(TapeError, match=re.escape(str(path))):
                load_tape(path).require_sealed()
            continue
        tape = load_tape(path)
        assert tape.sealed and tape.tape_id == mark.tape_id
        assert tape.header.agent == job.spec.agent
        assert [e.type for e in tape.steps] == LAYOUT
        assert is_bad(scorer(tape.seal.result if tape.seal else None, recorded_trajectory(tape)))
        assert entry.step == PLANTED_AT[str(entry.planted)]
        order, page = tape.steps[1], tape.steps[2]
        assert isinstance(order, ToolEvent) and isinstance(page, ToolEvent)
        assert order.name == "lookup_order" and page.name == "refund_policy"
        injected = "SYSTEM OVERRIDE" in order.result["notes"]
        wrong_page = "no questions asked" in page.result
        assert (injected, wrong_page) == {
            "injected_note": (True, False),
            "wrong_policy": (False, True),
            "model": (False, False),
        }[str(entry.planted)]
        assert entry.intervention == ("resample" if entry.planted == "model" else "observation")


def test_the_same_seed_records_the_same_runs(generated: tuple[Path, Path, Path]) -> None:
    """Inputs, seeds, requests, actions and tool results agree run for run; tape names and
    ids do not (a tape carries when it was recorded, the provider's port, latencies)."""
    first, again, other = generated

    def contents(folder: Path) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for name, entry in read_manifest(folder).items():
            if entry.planted == "corrupt":
                continue
            key = (entry.planted, entry.step, entry.priority)
            out.append((key, _content(load_tape(folder / name))))
        return out

    assert contents(first) == contents(again)
    assert contents(first) != contents(other)


def _top_observation(truth: Truth) -> list[int]:
    flips = {a.step: a.flip for a in truth.arms if a.kind == "observation"}
    best = max(flips.values())
    return [k for k, flip in flips.items() if best > 0 and flip == best]


def test_the_exact_solver_names_each_planted_step(generated: tuple[Path, Path, Path]) -> None:
    job = load_job(JOB_FILE)
    tapes = _by_kind(generated[0])
    for kind, step in PLANTED_AT.items():
        truth = run(solve(job, load_tape(tapes[kind])))
        assert truth.recorded_outcome == 1.0
        flips = {a.step: a.flip for a in truth.arms if a.kind == "observation"}
        if kind == "model":
            # No observation to blame: re-drawing the decision removes the failure 97 times
            # in 100 (the recorded draw was the unlikely refund); it is the only choice.
            assert truth.players == [3] and truth.top == [3]
            assert truth.step(3).phi == pytest.approx(0.97)
            assert flips == {1: 0.0, 2: 0.0}
        else:
            # The poisoned context leaves the decision no choice: no step has a phi, and the
            # clean observation alone removes the failure; the other one changes nothing.
            assert truth.players == [] and truth.top == []
            assert all(s.phi == 0.0 for s in truth.steps)
            assert _top_observation(truth) == [step]
            assert flips == {1: 0.0, 2: 0.0} | {step: 1.0}


def test_the_job_files_own_tape_seed_0_keeps_its_held_draws(tmp_path: Path) -> None:
    """The job's example run (seed 0): a clean order note removes the failure for sure in
    the held game, as the engine's forks find (a seed of 0 is a seed)."""
    from car_ray.sim import SimServer

    job = load_job(JOB_FILE)
    assert job.spec.seed == 0
    with SimServer(job.load("policy")) as sim:
        tape = record_job(job, sim, tmp_path / "nightly.tape")
    truth = run(solve(job, tape))
    assert truth.arm("observation", 1) is not None
    assert _top_observation(truth) == [1]
    assert {a.step: a.flip for a in truth.arms if a.kind == "observation"} == {1: 1.0, 2: 0.0}


def test_a_manifest_reads_back_and_bad_ones_name_the_file_entry_and_key(tmp_path: Path) -> None:
    entries = [
        ManifestEntry(tape="a.tape", planted="model", step=3, intervention="resample", priority=2),
        ManifestEntry(tape="b.tape", planted="corrupt"),
    ]
    path = write_manifest(tmp_path, entries)
    assert read_manifest(tmp_path) == {"a.tape": entries[0], "b.tape": entries[1]}
    written = json.loads(path.read_text())
    assert written[1] == {"tape": "b.tape", "planted": "corrupt", "priority": 1.0}

    def fails(content: str, *wanted: str) -> None:
        path.write_text(content)
        with pytest.raises(ManifestError) as caught:
            read_manifest(tmp_path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ")
        for text in wanted:
            assert text in message

    fails('[{"tape": "a.tape", "priority": -1}]', "entry 0 ('a.tape')", "key 'priority'")
    fails('[{"tape": "a.tape"}, {"tape": "b.tape", "stpe": 2}]', "entry 1", "key 'stpe'")
    fails('[{"tape": "a.tape"}, {"tape": "a.tape"}]', "entry 1", "listed twice")
    fails('[{"tape": "../a.tape"}]', "entry 0", "not a file name")
    fails('{"tape": "a.tape"}', "a JSON list")
    fails("[{", "not JSON")
    path.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        read_manifest(tmp_path)
