"""A coding agent whose small model botches a one-line fix that a larger model gets right.

`to_celsius` has an operator-precedence bug and its test fails. The agent reads the file,
writes a patched version, runs the tests on that revision and reports. The small model often
"fixes" it with the Celsius → Fahrenheit factor (9/5) instead of 5/9, so the tests still
fail; the larger model rarely does. The sync openai SDK, streaming. On the recorded path the
tape has 7 steps:

    0 llm → read_file   1 tool read_file   2 llm → write_file (the wrong factor)
    3 tool write_file   4 llm → run_tests   5 tool run_tests (1 failed)   6 llm → report
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
BETTER_MODEL = "gpt-4o"
MAX_TURNS = 6
PATH = "thermo.py"
SYSTEM = (
    "You are a coding agent. Fix the failing test with the smallest change: read the file, "
    "write the fixed file, run the tests on the new revision, then report."
)
ORIGINAL = "def to_celsius(f):\n    return f - 32 * 5 / 9\n"
FIXED = "def to_celsius(f):\n    return (f - 32) * 5 / 9\n"
WRONG_FACTOR = "def to_celsius(f):\n    return (f - 32) * 9 / 5\n"


def revision_of(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()[:10]


# The repository's known revisions: run_tests is a function of the revision it is given.
REVISIONS = {revision_of(c): c for c in (ORIGINAL, FIXED, WRONG_FACTOR)}


def read_file(path: str) -> dict[str, Any]:
    return {"path": path, "content": ORIGINAL, "revision": revision_of(ORIGINAL)}


def write_file(path: str, content: str) -> dict[str, Any]:
    return {"path": path, "revision": revision_of(content), "bytes": len(content)}


def run_tests(revision: str) -> dict[str, Any]:
    """test_thermo.py against the revision: freezing and boiling points."""
    source = REVISIONS.get(revision)
    if source is None:
        return {"revision": revision, "passed": 0, "failed": 1, "error": "unknown revision"}
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own fixed source strings, nothing else
    to_celsius = namespace["to_celsius"]
    cases = {32: 0.0, 212: 100.0}
    failed = [f for f, c in cases.items() if abs(to_celsius(f) - c) > 1e-9]
    return {"revision": revision, "passed": len(cases) - len(failed), "failed": len(failed)}


TOOL_FUNCTIONS = {"read_file": read_file, "write_file": write_file, "run_tests": run_tests}
PARAMETERS: dict[str, dict[str, Any]] = {
    "read_file": {"path": {"type": "string"}},
    "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
    "run_tests": {"revision": {"type": "string"}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, props in PARAMETERS.items()
]


def _turn(client: Any, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """One streamed completion: its text and its tool calls, assembled from the deltas."""
    text, calls = "", {}
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    return text, [calls[i] for i in sorted(calls)]


def bugfix_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ctx.input["issue"]},
    ]
    tests: dict[str, Any] | None = None
    for _turn_index in range(MAX_TURNS):
        text, calls = _turn(client, messages)
        if not calls:
            return {"report": text, "tests": tests}
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            arguments = json.loads(call["arguments"])
            output = ctx.tool(call["name"], TOOL_FUNCTIONS[call["name"]], **arguments)
            if call["name"] == "run_tests":
                tests = output
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(output)}
            )
    return {"report": None, "tests": tests}


def tests_still_fail(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the run ends with failing tests (or never ran them)."""
    tests = result.get("tests") if isinstance(result, dict) else None
    return 0.0 if tests and tests["failed"] == 0 else 1.0
