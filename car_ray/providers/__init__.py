"""Wire formats of the model providers car-ray speaks, behind one `Codec` protocol."""

from __future__ import annotations

import os

from ._anthropic import AnthropicMessagesCodec
from ._openai import OpenAIChatCodec, seeded_body, unseeded_body
from ._pricing import DEFAULT_PRICING, Price, PriceTable
from ._responses import OpenAIResponsesCodec, as_input_items, as_items, response_of
from ._types import (
    SEED_HEADER,
    Action,
    ChatRequest,
    Codec,
    Draws,
    Message,
    ProviderFormatError,
    ProviderName,
    ToolCall,
    Usage,
    estimate_tokens,
    estimate_usage,
    iter_sse_data,
)

OPENAI = OpenAIChatCodec()
ANTHROPIC = AnthropicMessagesCodec()
RESPONSES = OpenAIResponsesCodec()
CODECS: tuple[Codec, ...] = (OPENAI, ANTHROPIC, RESPONSES)
# What car-ray reads, for a message about a call it cannot.
READS = "POST .../chat/completions and POST .../responses (OpenAI), POST .../messages (Anthropic)"


def codec_for_path(path: str) -> Codec | None:
    """The codec whose endpoint this URL path is, or None for any other request."""
    for codec in CODECS:
        if path.rstrip("/").endswith(codec.path_suffix):
            return codec
    return None


def codec_for(provider: str) -> Codec:
    for codec in CODECS:
        if codec.provider == provider:
            return codec
    raise ValueError(f"unknown provider {provider!r}: expected one of openai, anthropic")


__all__ = [
    "ANTHROPIC",
    "CODECS",
    "DEFAULT_PRICING",
    "OPENAI",
    "READS",
    "RESPONSES",
    "SEED_HEADER",
    "Action",
    "ChatRequest",
    "Codec",
    "Draws",
    "Message",
    "Price",
    "PriceTable",
    "ProviderFormatError",
    "ProviderName",
    "ToolCall",
    "Usage",
    "as_input_items",
    "as_items",
    "codec_for",
    "codec_for_path",
    "estimate_tokens",
    "estimate_usage",
    "iter_sse_data",
    "response_of",
    "seeded_body",
    "unseeded_body",
]


def api_keys_from_env() -> dict[str, str]:
    """OPENAI_API_KEY and ANTHROPIC_API_KEY, where set. They reach the provider in the
    request's headers and never a tape: the seam writes an allowlist of headers only."""
    keys = {
        "openai": os.environ.get("OPENAI_API_KEY"),
        "anthropic": os.environ.get("ANTHROPIC_API_KEY"),
    }
    return {k: v for k, v in keys.items() if v}
