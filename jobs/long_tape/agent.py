"""A pricing agent that misreads "10% markup" once, then faithfully applies it 30 times.

Asked to apply a 10% markup to the spring catalog, the agent fetches the catalog, sets the
markup rule and then stages a new price for each of its 30 items, one model call and one
tool call per item, before a closing summary. If the rule is set as a factor of 0.10 instead
of 1.10, every staged price falls below cost; nothing says so until the staged prices are
compared with the costs at the end. No SDK: the agent posts OpenAI chat completions with
`ctx.http_client` (as an agent in another language would through a proxy), so a fork of its
65 steps costs what car-ray costs; the openai SDK's request transform alone took 4.6 s of
5.7 s over five forks (it walks every message of every request). On the recorded path
the tape has 65 steps (33 model calls):

    0 llm → get_catalog (page size 50 or 100: irrelevant)   1 tool get_catalog
    2 llm → set_markup (factor 0.10)   3 tool set_markup
    4 llm → update_price (item 1)   5 tool update_price   ...
    62 llm → update_price (item 30)   63 tool update_price   64 llm → summary

(step 4 + 2i is the model call for item i + 1 and step 5 + 2i its tool call).
"""

from __future__ import annotations

import json
from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
MAX_TURNS = 40
SYSTEM = (
    "You maintain the shop's prices. Fetch the catalog, set the markup rule with set_markup, "
    "stage the new price of every item with update_price (one item per call), then summarise."
)
NAMES = [
    "linen shirt", "canvas tote", "straw hat", "rain jacket", "denim shorts", "sandals",
    "sun dress", "polo shirt", "chinos", "espadrilles", "bucket hat", "windbreaker",
    "tank top", "cargo shorts", "sneakers", "swim trunks", "kimono", "beach towel",
    "sunglasses", "flip flops", "cap", "cardigan", "skirt", "bomber jacket",
    "loafers", "tee", "overshirt", "wrap top", "jumpsuit", "trench coat",
]  # fmt: skip
CATALOG: list[dict[str, Any]] = [
    {
        "sku": f"SP-{i + 101}",
        "name": name,
        "price": round(19.0 + 7.5 * i, 2),
        "cost": round((19.0 + 7.5 * i) * 0.55, 2),
    }
    for i, name in enumerate(NAMES)
]
COSTS = {item["sku"]: item["cost"] for item in CATALOG}


def get_catalog(season: str, page_size: int) -> dict[str, Any]:
    return {"season": season, "items": CATALOG[:page_size], "total": len(CATALOG)}


def set_markup(factor: float) -> dict[str, Any]:
    return {"rule_id": f"MK-{factor:.2f}", "factor": factor}


def update_price(sku: str, price: float) -> dict[str, Any]:
    return {"sku": sku, "staged_price": price}


TOOL_FUNCTIONS = {
    "get_catalog": get_catalog,
    "set_markup": set_markup,
    "update_price": update_price,
}
PARAMETERS: dict[str, dict[str, Any]] = {
    "get_catalog": {"season": {"type": "string"}, "page_size": {"type": "integer"}},
    "set_markup": {"factor": {"type": "number"}},
    "update_price": {"sku": {"type": "string"}, "price": {"type": "number"}},
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


def pricing_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    http = ctx.http_client
    url = ctx.base_url("openai") + "/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ctx.input["request"]},
    ]
    staged: dict[str, float] = {}
    for _turn in range(MAX_TURNS):
        response = http.post(url, json={"model": MODEL, "messages": messages, "tools": TOOLS})
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
        if not message.get("tool_calls"):
            return {"summary": message.get("content"), "staged": staged}
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message["tool_calls"]:
            name = call["function"]["name"]
            arguments = json.loads(call["function"]["arguments"])
            output = ctx.tool(name, TOOL_FUNCTIONS[name], **arguments)
            if name == "update_price":
                staged[output["sku"]] = output["staged_price"]
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(output)}
            )
    return {"summary": None, "staged": staged}


def priced_below_cost(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when any staged price is below the item's cost."""
    staged = result.get("staged", {}) if isinstance(result, dict) else {}
    return 1.0 if any(price < COSTS[sku] for sku, price in staged.items()) else 0.0
