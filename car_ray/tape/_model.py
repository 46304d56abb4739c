"""The tape's line types: a header, events (`llm`, `tool`, `nondet`) and a seal."""

from __future__ import annotations

import base64
import json
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT = "car-ray-tape"
VERSION = 1


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TapeHeader(_Line):
    type: Literal["header"] = "header"
    format: Literal["car-ray-tape"] = "car-ray-tape"
    version: int = VERSION
    agent: str
    input: Any = None
    provider: dict[str, str] = Field(default_factory=dict)
    created: str
    seed: int | None = None
    prev: str = ""


class RequestRecord(_Line):
    method: str
    path: str
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any
    sha256: str


class ResponseRecord(_Line):
    status: int
    headers: dict[str, str] = Field(default_factory=dict)
    stream: bool = False
    body_text: str | None = None
    body_b64: str | None = None
    sha256: str

    @cached_property
    def body_bytes(self) -> bytes:
        if self.body_text is not None:
            return self.body_text.encode("utf-8")
        return base64.b64decode(self.body_b64 or "")


class LlmEvent(_Line):
    type: Literal["llm"] = "llm"
    step: int
    provider: str
    model: str
    request: RequestRecord
    response: ResponseRecord
    action: dict[str, Any] | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    retries: int = 0
    latency_s: float = 0.0
    prev: str

    def what(self) -> str:
        """What the model did, in a few words: the tools it called, or its text's start."""
        action = self.action or {}
        calls = action.get("tool_calls") or []
        if calls:
            return "→ " + ", ".join(str(c.get("name")) for c in calls)
        text = " ".join(str(action.get("text") or "").split())
        if text:
            return json.dumps(text if len(text) <= 40 else text[:39] + "…", ensure_ascii=False)
        return f"{self.provider}:{self.model}"


class ToolError(_Line):
    type: str
    message: str


class ToolEvent(_Line):
    type: Literal["tool"] = "tool"
    step: int
    name: str
    arguments: dict[str, Any]
    effect: bool = False
    result: Any = None
    error: ToolError | None = None
    latency_s: float = 0.0
    prev: str


class NondetEvent(_Line):
    type: Literal["nondet"] = "nondet"
    kind: Literal["now", "uuid4", "random"]
    value: float | str
    prev: str


class TapeSeal(_Line):
    type: Literal["seal"] = "seal"
    events: int
    steps: int
    result: Any = None
    error: ToolError | None = None
    prev: str
    digest: str = ""


Event = Annotated[LlmEvent | ToolEvent | NondetEvent, Field(discriminator="type")]
Step = LlmEvent | ToolEvent
