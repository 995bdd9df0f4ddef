"""The event loop the service runs on: uvloop where it is installed, else asyncio's own.

Every job costs the loop several socket reads and writes, callbacks and futures (the intake's
fetches, the provider call, the produce and its acknowledgement); uvloop does each of them in
libuv at a fraction of the default loop's CPU. `PROMPTBUS_EVENT_LOOP=asyncio` keeps the
default loop (e.g. to rule the loop out while debugging).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

EventLoopName = Literal["auto", "uvloop", "asyncio"]


def loop_factory(name: EventLoopName = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop `name` asks for (None: asyncio's default). `uvloop` when it is
    not installed is an ImportError naming the package; `auto` falls back to asyncio's."""
    if name == "asyncio":
        return None
    if name == "auto" and importlib.util.find_spec("uvloop") is None:
        return None
    try:
        import uvloop
    except ImportError as exc:
        raise ImportError(f"PROMPTBUS_EVENT_LOOP=uvloop, but uvloop cannot be imported ({exc})") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], name: EventLoopName = "auto") -> T:
    """`asyncio.run(main)` on the loop `name` asks for."""
    factory = loop_factory(name)
    log.debug("event loop: %s", "uvloop" if factory is not None else "asyncio")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
