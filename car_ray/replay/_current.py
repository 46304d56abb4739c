"""The run a call is part of, found without passing `ctx` (`current_context`), and
`car_ray.tool`: a tool defined at module level that records itself as a step whenever it is
called inside a car-ray run, however deep in a framework."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from ._context import AgentContext

F = TypeVar("F", bound=Callable[..., Any])

# The context of the run whose agent is running: set by car-ray around the agent's call
# (record, replay, fork, a production recording), copied into the threads and tasks the
# agent starts as context variables are (asyncio tasks, `asyncio.to_thread`, frameworks that
# copy the context into their thread pools).
_CURRENT: ContextVar[AgentContext | None] = ContextVar("car_ray_context", default=None)


def current_context() -> AgentContext | None:
    """The `AgentContext` of the run this call is part of, or None outside a car-ray run."""
    return _CURRENT.get()


# How many runs are current anywhere in this process (an effect tool called without one
# while any is, is called from a thread that lost its run's context).
_live = 0
_live_lock = threading.Lock()


def enter_run(ctx: AgentContext) -> Token[AgentContext | None]:
    """Make `ctx` current until `leave_run(token)`."""
    global _live
    with _live_lock:
        _live += 1
    return _CURRENT.set(ctx)


def leave_run(token: Token[AgentContext | None]) -> None:
    global _live
    _CURRENT.reset(token)
    with _live_lock:
        _live -= 1


def _no_run(step: str, effect: bool) -> None:
    """A recorded tool called with no current run: fine outside car-ray; an effect while a
    run is live in this process is refused (it would run in every fork)."""
    if effect and _live:
        raise RuntimeError(
            f"car_ray.tool {step!r} (effect=True) was called outside its run's context, from "
            "a thread or task that did not copy it (a plain ThreadPoolExecutor, say), so it "
            "would run again in every fork: start that thread with "
            "contextvars.copy_context().run, or call it through ctx.tool"
        )


@contextmanager
def running(ctx: AgentContext) -> Iterator[None]:
    """While inside, `current_context()` is `ctx`."""
    token = enter_run(ctx)
    try:
        yield
    finally:
        leave_run(token)


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(*, name: str | None = None, effect: bool = False) -> Callable[[F], F]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, effect: bool = False
) -> Any:
    """`@car_ray.tool` or `@car_ray.tool(effect=True)`: the function, recorded as a tool step
    (`ctx.tool(name, fn, ...)`) whenever it is called inside a car-ray run, the run found
    through a context variable; outside one it is the plain function. `name` defaults to the
    function's; `effect=True` marks a side effect (it only runs while recording; called with
    no current run while a run is live in the process, it refuses rather than run). The
    wrapper keeps the function's name, signature and docstring (frameworks read a tool's
    schema from them) and is async when the function is."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        step = name or fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def arecorded(*args: Any, **kwargs: Any) -> Any:
                ctx = _CURRENT.get()
                if ctx is None:
                    _no_run(step, effect)
                    return await fn(*args, **kwargs)
                return await ctx.tool(step, fn, *args, effect=effect, **kwargs)

            return arecorded

        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            ctx = _CURRENT.get()
            if ctx is None:
                _no_run(step, effect)
                return fn(*args, **kwargs)
            return ctx.tool(step, fn, *args, effect=effect, **kwargs)

        return recorded

    return wrap(fn) if fn is not None else wrap
