"""A recording folder's manifest: what a batch is told about each failing tape beyond its
mark, in `manifest.json` beside the tapes. A JSON list, one entry a tape:

    [{"tape": "<name>.tape", "planted": "injected_note", "step": 1, "priority": 3}, ...]

`priority` weighs the trace's share of a batch's budget (`car-ray batch --split priority`);
`planted` and `step` say what the trace was planted with (generated traces: the batch's
summary is checked against them), `intervention` the kind that reveals it. A tape missing
from the manifest gets no priority and no planted cause."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..results._output import write_whole

MANIFEST_NAME = "manifest.json"


class ManifestError(ValueError):
    """A manifest that cannot be used: names the file, the entry and the key."""


class ManifestEntry(BaseModel):
    """One tape of the manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tape: str = Field(min_length=1)  # the tape's file name, in the manifest's folder
    planted: str | None = None  # the cause it was planted with: a kind's name, or "corrupt"
    step: int | None = Field(default=None, ge=0)  # the planted step
    intervention: str | None = None  # the intervention kind that shows the planted cause
    priority: float = Field(default=1.0, gt=0)


_ENTRIES: TypeAdapter[list[ManifestEntry]] = TypeAdapter(list[ManifestEntry])


def manifest_path(folder: str | os.PathLike[str]) -> Path:
    return Path(folder) / MANIFEST_NAME


def parse_manifest(data: bytes, where: str) -> dict[str, ManifestEntry]:
    """The entries of a manifest's bytes by tape name; `ManifestError` naming `where`, the
    entry and the key when it is not one."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: not JSON ({exc}); fix or remove the file") from None
    if not isinstance(raw, list):
        raise ManifestError(
            f"{where}: a manifest is a JSON list of entries "
            '({"tape": ..., "planted": ..., "step": ..., "priority": ...}), '
            f"not a {type(raw).__name__}"
        )
    try:
        entries = _ENTRIES.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        at, *key = first["loc"]  # a list's loc starts with the entry's index
        item = raw[int(at)]
        name = item.get("tape") if isinstance(item, dict) else None
        which = f"entry {at}" + (f" ({name!r})" if isinstance(name, str) else "")
        field = f", key {'.'.join(map(str, key))!r}" if key else ""
        raise ManifestError(f"{where}: {which}{field}: {first['msg']}") from None
    found: dict[str, ManifestEntry] = {}
    for index, entry in enumerate(entries):
        if Path(entry.tape).name != entry.tape or entry.tape in (".", ".."):
            raise ManifestError(
                f"{where}: entry {index}, key 'tape': {entry.tape!r} is not a file name; "
                "name a tape in the manifest's own folder"
            )
        if entry.tape in found:
            raise ManifestError(
                f"{where}: entry {index}, key 'tape': {entry.tape!r} is listed twice; keep one"
            )
        found[entry.tape] = entry
    return found


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, ManifestEntry]:
    """`folder`/manifest.json by tape name; `FileNotFoundError` when there is none,
    `ManifestError` naming the file, the entry and the key when it cannot be used."""
    path = manifest_path(folder)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no manifest (a JSON list of {{tape, planted, step, priority}} beside "
            "the tapes)"
        ) from None
    return parse_manifest(data, str(path))


def write_manifest(folder: str | os.PathLike[str], entries: Iterable[ManifestEntry]) -> Path:
    """Write `folder`/manifest.json whole (a temporary renamed over it)."""
    listed = list(entries)
    path = manifest_path(folder)
    data = _ENTRIES.dump_json(listed, indent=1, exclude_none=True) + b"\n"
    parse_manifest(data, str(path))  # the same checks as a reader's: no duplicate tape
    write_whole(path, data, sync=True)
    return path
