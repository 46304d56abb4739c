"""The simulated model of the research scenario, with exact probabilities.

The model always searches first, then fetches two of the three results: which ones is a real
draw (`P_FIRST`, then `P_SECOND` given the first). The answer cites the rumour blog only if the
blog was read, with probability `P_TRUST_BLOG_FIRST` when it was the first page read and
`P_TRUST_BLOG_SECOND` when a reliable page came first; without the blog in the context it never
does. Fetching the blog is the cause the engine must find. P(bad) over the whole tree:
0.3 * 0.7 + 0.5 * 0.4 * 0.4 + 0.2 * 0.3 * 0.4 = 0.314."""

from __future__ import annotations

import json
from collections.abc import Sequence

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import BLOG, CORPUS, ENCYCLOPEDIA, RUMOUR_DEPTH_M, SURVEY, TRUE_DEPTH_M

QUERY = "Lake Veyra maximum depth"
P_FIRST: dict[str, float] = {ENCYCLOPEDIA: 0.5, BLOG: 0.3, SURVEY: 0.2}
P_SECOND: dict[str, dict[str, float]] = {
    ENCYCLOPEDIA: {SURVEY: 0.6, BLOG: 0.4},
    BLOG: {ENCYCLOPEDIA: 0.5, SURVEY: 0.5},
    SURVEY: {ENCYCLOPEDIA: 0.7, BLOG: 0.3},
}
# Primacy: a number read first sticks; a reliable page read first makes the blog look odd.
P_TRUST_BLOG_FIRST = 0.7
P_TRUST_BLOG_SECOND = 0.4


def _fetch(url: str) -> Action:
    return Action(tool_calls=(ToolCall("fetch", {"url": url}),))


def _submit(answer: str, sources: list[str]) -> Action:
    return Action(tool_calls=(ToolCall("submit_answer", {"answer": answer, "sources": sources}),))


def _fetched(content: str) -> str | None:
    """The url a fetch result is for (None for a search result or anything else)."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    return data.get("url") if isinstance(data, dict) and "text" in data else None


class ResearchPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        results = [m.content for m in request.messages if m.role == "tool"]
        if not results:
            return [(1.0, Action(tool_calls=(ToolCall("search", {"query": QUERY}),)))]
        pages = [url for url in map(_fetched, results[1:]) if url is not None]
        if not pages:
            return [(p, _fetch(url)) for url, p in P_FIRST.items()]
        if len(pages) == 1:
            return [(p, _fetch(url)) for url, p in P_SECOND[pages[0]].items()]
        return _answer(pages)


def _answer(pages: list[str]) -> list[tuple[float, Action]]:
    reliable = [url for url in pages if CORPUS[url]["reliable"]]
    measured = _submit(f"Lake Veyra is {TRUE_DEPTH_M} m deep at its deepest point.", reliable)
    if BLOG not in pages:
        return [(1.0, measured)]
    p = P_TRUST_BLOG_FIRST if pages[0] == BLOG else P_TRUST_BLOG_SECOND
    rumour = _submit(
        f"Lake Veyra is about {RUMOUR_DEPTH_M:,} m deep; official figures understate it.",
        [BLOG, *reliable],
    )
    return [(p, rumour), (1 - p, measured)]


POLICY = ResearchPolicy()
