"""Watch events and open watch streams of the in-repo API server.

Why a module of its own: each event is rendered once and shared by every watcher, and each watcher
filters, buffers and (for benchmarks) holds or paces its lines before they reach the socket; that
delivery is independent of how objects are stored.
"""
from __future__ import annotations

import asyncio
import collections
import time

from aiohttp import web

from hami_py.fakeapi.label_selectors import Matcher

_PACE_TICK_S = 0.002      # a paced watch writes what is due this often
_WRITE_CHUNK = 1 << 20     # batch watch lines into ~1 MiB writes so replay is not one write per line


class Event:
    """One write in the watch history; each line is rendered once, whoever watches."""
    __slots__ = ("rv", "type", "namespace", "obj", "prev", "raw", "_lines")

    def __init__(self, rv: int, type_: str, namespace: str, obj: dict, prev: dict | None,
                 raw: bytes) -> None:
        self.rv, self.type, self.namespace = rv, type_, namespace
        self.obj, self.prev, self.raw = obj, prev, raw
        self._lines: dict[str, bytes] = {}

    def line(self, type_: str | None = None) -> bytes:
        type_ = type_ or self.type
        if (cached := self._lines.get(type_)) is None:
            cached = self._lines[type_] = event_line(type_, self.raw)
        return cached


def event_line(type_: str, raw: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (type_.encode(), raw)


class Watcher:
    """One open watch stream: filters events and buffers their lines for the writer task.

    Delivery can be held or paced (``FakeApiServer.pace_watches``): ``rate`` None streams lines
    as they come, 0 holds them, a positive rate releases that many lines a second from ``t0``
    and records, after each write, how many paced lines have gone out (``marks``)."""
    __slots__ = ("namespace", "match", "bookmarks", "pending", "wake", "cut", "transport",
                 "rate", "t0", "sent", "marks")

    def __init__(self, *, namespace: str | None, match: Matcher | None, bookmarks: bool) -> None:
        self.namespace, self.match, self.bookmarks = namespace, match, bookmarks
        self.pending: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.cut = False
        self.transport: asyncio.BaseTransport | None = None
        self.rate: float | None = None
        self.t0 = 0.0
        self.sent = 0
        self.marks: list[tuple[int, float]] = []

    def next_lines(self) -> list[bytes]:
        """The lines to write now (maybe none while held or ahead of the pace)."""
        if self.rate is None:
            lines = list(self.pending)
            self.pending.clear()
            return lines
        if self.rate <= 0:
            return []
        due = min(int(self.rate * (time.monotonic() - self.t0)) - self.sent, len(self.pending))
        return [self.pending.popleft() for _ in range(max(due, 0))]

    def push(self, line: bytes) -> None:
        self.pending.append(line)
        self.wake.set()

    def offer(self, event: Event) -> None:
        if self.namespace is not None and event.namespace != self.namespace:
            return
        if self.match is None:
            self.push(event.line())
            return
        # Like the watch cache: an update moving an object into (out of) the selection is seen as
        # ADDED (DELETED) by this watcher.
        now = self.match(event.obj)
        before = event.prev is not None and self.match(event.prev)
        if event.type != "MODIFIED":
            if now:
                self.push(event.line())
        elif now or before:
            self.push(event.line("MODIFIED" if now and before else "ADDED" if now else "DELETED"))

    def abort(self) -> None:
        """Cut the connection without a clean end of stream, as a crash or network cut does."""
        self.cut = True
        if self.transport is not None:
            self.transport.abort()
        self.wake.set()


async def pump(response: web.StreamResponse, watcher: Watcher, deadline: float | None) -> bool:
    """Stream queued lines until timed out (True) or cut (False)."""
    while not watcher.cut:
        if watcher.pending and (lines := watcher.next_lines()):
            await _write_lines(response, lines)
            if watcher.rate is not None:
                watcher.sent += len(lines)
                watcher.marks.append((watcher.sent, time.monotonic()))
            continue
        if watcher.pending and watcher.rate:
            await asyncio.sleep(_PACE_TICK_S)      # paced, and ahead of the pace
            continue
        watcher.wake.clear()
        try:
            # A held or paced watch does not time out: the measurement it serves would be lost.
            async with asyncio.timeout_at(deadline if watcher.rate is None else None):
                await watcher.wake.wait()
        except TimeoutError:
            return True
    return False


async def _write_lines(response: web.StreamResponse, lines: list[bytes]) -> None:
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= _WRITE_CHUNK:
            await response.write(b"".join(batch))
            batch, size = [], 0
    if batch:
        await response.write(b"".join(batch))

