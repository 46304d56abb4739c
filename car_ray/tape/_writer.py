"""Append-only, crash-safe tape recording: every line is fsynced before the agent goes on."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .._canon import line_bytes, sha256_hex
from ._model import TapeHeader, TapeSeal, ToolError


class TapeWriter:
    """Writes one tape: the header at open, events as they happen, the seal at close.

    `fsync=False` keeps one write a line (a killed process still leaves whole lines) but
    leaves flushing to the OS: a power loss may lose the last lines, and no line waits on
    the disk."""

    def __init__(
        self, path: Path, header: TapeHeader, *, overwrite: bool = False, fsync: bool = True
    ) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except FileExistsError:
            raise FileExistsError(
                f"{self.path} already exists: a tape is never overwritten by accident; "
                "choose another path, or replace it (record's --force; overwrite=True)"
            ) from None
        self._lock = threading.Lock()
        self._chain = ""
        self._events = 0
        self._steps = 0
        self.tape_id: str | None = None
        self._append(header.model_dump(mode="json") | {"prev": ""})

    def _append(self, line: dict[str, Any]) -> None:
        data = line_bytes(line)
        # One write per line, then fsync: a killed recorder leaves whole lines only
        # (a torn last line is detected and dropped by the loader).
        os.write(self._fd, data + b"\n")
        if self._fsync:
            os.fsync(self._fd)
        self._chain = sha256_hex(data)

    def append_event(self, event: dict[str, Any]) -> None:
        """Chain, write and fsync one event (`llm`, `tool` or `nondet`, without `prev`)."""
        with self._lock:
            if self.tape_id is not None:
                raise RuntimeError(f"{self.path}: the tape is sealed; no event can follow")
            self._append({**event, "prev": self._chain})
            self._events += 1
            if event["type"] in ("llm", "tool"):
                self._steps += 1

    def seal(self, result: Any = None, error: ToolError | None = None) -> str:
        """Write the seal line and close; returns the tape id (the seal's digest)."""
        with self._lock:
            try:
                json.dumps(result, allow_nan=False)
            except (TypeError, ValueError) as exc:
                error = error or ToolError(type="ResultNotJSON", message=str(exc))
                result = None
            seal = TapeSeal(
                events=self._events, steps=self._steps, result=result, error=error, prev=self._chain
            )
            body = seal.model_dump(mode="json", exclude={"digest"})
            self.tape_id = sha256_hex(line_bytes(body))
            self._append({**body, "digest": self.tape_id})
            os.close(self._fd)
            return self.tape_id

    def close_unsealed(self) -> None:
        with self._lock:
            if self.tape_id is None:
                os.close(self._fd)
