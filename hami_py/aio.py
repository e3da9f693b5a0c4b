"""Small asyncio helpers shared by the layers that run background tasks."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has finished (its ``finally`` blocks run).
    A cancellation of the caller itself while it waits is passed on, not swallowed."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
