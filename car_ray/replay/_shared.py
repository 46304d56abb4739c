"""A fork seed's draws, shared by every fork of the seed that makes the same call
(`SharedDraws`).

A Shapley seed's coalitions are paired through their seed: the forks of one seed that
re-draw step k at its recorded request are meant to draw it alike, so that the seed's
marginal contributions differ by what the coalitions change and not by the provider's luck.
The coupled simulator does that itself (a seed lands on one point of the distribution), a
provider that replays an identical request with its seed does it for identical calls, and
one that takes no seed (Anthropic; and any live provider car-ray does not send its seed to)
does not: there each fork's draw is its own, and a seed's marginal contribution is the
difference of two independent outcomes. `SharedDraws` makes every provider do what the
seeded one does: a call that a fork makes with the seed and body another fork of this
process already made is answered with that answer, not sent again.

What it guarantees: a fork's answer to a call is a draw of the provider's distribution for
that call whether it was shared or not (the first answer is a draw, and nothing about the
fork that made it chose it), so sharing changes no fork's distribution, only how forks of a
seed move together; and forks that share an answer do not pay for it again. What it cannot
do: forks of a seed run in other processes (other Ray workers), or after the job was resumed,
draw their own, and then pair as they did without it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from .._canon import digest_of
from ._upstream import WireResponse

# The answers kept, by total body size: an answer evicted is drawn again by the next fork
# that makes its call (it then pairs as it would without sharing).
_MOST_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, str]


def draw_key(seed: int, url: str, body: Any, data: bytes) -> Key:
    """A call's identity: the seed it carries, where it goes and what it sends (`body`, the
    JSON it parsed to, in canonical form: an agent's request and the same request with its
    ids read as the tape's may order their keys otherwise; else the bytes, `data`)."""
    sent = digest_of(body) if body is not None else hashlib.sha256(data).hexdigest()
    return (str(seed), url, sent)


class SharedDraws:
    """The answers of this process's calls, by `draw_key`, on one event loop."""

    def __init__(self, most_bytes: int = _MOST_BYTES) -> None:
        self.most_bytes = most_bytes
        self._answers: OrderedDict[Key, asyncio.Future[WireResponse]] = OrderedDict()
        self._sizes: dict[Key, int] = {}
        self._bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _forget(self, key: Key) -> None:
        self._answers.pop(key, None)
        self._bytes -= self._sizes.pop(key, 0)

    async def draw(
        self, key: Key, call: Callable[[], Awaitable[WireResponse]]
    ) -> tuple[WireResponse, bool]:
        """The answer to the call `key` and whether another fork drew it: the answer it had,
        awaited if its call is still in flight, or `call()`'s, kept for the next fork when
        the provider answered it (status 200). A call that failed is never shared: a fork
        waiting on it makes its own."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # answers in flight belong to the loop that awaits them
            self._answers.clear()
            self._sizes.clear()
            self._bytes, self._loop = 0, loop
        held = self._answers.get(key)
        if held is not None:
            self._answers.move_to_end(key)
            try:
                answer = await asyncio.shield(held)
            except asyncio.CancelledError:
                if not held.cancelled():
                    raise  # this fork was cancelled, not the call it waited on
            except Exception:  # the first call failed: that fork's business; call anew
                pass
            else:
                return answer, True
        mine: asyncio.Future[WireResponse] = loop.create_future()
        self._forget(key)
        self._answers[key] = mine
        try:
            answer = await call()
        except BaseException as exc:
            if self._answers.get(key) is mine:
                self._forget(key)
            if isinstance(exc, Exception):
                mine.set_exception(exc)
                mine.exception()  # retrieved: a failure nobody waited on is not logged
            else:
                mine.cancel()
            raise
        if answer.status != 200:
            if self._answers.get(key) is mine:
                self._forget(key)
            mine.set_exception(RuntimeError(f"status {answer.status}: not shared"))
            mine.exception()
            return answer, False
        mine.set_result(answer)
        if self._answers.get(key) is mine:
            self._sizes[key] = len(answer.body)
            self._bytes += len(answer.body)
            while self._bytes > self.most_bytes and len(self._answers) > 1:
                self._forget(next(iter(self._answers)))
        return answer, False
