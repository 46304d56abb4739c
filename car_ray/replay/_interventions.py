"""The five interventions, as data: what a fork does differently at one step."""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..providers import Action, ToolCall


class _Intervention(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resample(_Intervention):
    """Re-draw the step from the unchanged model (or re-run the unchanged tool)."""

    kind: Literal["resample"] = "resample"


class Probe(_Intervention):
    """Re-draw the step while the run is on the tape (every step before it reproduced the
    tape) and its request is the recorded one (re-run the tool on its recorded call);
    otherwise it keeps its mechanism, as a held step does, even at its recorded request
    after the run left the tape (a fresh draw there would change the fork). Not a
    user's intervention: the held-mechanism scheduler adds probes to a fork to learn whether
    steps it has not seen leave the tape, without changing what the fork measures (a probe
    that draws the recorded action answers as the tape does; one that does not is the
    fork's first deviation, and the fork then measures nothing else)."""

    kind: Literal["probe"] = "probe"


class SeedDraw(_Intervention):
    """Re-draw a model step, except where the run meets it on the tape at its recorded
    request: there answer as a fork of the same seed drew it (`action` None: the recorded
    answer, that fork having drawn the recorded decision; else that fork's action, forced).
    Not a user's intervention: off a provider that repeats a seed's draw, the Shapley stage
    makes a seed's forks draw each step at its recorded request once
    (`car_ray.schedule.estimators.SeedShapley.standing`)."""

    kind: Literal["seed_draw"] = "seed_draw"
    action: ForceAction | None = None


class Reask(_Intervention):
    """Ask a model step's request again and answer the agent with what the provider says:
    with the recorded draw's seed (`seed="recorded"`) or a fresh one. The fork's row says
    whether the answer was the recorded one word for word (`ForkRow.reproduced`). Not a
    user's intervention: a job against a live provider sends a few before its forks to learn
    whether the provider replays a draw (`car_ray.schedule.stages.ProviderDraws`)."""

    kind: Literal["reask"] = "reask"
    seed: Literal["recorded", "fresh"] = "recorded"


class ForcedToolCall(_Intervention):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ForceAction(_Intervention):
    """Force an llm step's response: a text, tool calls, or a whole provider body."""

    kind: Literal["action"] = "action"
    text: str | None = None
    tool_calls: list[ForcedToolCall] = Field(default_factory=list)
    body: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ForceAction:
        if self.body is not None and (self.text is not None or self.tool_calls):
            raise ValueError("give either 'body' or 'text'/'tool_calls', not both")
        if self.body is None and self.text is None and not self.tool_calls:
            raise ValueError("an action needs 'text', 'tool_calls' or 'body'")
        return self

    def action(self) -> Action:
        return Action(
            text=self.text,
            tool_calls=tuple(ToolCall(c.name, dict(c.arguments)) for c in self.tool_calls),
        )


class ReplaceObservation(_Intervention):
    """Replace a tool step's result (or make it fail with `error`); the tool does not run."""

    kind: Literal["observation"] = "observation"
    result: Any = None
    error: str | None = None


class ContextEdit(_Intervention):
    op: Literal["drop", "replace", "insert", "regex"]
    index: int | None = None
    message: dict[str, Any] | None = None
    pattern: str | None = None
    replacement: str = ""

    @model_validator(mode="after")
    def _fields_for_op(self) -> ContextEdit:
        if self.op in ("drop", "replace", "insert") and self.index is None:
            raise ValueError(f"context edit {self.op!r} needs 'index'")
        if self.op in ("replace", "insert") and self.message is None:
            raise ValueError(f"context edit {self.op!r} needs 'message'")
        if self.op == "regex":
            if not self.pattern:
                raise ValueError("context edit 'regex' needs 'pattern'")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"bad regex {self.pattern!r}: {exc}") from None
        return self


class EditContext(_Intervention):
    """Edit an llm step's request (drop / replace / insert messages, regex over text), then
    send it live. The messages are a chat request's `messages`, or a Responses request's
    `input` items (a string input is one user message); a regex also edits the system
    prompt (`system`, or `instructions`)."""

    kind: Literal["context"] = "context"
    edits: list[ContextEdit] = Field(min_length=1)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        edited = copy.deepcopy(body)
        key = "messages" if "messages" in edited or "input" not in edited else "input"
        if key == "input" and isinstance(edited["input"], str):
            edited["input"] = [{"role": "user", "content": edited["input"]}]
        messages = edited.get(key)
        if not isinstance(messages, list):
            raise ValueError("the request has no 'messages' (or Responses 'input') list to edit")
        system = "instructions" if key == "input" else "system"
        for edit in self.edits:
            if edit.op == "regex":
                assert edit.pattern is not None
                pattern = re.compile(edit.pattern)
                before = (messages, edited.get(system))
                edited[key] = messages = _sub_strings(messages, pattern, edit.replacement)
                if system in edited:
                    edited[system] = _sub_strings(edited[system], pattern, edit.replacement)
                if not _matches(before, pattern):
                    # An edit that changes nothing would measure the unchanged step.
                    raise ValueError(
                        f"context edit 'regex': {edit.pattern!r} matches no text of the request"
                    )
                continue
            assert edit.index is not None
            size = len(messages) + (1 if edit.op == "insert" else 0)
            if not -size <= edit.index < size:
                raise ValueError(
                    f"context edit {edit.op!r}: index {edit.index} is outside the "
                    f"{len(messages)} messages"
                )
            if edit.op == "drop":
                del messages[edit.index]
            elif edit.op == "replace":
                messages[edit.index] = edit.message
            else:
                messages.insert(edit.index, edit.message)
        return edited


# The keys whose values are text a regex edit reads and rewrites: a message's content and a
# part's text, and a Responses function call's output.
_TEXT_KEYS = ("content", "text", "output")


def _matches(value: Any, pattern: re.Pattern[str]) -> bool:
    """Whether `pattern` finds any text `_sub_strings` would edit."""
    if isinstance(value, str):
        return pattern.search(value) is not None
    if isinstance(value, list | tuple):
        return any(_matches(v, pattern) for v in value)
    if isinstance(value, dict):
        return any(_matches(v, pattern) for k, v in value.items() if k in _TEXT_KEYS)
    return False


def _sub_strings(value: Any, pattern: re.Pattern[str], replacement: str) -> Any:
    if isinstance(value, str):
        return pattern.sub(replacement, value)
    if isinstance(value, list):
        return [_sub_strings(v, pattern, replacement) for v in value]
    if isinstance(value, dict):
        # Only text is edited: keys, roles, ids and tool names stay as they are.
        return {
            k: _sub_strings(v, pattern, replacement) if k in _TEXT_KEYS else v
            for k, v in value.items()
        }
    return value


class SwapPolicy(_Intervention):
    """From this step on, send model calls to another model (and/or base URL of the same
    wire protocol)."""

    kind: Literal["policy"] = "policy"
    model: str | None = None
    base_url: str | None = None

    @model_validator(mode="after")
    def _something(self) -> SwapPolicy:
        if self.model is None and self.base_url is None:
            raise ValueError("a policy intervention needs 'model' and/or 'base_url'")
        return self


Intervention = Annotated[
    Resample
    | ForceAction
    | ReplaceObservation
    | EditContext
    | SwapPolicy
    | Probe
    | Reask
    | SeedDraw,
    Field(discriminator="kind"),
]
INTERVENTION_KINDS = ("resample", "action", "observation", "context", "policy")
