"""A nightly ETL agent that lands duplicate orders in production: two slips, both needed.

The day's orders export was partly re-sent by the source system (312 rows twice). The agent
inspects the file, transforms it (with or without de-duplication) and loads the batch (into
staging, whose uniqueness check rejects duplicates before promotion, or straight into
`prod.orders`). Duplicates reach production only when it both skips the de-duplication AND
loads straight into prod: each slip is necessary, neither is sufficient. How it inspects the
file first is a free choice that changes nothing. The async openai SDK, non-streaming. On the
recorded path the tape has 7 steps:

    0 llm → inspect_export (head or stats: irrelevant)   1 tool inspect_export
    2 llm → transform (A: dedupe=false)   3 tool transform
    4 llm → load_batch (B: target prod.orders)   5 tool load_batch   6 llm → summary
"""

from __future__ import annotations

import json
from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
MAX_TURNS = 6
SYSTEM = (
    "You run the nightly orders ETL. Inspect the export, transform it, load the batch, then "
    "summarise the run in one line."
)
EXPORT = "s3://exports/orders_2025-06-02.csv"
ROWS = 10_312
DUPLICATES = 312


def inspect_export(path: str, mode: str) -> dict[str, Any]:
    if mode == "head":
        return {
            "path": path,
            "head": ["order_id,customer,total", "O-99120,c-118,42.10", "O-99121,c-7,19.99"],
            "rows": ROWS,
        }
    return {"path": path, "rows": ROWS, "distinct_order_ids": ROWS - DUPLICATES}


def transform(path: str, dedupe: bool) -> dict[str, Any]:
    kind = "dedup" if dedupe else "raw"
    duplicates = 0 if dedupe else DUPLICATES
    return {
        "batch_id": f"B-0602-{kind}",
        "rows": ROWS - DUPLICATES + duplicates,
        "duplicates": duplicates,
    }


def load_batch(batch_id: str, target: str) -> dict[str, Any]:
    duplicates = DUPLICATES if batch_id.endswith("-raw") else 0
    if target == "prod.orders":
        return {"target": target, "loaded": True, "prod_duplicates": duplicates}
    # Staging promotes to prod only when its uniqueness check passes.
    promoted = duplicates == 0
    return {"target": target, "loaded": promoted, "prod_duplicates": 0, "qa_passed": promoted}


TOOL_FUNCTIONS = {
    "inspect_export": inspect_export,
    "transform": transform,
    "load_batch": load_batch,
}
PARAMETERS: dict[str, dict[str, Any]] = {
    "inspect_export": {"path": {"type": "string"}, "mode": {"enum": ["head", "stats"]}},
    "transform": {"path": {"type": "string"}, "dedupe": {"type": "boolean"}},
    "load_batch": {
        "batch_id": {"type": "string"},
        "target": {"enum": ["staging.orders", "prod.orders"]},
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, props in PARAMETERS.items()
]


async def etl_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.async_openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Load tonight's export {ctx.input['export']}."},
    ]
    loaded: dict[str, Any] | None = None
    for _turn in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return {"summary": message.content, "load": loaded}
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            output = ctx.tool(call.function.name, TOOL_FUNCTIONS[call.function.name], **arguments)
            if call.function.name == "load_batch":
                loaded = output
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(output)}
            )
    return {"summary": None, "load": loaded}


def duplicates_in_prod(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the run left duplicate orders in `prod.orders`."""
    load = result.get("load") if isinstance(result, dict) else None
    if load is None:
        loads = [s for s in trajectory if s["kind"] == "tool" and s["name"] == "load_batch"]
        load = loads[-1]["result"] if loads else None
    return 1.0 if load and load.get("prod_duplicates", 0) > 0 else 0.0
