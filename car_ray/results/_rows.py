"""The row models of the job's tables, and everything derived from them: the Arrow schema
(a field's annotation gives its type, `X | None` a nullable column), the allowed values of a
`Literal` field, and the per-field checks a row passes before it is taken. A new column is one
line in its model."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import pyarrow as pa
from pydantic import BaseModel

from ..replay import ForkRow, Int32, IntBits

Stage = Literal[
    "verify", "draws", "controls", "screen", "race", "groups", "shapley", "arms", "uniform"
]
StepKind = Literal["llm", "tool"]


class ForkRecord(ForkRow):
    """A row of `forks/*.parquet`: the fork's own fields (`ForkRow`, in its order), then where
    and how the job ran it."""

    job_id: str
    stage: Stage
    spec: str  # the `ForkSpec`, as `model_dump_json()`
    worker: str | None
    attempt: Int32
    finished_at: datetime  # timezone-aware


class AttributionRow(BaseModel):
    """A row of `attribution.parquet`: one step and intervention kind, each measure with its
    interval and count (None: not measured), and its rank within the kind."""

    job_id: str | None = None
    step: Int32
    # The step's kind (llm or tool); `intervention` is what the forks did to it.
    step_kind: StepKind
    label: str
    intervention: str
    flip_rate: float | None = None
    flip_lo: float | None = None
    flip_hi: float | None = None
    flip_n: int = 0
    phi: float | None = None
    phi_lo: float | None = None
    phi_hi: float | None = None
    phi_se: float | None = None
    necessity: float | None = None
    necessity_lo: float | None = None
    necessity_hi: float | None = None
    necessity_n: int = 0
    sufficiency: float | None = None
    sufficiency_lo: float | None = None
    sufficiency_hi: float | None = None
    sufficiency_n: int = 0
    rank: Int32 | None = None
    # The level every interval of the row is at (the job's `confidence`).
    confidence: float | None = None
    # An observation arm's: what its replacement takes out of the recorded result, in words
    # (`results.replaced_part`); None for other arms, or where nothing recorded differs.
    replaced: str | None = None


class SchemaError(ValueError):
    """A row that does not fit its table's schema; the message names the field."""


# ---------------------------------------------------------------------------------------------
# Annotation -> Arrow.

_SCALARS: dict[Any, pa.DataType] = {
    str: pa.string(),
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    datetime: pa.timestamp("us", tz="UTC"),
}


@dataclass(frozen=True)
class _Column:
    field: pa.Field
    allowed: frozenset[str] | None  # a Literal's values


def _column(name: str, annotation: Any) -> _Column:
    args = get_args(annotation)
    nullable = False
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"row field {name!r}: {annotation} is not one type or None")
        annotation, nullable = rest[0], True
    dtype, allowed = _arrow_type(name, annotation)
    return _Column(pa.field(name, dtype, nullable=nullable), allowed)


def _arrow_type(name: str, annotation: Any) -> tuple[pa.DataType, frozenset[str] | None]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        bits = [m.bits for m in annotation.__metadata__ if isinstance(m, IntBits)]
        if args[0] is int and bits:
            dtype: pa.DataType = getattr(pa, f"int{bits[0]}")()  # int8 ... int64
            return dtype, None
        return _arrow_type(name, args[0])
    if origin is Literal and all(isinstance(a, str) for a in args):
        return pa.string(), frozenset(args)
    if origin is list:
        item, _ = _arrow_type(name, args[0])
        return pa.list_(item), None
    if annotation in _SCALARS:
        return _SCALARS[annotation], None
    raise TypeError(f"row field {name!r}: no Arrow type for {annotation!r}")


def _columns(model: type[BaseModel]) -> list[_Column]:
    hints = get_type_hints(model, include_extras=True)
    return [_column(name, hints[name]) for name in model.model_fields]


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The Arrow schema of a row model: its fields in order, nullable where `X | None`."""
    return pa.schema([c.field for c in _columns(model)])


# ---------------------------------------------------------------------------------------------
# Row checks: pyarrow would coerce or fail deep inside a batch; these fail at `add`, by name.

_Check = Callable[[Any], str | None]


def _check_for(dtype: pa.DataType) -> _Check:
    if pa.types.is_string(dtype):
        return lambda v: None if isinstance(v, str) else "a string"
    if pa.types.is_boolean(dtype):
        return lambda v: None if isinstance(v, bool) else "a bool"
    if pa.types.is_integer(dtype):
        bits = dtype.bit_width - 1
        lo, hi = -(2**bits), 2**bits - 1

        def check_int(v: Any) -> str | None:
            if isinstance(v, bool) or not isinstance(v, int):
                return f"an integer ({dtype})"
            return None if lo <= v <= hi else f"an integer within {dtype} range"

        return check_int
    if pa.types.is_floating(dtype):
        return lambda v: (
            None if isinstance(v, int | float) and not isinstance(v, bool) else "a number"
        )
    if pa.types.is_timestamp(dtype):
        return lambda v: (
            None
            if isinstance(v, datetime) and v.tzinfo is not None
            else "a timezone-aware datetime"
        )
    if pa.types.is_list(dtype):
        check_item = _check_for(dtype.value_type)

        def check_list(v: Any) -> str | None:
            if not isinstance(v, list | tuple):
                return f"a list ({dtype})"
            for i, item in enumerate(v):
                problem = check_item(item)
                if problem is not None:
                    return f"a list whose items are {problem} (item {i} is {item!r})"
            return None

        return check_list
    raise TypeError(f"no row check for Arrow type {dtype}")


@dataclass(frozen=True)
class RowShape:
    """A row model's schema and per-field checks, compiled once."""

    what: str
    key: str
    schema: pa.Schema
    names: frozenset[str]
    checks: tuple[tuple[str, bool, _Check, frozenset[str] | None], ...]

    @classmethod
    def of(cls, what: str, key: str, model: type[BaseModel]) -> RowShape:
        columns = _columns(model)
        schema = pa.schema([c.field for c in columns])
        checks = tuple(
            (c.field.name, c.field.nullable, _check_for(c.field.type), c.allowed) for c in columns
        )
        return cls(what, key, schema, frozenset(schema.names), checks)

    def normalize(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The row in schema order, absent nullable fields as None; a misfit raises SchemaError."""
        unknown = [k for k in row if k not in self.names]
        if unknown:
            raise SchemaError(
                f"{self._where(row)}: field {unknown[0]!r} is not in the {self.what} schema "
                f"(known fields: {', '.join(self.schema.names)})"
            )
        out: dict[str, Any] = {}
        for name, nullable, check, allowed in self.checks:
            value = row.get(name)
            if value is None:
                if not nullable:
                    state = "is None" if name in row else "is missing"
                    raise SchemaError(f"{self._where(row)}: field {name!r} {state}; it is required")
            else:
                problem = check(value)
                if problem is None and allowed is not None and value not in allowed:
                    problem = "one of " + ", ".join(sorted(allowed))
                if problem is not None:
                    shown = repr(value)
                    shown = shown if len(shown) <= 80 else shown[:77] + "..."
                    raise SchemaError(
                        f"{self._where(row)}: field {name!r} is {shown} "
                        f"({type(value).__name__}); expected {problem}"
                    )
            out[name] = value
        return out

    def _where(self, row: Mapping[str, Any]) -> str:
        ident = row.get(self.key)
        return self.what if ident is None else f"{self.what} ({self.key}={ident!r})"

    def table(self, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist(list(rows), schema=self.schema)

    def to_json(self, record: Mapping[str, Any]) -> bytes:
        """A normalized row as one JSON line (timestamps in ISO 8601, with their offset)."""
        return (json.dumps(record, default=_iso) + "\n").encode("ascii")

    def from_json(self, line: bytes) -> dict[str, Any]:
        """A row from `to_json`'s line: the schema's timestamp fields parsed, then checked."""
        row = json.loads(line)
        if not isinstance(row, dict):
            raise SchemaError(f"{self.what}: expected a JSON object, got {type(row).__name__}")
        for field in self.schema:
            if pa.types.is_timestamp(field.type) and isinstance(row.get(field.name), str):
                row[field.name] = datetime.fromisoformat(row[field.name])
        return self.normalize(row)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


FORK_ROWS = RowShape.of("fork row", "task_id", ForkRecord)
ATTRIBUTION_ROWS = RowShape.of("attribution row", "step", AttributionRow)
FORK_SCHEMA = FORK_ROWS.schema
ATTRIBUTION_SCHEMA = ATTRIBUTION_ROWS.schema


def fork_record(row: ForkRow, extras: Mapping[str, Any]) -> dict[str, Any]:
    """A fork row for `ForkSink.add`: the fork's own fields plus the job's (`job_id`, `stage`,
    `spec` as `ForkSpec.model_dump_json()`, `worker`, `attempt`, `finished_at`), checked."""
    own = row.model_dump()
    clash = [k for k in extras if k in own]
    if clash:
        raise SchemaError(
            f"fork row (task_id={row.task_id!r}): extra field {clash[0]!r} "
            "would overwrite the fork's own field of that name"
        )
    return FORK_ROWS.normalize({**own, **extras})
