"""Tapes: what loads, what is refused and how, and what a killed recording leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from car_ray.tape import LlmEvent, Tape, TapeError, ToolEvent, load_tape

from .conftest import ROOT


def _lines(tape: Tape) -> list[bytes]:
    return tape.path.read_bytes().splitlines(keepends=True)


def _index(lines: list[bytes], kind: str, name: str | None = None) -> int:
    """The 0-based index of the first line of this type (and tool name)."""
    for i, line in enumerate(lines):
        value = json.loads(line)
        if value["type"] == kind and (name is None or value.get("name") == name):
            return i
    raise AssertionError(f"no {kind} line")


def test_a_recorded_tape_is_sealed_chained_and_readable_without_car_ray(
    support_tape: Tape,
) -> None:
    assert support_tape.sealed
    assert support_tape.seal is not None
    assert support_tape.tape_id == support_tape.seal.digest
    kinds = [e.type for e in support_tape.steps]
    assert kinds == ["llm", "tool", "llm", "tool", "llm", "tool", "llm"]
    raw = [json.loads(line) for line in _lines(support_tape)]
    assert raw[0]["type"] == "header" and raw[0]["version"] == 1
    assert raw[-1]["type"] == "seal"
    assert [r["type"] for r in raw].count("nondet") == 1  # ctx.now()
    refund = support_tape.steps[5]
    assert isinstance(refund, ToolEvent) and refund.name == "issue_refund" and refund.effect
    first = support_tape.steps[0]
    assert isinstance(first, LlmEvent)
    assert first.request.path == "/v1/chat/completions"
    assert first.request.body["model"] == "gpt-4o-mini"


def test_a_corrupted_line_names_the_line(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    # Change what the lookup_order tool returned (a tool line has no body hash of its own:
    # the chain catches it on the next line).
    i = _index(lines, "tool", "lookup_order")
    lines[i] = lines[i].replace(b"espresso machine", b"espresso mashine")
    bad = tmp_path / "corrupt.tape"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(TapeError) as caught:
        load_tape(bad)
    assert caught.value.line == i + 2
    assert "hash chain broken" in str(caught.value)
    assert f"line {i + 1}" in str(caught.value)
    assert str(bad) in str(caught.value)


def test_a_corrupted_response_body_fails_its_sha256(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    i = _index(lines, "llm")
    record = json.loads(lines[i])
    record["response"]["body_text"] = record["response"]["body_text"].replace("A1001", "B2002")
    lines[i] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    bad = tmp_path / "body.tape"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(TapeError, match=r"step 0: response body does not match its sha256") as c:
        load_tape(bad)
    assert c.value.line == i + 1


def test_reordered_lines_are_refused(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    lines[2], lines[3] = lines[3], lines[2]
    bad = tmp_path / "reordered.tape"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(TapeError, match="hash chain broken") as caught:
        load_tape(bad)
    assert caught.value.line == 3


def test_a_foreign_version_is_refused_on_line_1(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    header = json.loads(lines[0])
    header["version"] = 99
    lines[0] = json.dumps(header).encode() + b"\n"
    bad = tmp_path / "v99.tape"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(TapeError, match="version 99 is not supported") as caught:
        load_tape(bad)
    assert caught.value.line == 1


def test_garbage_in_the_middle_is_refused_with_its_line(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    lines[4] = b"{not json\n"
    bad = tmp_path / "garbage.tape"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(TapeError, match="not valid JSON") as caught:
        load_tape(bad)
    assert caught.value.line == 5


def test_a_truncated_tape_loads_as_incomplete(support_tape: Tape, tmp_path: Path) -> None:
    lines = _lines(support_tape)
    cut = tmp_path / "cut.tape"
    cut.write_bytes(b"".join(lines[:5]) + lines[5][:40])  # a torn sixth line
    tape = load_tape(cut)
    assert not tape.sealed
    assert tape.tape_id.startswith("partial-")
    whole = [json.loads(line)["type"] for line in lines[:5]]
    assert len(tape.steps) == sum(t in ("llm", "tool") for t in whole) == 3
    assert any("torn last line" in note for note in tape.notes)
    assert any("incomplete" in note for note in tape.notes)
    with pytest.raises(TapeError, match="incomplete"):
        tape.require_sealed()


def test_a_recording_killed_with_sigkill_leaves_a_loadable_truncated_tape(
    tmp_path: Path,
) -> None:
    job = tmp_path / "slowjob"
    job.mkdir()
    (job / "slow_agent.py").write_text(
        textwrap.dedent(
            """
            import time
            from car_ray.providers import Action

            class Policy:
                def distribution(self, request):
                    return [(1.0, Action(text="ok"))]

            POLICY = Policy()

            def tick(i):
                time.sleep(0.02)
                return {"i": i}

            def agent(ctx):
                client = ctx.openai()
                for i in range(100000):
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": str(i)}]
                    )
                    ctx.tool("tick", tick, i)

            def score(result, trajectory):
                return 0.0
            """
        )
    )
    (job / "job.toml").write_text(
        'agent = "slow_agent:agent"\nscorer = "slow_agent:score"\npolicy = "slow_agent:POLICY"\n'
    )
    tape_path = tmp_path / "killed.tape"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "car_ray.cli",
            "record",
            str(job / "job.toml"),
            "-o",
            str(tape_path),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if tape_path.exists() and tape_path.read_bytes().count(b"\n") >= 12:
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("the recording never got going")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    tape = load_tape(tape_path)
    assert not tape.sealed
    assert len(tape.steps) >= 11
    # Whole steps in order: model call, tool, model call, tool, ...
    assert all(e.step == i for i, e in enumerate(tape.steps))
    assert all(e.type == ("llm" if i % 2 == 0 else "tool") for i, e in enumerate(tape.steps))
    inspected = subprocess.run(
        [sys.executable, "-m", "car_ray.cli", "inspect", str(tape_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert inspected.returncode == 0, inspected.stderr
    assert "INCOMPLETE" in inspected.stdout
