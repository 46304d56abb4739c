"""Anthropic messages: requests, JSON and SSE responses."""

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


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and "text" in b
        )
    return ""


class AnthropicMessagesCodec:
    provider: ProviderName = "anthropic"
    path_suffix = "/messages"
    id_prefix = "msg_"

    def parse_request(self, body: dict[str, Any]) -> ChatRequest:
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list):
            raise ProviderFormatError("anthropic request: 'messages' must be a list")
        messages: list[Message] = []
        if body.get("system"):
            messages.append(Message("system", _block_text(body["system"])))
        for i, m in enumerate(raw_messages):
            role = m.get("role")
            if role not in ("user", "assistant"):
                raise ProviderFormatError(f"anthropic request: messages[{i}].role {role!r} unknown")
            content = m.get("content")
            if isinstance(content, str):
                messages.append(Message(role, content))
                continue
            if not isinstance(content, list):
                raise ProviderFormatError(f"anthropic request: messages[{i}].content malformed")
            texts: list[str] = []
            calls: list[ToolCall] = []
            for block in content:
                kind = block.get("type")
                if kind == "text":
                    texts.append(str(block.get("text", "")))
                elif kind == "tool_use":
                    calls.append(
                        ToolCall(block["name"], dict(block.get("input") or {}), block["id"])
                    )
                elif kind == "tool_result":
                    messages.append(
                        Message(
                            "tool",
                            _block_text(block.get("content", "")),
                            tool_call_id=block.get("tool_use_id"),
                        )
                    )
            if texts or calls:
                messages.append(Message(role, "".join(texts), tool_calls=tuple(calls)))
        tools = tuple(str(t["name"]) for t in body.get("tools") or [] if "name" in t)
        return ChatRequest(
            provider="anthropic",
            model=str(body.get("model", "")),
            messages=tuple(messages),
            tools=tools,
            stream=bool(body.get("stream")),
            include_usage=True,
            raw=body,
        )

    def render_response(
        self, request: ChatRequest, action: Action, usage: Usage, response_id: str
    ) -> bytes:
        blocks: list[dict[str, Any]] = []
        if action.text:
            blocks.append({"type": "text", "text": action.text})
        for i, c in enumerate(action.tool_calls):
            blocks.append(
                {
                    "type": "tool_use",
                    "id": c.id or f"toolu_{response_id[-12:]}_{i}",
                    "name": c.name,
                    "input": c.arguments,
                }
            )
        stop = "tool_use" if action.tool_calls else "end_turn"
        if not request.stream:
            return json.dumps(
                {
                    "id": response_id,
                    "type": "message",
                    "role": "assistant",
                    "model": request.model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": usage.input_tokens,
                        "output_tokens": usage.output_tokens,
                    },
                },
                separators=(",", ":"),
            ).encode()
        out = [
            sse_event(
                {
                    "type": "message_start",
                    "message": {
                        "id": response_id,
                        "type": "message",
                        "role": "assistant",
                        "model": request.model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": usage.input_tokens, "output_tokens": 1},
                    },
                },
                "message_start",
            )
        ]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                start: dict[str, Any] = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in chunks_of(block["text"])]
            else:
                start = {**block, "input": {}}
                deltas = [
                    {"type": "input_json_delta", "partial_json": p}
                    for p in chunks_of(json.dumps(block["input"]))
                ]
            out.append(
                sse_event(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            out.extend(
                sse_event(
                    {"type": "content_block_delta", "index": index, "delta": d},
                    "content_block_delta",
                )
                for d in deltas
            )
            out.append(
                sse_event({"type": "content_block_stop", "index": index}, "content_block_stop")
            )
        out.append(
            sse_event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage.output_tokens},
                },
                "message_delta",
            )
        )
        out.append(sse_event({"type": "message_stop"}, "message_stop"))
        return b"".join(out)

    def answer_ids(self, body: bytes, stream: bool) -> tuple[str, ...]:
        return tuple(call.id for call in self.parse_response(body, stream)[0].tool_calls)

    def parse_response(self, body: bytes, stream: bool) -> tuple[Action, Usage]:
        if not stream:
            try:
                data = json.loads(body)
                blocks = data["content"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ProviderFormatError("anthropic response is not a message") from exc
            usage = data.get("usage") or {}
            return _action_of(blocks), Usage(
                usage.get("input_tokens", 0), usage.get("output_tokens", 0)
            )
        blocks_by_index: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        input_tokens = output_tokens = 0
        for _event, data_text in iter_sse_data(body):
            data = json.loads(data_text)
            kind = data.get("type")
            if kind == "message_start":
                u = data["message"].get("usage") or {}
                input_tokens = u.get("input_tokens", 0)
                output_tokens = u.get("output_tokens", 0)
            elif kind == "content_block_start":
                blocks_by_index[data["index"]] = dict(data["content_block"])
            elif kind == "content_block_delta":
                delta = data["delta"]
                block = blocks_by_index[data["index"]]
                if delta.get("type") == "text_delta":
                    block["text"] = block.get("text", "") + delta["text"]
                elif delta.get("type") == "input_json_delta":
                    partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
            elif kind == "message_delta":
                output_tokens = (data.get("usage") or {}).get("output_tokens", output_tokens)
        for index, text in partial.items():
            blocks_by_index[index]["input"] = json.loads(text or "{}")
        blocks = [blocks_by_index[i] for i in sorted(blocks_by_index)]
        return _action_of(blocks), Usage(input_tokens, output_tokens)


def _action_of(blocks: list[dict[str, Any]]) -> Action:
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = tuple(
        ToolCall(b["name"], dict(b.get("input") or {}), b.get("id", ""))
        for b in blocks
        if b.get("type") == "tool_use"
    )
    return Action(text=text or None, tool_calls=calls)
