"""OpenAI chat completions: requests, JSON and SSE responses."""

from __future__ import annotations

import json
from typing import Any

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

_CREATED = 1_767_225_600  # a fixed timestamp keeps rendered bodies reproducible


def seeded_body(data: bytes, body: Any, seed: int) -> bytes:
    """A chat completion's body (`data`, and `body`, it parsed: None if it is not JSON) with
    OpenAI's `seed` (best effort: an identical request with the same seed answers the same)
    set to `seed`. The key is appended to the object as it was sent, every other byte kept,
    so `unseeded_body` gives the body back; a body with a `seed` of its own is written anew
    with it replaced; a body that is not a JSON object is sent as it is."""
    if not isinstance(body, dict):
        return data
    if "seed" in body:
        return json.dumps({**body, "seed": seed}, separators=(",", ":")).encode()
    text = data.rstrip()
    head = text[:-1]
    comma = b"" if head.rstrip().endswith(b"{") else b","
    return head + comma + b'"seed":%d}' % seed


def unseeded_body(data: bytes, seed: int) -> bytes:
    """The body `seeded_body` made `data` from with `seed` (`data` itself if it did not)."""
    tail = b'"seed":%d}' % seed
    text = data.rstrip()
    if not text.endswith(tail):
        return data
    head = text[: -len(tail)]
    if head.endswith(b","):
        return head[:-1] + b"}"
    return head + b"}" if head.rstrip().endswith(b"{") else data


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    raise ProviderFormatError(f"openai message content must be text or parts, got {content!r}")


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError) as exc:
        raise ProviderFormatError(f"{where}: tool arguments are not JSON: {raw!r}") from exc
    if not isinstance(parsed, dict):
        raise ProviderFormatError(f"{where}: tool arguments must be a JSON object")
    return parsed


class OpenAIChatCodec:
    provider: ProviderName = "openai"
    path_suffix = "/chat/completions"
    id_prefix = "chatcmpl-"

    def parse_request(self, body: dict[str, Any]) -> ChatRequest:
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list):
            raise ProviderFormatError("openai request: 'messages' must be a list")
        messages: list[Message] = []
        for i, m in enumerate(raw_messages):
            role = m.get("role")
            if role == "developer":
                role = "system"
            if role not in ("system", "user", "assistant", "tool"):
                raise ProviderFormatError(f"openai request: messages[{i}].role {role!r} unknown")
            calls = tuple(
                ToolCall(
                    name=c["function"]["name"],
                    arguments=_arguments(c["function"].get("arguments"), f"messages[{i}]"),
                    id=c.get("id", ""),
                )
                for c in m.get("tool_calls") or []
            )
            messages.append(
                Message(
                    role=role,
                    content=_text_of(m.get("content")),
                    tool_calls=calls,
                    tool_call_id=m.get("tool_call_id"),
                )
            )
        tools = tuple(
            t["function"]["name"] for t in body.get("tools") or [] if t.get("type") == "function"
        )
        options = body.get("stream_options") or {}
        return ChatRequest(
            provider="openai",
            model=str(body.get("model", "")),
            messages=tuple(messages),
            tools=tools,
            stream=bool(body.get("stream")),
            include_usage=bool(options.get("include_usage")),
            raw=body,
        )

    def render_response(
        self, request: ChatRequest, action: Action, usage: Usage, response_id: str
    ) -> bytes:
        calls: list[dict[str, Any]] = [
            {
                "id": c.id or f"call_{response_id[-12:]}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(action.tool_calls)
        ]
        finish = "tool_calls" if calls else "stop"
        usage_json = {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        }
        if not request.stream:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": action.text,
                "refusal": None,
            }
            if calls:
                message["tool_calls"] = calls
            return json.dumps(
                {
                    "id": response_id,
                    "object": "chat.completion",
                    "created": _CREATED,
                    "model": request.model,
                    "choices": [
                        {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                    ],
                    "usage": usage_json,
                },
                separators=(",", ":"),
            ).encode()

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            return sse_event(
                {
                    "id": response_id,
                    "object": "chat.completion.chunk",
                    "created": _CREATED,
                    "model": request.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                }
            )

        out = [chunk({"role": "assistant", "content": ""})]
        if action.text:
            out.extend(chunk({"content": piece}) for piece in chunks_of(action.text))
        for i, call in enumerate(calls):
            head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            out.append(chunk({"tool_calls": [{"index": i, **head}]}))
            for piece in chunks_of(call["function"]["arguments"]):
                out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        out.append(chunk({}, finish))
        if request.include_usage:
            out.append(
                sse_event(
                    {
                        "id": response_id,
                        "object": "chat.completion.chunk",
                        "created": _CREATED,
                        "model": request.model,
                        "choices": [],
                        "usage": usage_json,
                    }
                )
            )
        out.append(sse_event("[DONE]"))
        return b"".join(out)

    def answer_ids(self, body: bytes, stream: bool) -> tuple[str, ...]:
        return tuple(call.id for call in self.parse_response(body, stream)[0].tool_calls)

    def parse_response(self, body: bytes, stream: bool) -> tuple[Action, Usage]:
        if not stream:
            try:
                data = json.loads(body)
                message = data["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise ProviderFormatError("openai response is not a chat completion") from exc
            calls = tuple(
                ToolCall(
                    name=c["function"]["name"],
                    arguments=_arguments(c["function"].get("arguments"), "response"),
                    id=c.get("id", ""),
                )
                for c in message.get("tool_calls") or []
            )
            usage = data.get("usage") or {}
            return (
                Action(text=message.get("content"), tool_calls=calls),
                Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
            )
        text: list[str] = []
        pending: dict[int, dict[str, str]] = {}
        found = Usage()
        for _event, data_text in iter_sse_data(body):
            if data_text == "[DONE]":
                break
            data = json.loads(data_text)
            if data.get("usage"):
                u = data["usage"]
                found = Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0))
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    slot = pending.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
        calls = tuple(
            ToolCall(s["name"], _arguments(s["arguments"], "stream"), s["id"])
            for _, s in sorted(pending.items())
        )
        return Action(text="".join(text) or None, tool_calls=calls), found
