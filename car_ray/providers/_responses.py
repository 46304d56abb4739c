"""The OpenAI Responses API: requests (input items, instructions, function tools), JSON and
SSE (`response.*` events) responses."""

from __future__ import annotations

import json
from typing import Any

from ._openai import _CREATED, _arguments, _text_of
from ._types import (
    Action,
    ChatRequest,
    Message,
    ProviderFormatError,
    ProviderName,
    ToolCall,
    Usage,
    chunks_of,
    iter_sse_data,
    sse_event,
)

# Input items that carry nothing a policy reads: kept in the request as data.
_SKIPPED_ITEMS = frozenset({"reasoning", "item_reference"})
_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def input_messages(items: Any, where: str = "openai responses request") -> list[Message]:
    """A Responses `input` (a string, or a list of items) as chat messages: a message item
    by its role and text, a function call joined to the assistant turn before it, a
    function call's output as a tool message; reasoning items and item references carry
    nothing a policy reads and are skipped."""
    if isinstance(items, str):
        return [Message("user", items)]
    if not isinstance(items, list):
        raise ProviderFormatError(f"{where}: 'input' must be a string or a list of items")
    messages: list[Message] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProviderFormatError(f"{where}: input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(str(item.get("role")))
            if role is None:
                raise ProviderFormatError(f"{where}: input[{i}].role {item.get('role')!r} unknown")
            messages.append(Message(role, _text_of(item.get("content"))))  # type: ignore[arg-type]
        elif kind == "function_call":
            call = ToolCall(
                name=str(item.get("name")),
                arguments=_arguments(item.get("arguments"), f"{where}: input[{i}]"),
                id=str(item.get("call_id") or ""),
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = Message("assistant", last.content, (*last.tool_calls, call))
            else:
                messages.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output)
            messages.append(Message("tool", text, tool_call_id=str(item.get("call_id") or "")))
        elif kind not in _SKIPPED_ITEMS:
            raise ProviderFormatError(
                f"{where}: input[{i}] is a {kind!r} item; car-ray reads message, function_call, "
                "function_call_output and reasoning items"
            )
    return messages


def output_items(action: Action, response_id: str) -> list[dict[str, Any]]:
    """An action as a response's `output`: a message with its text, then one function call
    item per tool call."""
    out: list[dict[str, Any]] = []
    tail = response_id[-20:]
    if action.text:
        out.append(
            {
                "type": "message",
                "id": f"msg_{tail}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": action.text, "annotations": []}],
            }
        )
    for i, call in enumerate(action.tool_calls):
        out.append(
            {
                "type": "function_call",
                "id": f"fc_{tail}_{i}",
                "call_id": call.id or f"call_{tail[-12:]}_{i}",
                "name": call.name,
                "arguments": json.dumps(call.arguments),
                "status": "completed",
            }
        )
    return out


def as_input_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the input items of a later request (what a client that
    keeps its own conversation sends back)."""
    items: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            items.append({"role": "assistant", "content": item.get("content") or []})
        elif item.get("type") == "function_call":
            items.append(
                {k: item[k] for k in ("type", "call_id", "name", "arguments") if k in item}
            )
        else:
            items.append(item)
    return items


def as_items(value: Any) -> list[Any]:
    """A request's `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def response_of(body: bytes, stream: bool) -> dict[str, Any]:
    """The response object of an answer: the JSON, or a stream's `response.completed`."""
    if not stream:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ProviderFormatError("openai responses answer is not a response object")
        return data
    for _event, data_text in reversed(iter_sse_data(body)):
        event = json.loads(data_text)
        if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            return dict(event["response"])
    raise ProviderFormatError("openai responses stream has no response.completed")


def _action_of(response: dict[str, Any]) -> tuple[Action, Usage]:
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    text.append(str(part.get("text", "")))
        elif item.get("type") == "function_call":
            args = _arguments(item.get("arguments"), "openai responses output")
            calls.append(ToolCall(str(item.get("name")), args, str(item.get("call_id") or "")))
    usage = response.get("usage") or {}
    return (
        Action(text="".join(text) or None, tool_calls=tuple(calls)),
        Usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0)),
    )


class OpenAIResponsesCodec:
    provider: ProviderName = "openai"
    path_suffix = "/responses"
    id_prefix = "resp_"

    def parse_request(self, body: dict[str, Any]) -> ChatRequest:
        if "input" not in body:
            raise ProviderFormatError("openai responses request: 'input' is missing")
        messages = input_messages(body["input"])
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            messages.insert(0, Message("system", instructions))
        tools = tuple(
            str(t.get("name")) for t in body.get("tools") or [] if t.get("type") == "function"
        )
        return ChatRequest(
            provider="openai",
            model=str(body.get("model", "")),
            messages=tuple(messages),
            tools=tools,
            stream=bool(body.get("stream")),
            include_usage=True,
            raw=body,
        )

    def response(
        self, request: ChatRequest, action: Action, usage: Usage, response_id: str
    ) -> dict[str, Any]:
        """The whole response object, as `responses.create` returns it."""
        body = request.raw
        return {
            "id": response_id,
            "object": "response",
            "created_at": _CREATED,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {},
            "model": request.model,
            "output": output_items(action, response_id),
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "previous_response_id": body.get("previous_response_id"),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "usage": {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        }

    def render_response(
        self, request: ChatRequest, action: Action, usage: Usage, response_id: str
    ) -> bytes:
        done = self.response(request, action, usage, response_id)
        if not request.stream:
            return json.dumps(done, separators=(",", ":")).encode()
        events: list[dict[str, Any]] = []

        def emit(kind: str, **fields: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **fields})

        started = {**done, "status": "in_progress", "output": [], "usage": None}
        emit("response.created", response=started)
        emit("response.in_progress", response=started)
        for index, item in enumerate(done["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                emit("response.content_part.added", **where, part=part)
                for piece in chunks_of(text):
                    emit("response.output_text.delta", **where, delta=piece, logprobs=[])
                emit("response.output_text.done", **where, text=text, logprobs=[])
                emit("response.content_part.done", **where, part=item["content"][0])
            else:
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                where = {"item_id": item["id"], "output_index": index}
                for piece in chunks_of(item["arguments"]):
                    emit("response.function_call_arguments.delta", **where, delta=piece)
                emit("response.function_call_arguments.done", **where, arguments=item["arguments"])
            emit("response.output_item.done", output_index=index, item=item)
        emit("response.completed", response=done)
        return b"".join(sse_event(e, e["type"]) for e in events)

    def answer_ids(self, body: bytes, stream: bool) -> tuple[str, ...]:
        response = response_of(body, stream)
        out = [str(response.get("id") or "")]
        for item in response.get("output") or []:
            out += [str(item.get("id") or ""), str(item.get("call_id") or "")]
        return tuple(out)

    def parse_response(self, body: bytes, stream: bool) -> tuple[Action, Usage]:
        if not stream:
            try:
                data = json.loads(body)
            except ValueError as exc:
                raise ProviderFormatError("openai responses answer is not JSON") from exc
            if not isinstance(data, dict) or data.get("object") != "response":
                raise ProviderFormatError("openai responses answer is not a response object")
            return _action_of(data)
        final: dict[str, Any] | None = None
        items: dict[int, dict[str, Any]] = {}
        for _event, data_text in iter_sse_data(body):
            if data_text == "[DONE]":
                break
            event = json.loads(data_text)
            kind = event.get("type")
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                final = event.get("response")
            elif kind == "response.output_item.done":
                items[int(event.get("output_index", len(items)))] = event.get("item") or {}
        if final is None:
            if not items:
                raise ProviderFormatError("openai responses stream has no response.completed")
            final = {"output": [items[k] for k in sorted(items)]}
        return _action_of(final)
