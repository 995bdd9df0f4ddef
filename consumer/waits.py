"""Bounded waits that a task's cancellation always ends, and a task's cancellation waited for.

`asyncio.wait_for` on Python 3.11 can swallow a cancellation that arrives as the awaited
thing completes: a loop that waits on an event set often (acks, appended records) then
never sees its shutdown. `asyncio.timeout` counts cancellations, so these waits use it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

__all__ = ["cancel_and_wait", "wait_at_most"]


async def wait_at_most(awaitable: Awaitable[object], timeout_s: float) -> bool:
    """Await `awaitable` for at most `timeout_s`: True when it finished, False on the timeout."""
    try:
        async with asyncio.timeout(timeout_s):
            await awaitable
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancel `task` (None: nothing) and wait until it has ended (a part's background loop at
    stop); its cancellation is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
