"""Canonical JSON and content addresses: the one place bytes are hashed."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_bytes(value: Any) -> bytes:
    """JSON with sorted keys, no spaces and raw UTF-8: equal values give equal bytes."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """The sha256 of a JSON value's canonical bytes."""
    return sha256_hex(canonical_bytes(value))


def line_bytes(value: Any) -> bytes:
    """JSON for one tape line: compact and UTF-8, keys in their given order (a tool's result
    keeps the order the agent saw)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def json_roundtrip(value: Any) -> Any:
    """The value as it loads back from a tape (tuples become lists, keys stay in order)."""
    return json.loads(line_bytes(value))
