"""List-then-watch of one resource, feeding the usage cache on the server's own event loop.

kubernetes-asyncio has no informer, and its ``Watch`` is not one to build on: it retries a 410
once with the same stale resourceVersion and then raises, and its line reader gives up on events
larger than its 2 MiB buffer (a node with a big registration, or a pod with many containers, gets
there). So, in the manner of kopf's watcher:

* list with ``limit``/``continue`` paging, hand the whole list to the cache, which turns objects
  missing from it into deletes (a delete missed while disconnected is upstream's most reported
  stale-usage bug);
* watch from the list's resourceVersion with bookmarks, splitting the byte stream into lines by
  hand and parsing each with orjson;
* on a clean end of stream, watch again from the last resourceVersion seen; on 410 Gone, relist;
  on any other failure, back off with jitter (honouring Retry-After) and try again.
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Callable

import aiohttp
import orjson
import structlog

from hami_py.aio import cancel_and_wait
from hami_py.k8s.client import KubeApiError, KubeClient, error_from_response

log = structlog.get_logger(__name__)

EventHandler = Callable[[str, dict], None]
RelistHandler = Callable[[list[dict], int | None], None]


@dataclass
class PagedRelist:
    """Receive a relist page by page instead of as one list.

    Holding every object of a 40 000-pod list at once costs hundreds of MiB of dicts; a consumer
    that applies each page and remembers only what it saw (to turn the missing into deletes in
    ``finish``) needs one page of memory."""
    begin: Callable[[], None]
    page: Callable[[list[dict]], None]
    finish: Callable[[int | None], None]


class Gone(Exception):
    """The resourceVersion we asked for has been compacted away: relist."""


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_on_gone: int = 0
    errors: int = 0
    handler_errors: int = 0


class Informer:
    """Keeps one resource mirrored into callbacks until ``stop()``."""

    def __init__(self, *, client: KubeClient, path: str, on_event: EventHandler,
                 on_relist: RelistHandler | PagedRelist, label_selector: str | None = None,
                 field_selector: str | None = None,
                 page_size: int = 500, watch_timeout: tuple[int, int] = (240, 360),
                 backoff: tuple[float, float] = (0.2, 10.0)):
        self.client = client
        self.path = path
        self.on_event = on_event
        self.on_relist = on_relist
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.stats = InformerStats()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"informer {self.path}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()
                failures = 0
            except Gone:
                self.stats.relists_on_gone += 1
                log.info("watch history expired, relisting", path=self.path)
                need_list = True
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: back off and carry on
                self.stats.errors += 1
                failures += 1
                delay = _jittered(self.backoff, failures)
                if isinstance(exc, KubeApiError) and exc.retry_after:
                    delay = max(delay, exc.retry_after)
                log.warning("watch failed, retrying", path=self.path, error=str(exc) or type(exc).__name__,
                            retry_in=round(delay, 3))
                await asyncio.sleep(delay)
            if self.resource_version in (None, "", "0"):
                # Nothing seen since a list at "0" (an empty collection on some servers): a watch
                # from "0" means "from any state", and deletes made meanwhile would never arrive.
                need_list = True

    def _query(self, **extra: str) -> list[tuple[str, str]]:
        q = [(k, v) for k, v in extra.items()]
        if self.label_selector:
            q.append(("labelSelector", self.label_selector))
        if self.field_selector:
            q.append(("fieldSelector", self.field_selector))
        return q

    async def _list(self) -> None:
        sink = self.on_relist
        if not isinstance(sink, PagedRelist):
            collected: list[dict] = []
            whole = sink
            sink = PagedRelist(begin=collected.clear, page=collected.extend,
                               finish=lambda rv: whole(collected, rv))
        cont = None
        list_rv = None
        sink.begin()
        while True:
            q = self._query(limit=str(self.page_size))
            if cont:
                q.append(("continue", cont))
            try:
                page = await self.client.get(self.path, query=q)
            except KubeApiError as exc:
                if exc.status == 410:
                    # The continue token expired mid-list: start the list over. What the pages
                    # so far applied is no older than the cache had; finish() never ran, so
                    # nothing was deleted on their account.
                    cont, list_rv = None, None
                    sink.begin()
                    continue
                raise
            meta = page.get("metadata") or {}
            if list_rv is None:
                list_rv = meta.get("resourceVersion")
            sink.page(page.get("items") or [])
            del page
            cont = meta.get("continue")
            if not cont:
                break
        self.stats.lists += 1
        self.resource_version = list_rv
        sink.finish(_int_or_none(list_rv))
        self.synced.set()

    async def _watch(self) -> None:
        lo, hi = self.watch_timeout
        q = self._query(watch="true", allowWatchBookmarks="true",
                        timeoutSeconds=str(random.randint(lo, hi)))
        if self.resource_version:
            q.append(("resourceVersion", self.resource_version))
        response = await self.client.open(
            "GET", self.path, query=q, limited=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=hi + 30))
        async with response:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                data = await response.read()
                raise error_from_response(response.status, data, response.headers.get("Retry-After"),
                                          what=f"watch {self.path}")
            self.stats.watches += 1
            async for lines in iter_line_batches(response.content):
                for line in lines:
                    self._handle_line(line)

    def _handle_line(self, line: bytes) -> None:
        event = orjson.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise KubeApiError(obj.get("code") or 500, obj.get("reason") or "WatchError",
                               obj.get("message") or "watch error event")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind != "BOOKMARK":
            self.stats.events += 1
            try:
                self.on_event(kind, obj)
            except Exception:  # noqa: BLE001 - one object the handler chokes on must not stall the rest
                # Re-raising would resume the watch from before this event and hit it again,
                # forever: skip it, loudly.
                self.stats.handler_errors += 1
                log.exception("watch event handler failed, event skipped", path=self.path, type=kind,
                              name=(obj.get("metadata") or {}).get("name"))
        if rv:
            self.resource_version = rv


async def iter_line_batches(stream: aiohttp.StreamReader, *, chunk_size: int = 1 << 16):
    """The watch stream's lines, a list per chunk read: split at C speed by ``bytes.split``, and
    handed over a chunk at a time rather than through one generator step per event (at 20 000
    events a second that step was a tenth of the informer's time). We split lines ourselves
    because aiohttp's readline refuses long lines."""
    partial = bytearray()
    async for chunk in stream.iter_chunked(chunk_size):
        if b"\n" not in chunk:
            partial += chunk
            continue
        lines = chunk.split(b"\n")
        if partial:
            lines[0] = bytes(partial) + lines[0]
            partial.clear()
        partial += lines.pop()      # what follows the last newline: the start of the next line
        yield [line for line in lines if line.strip()]
    # A partial last line means the stream was cut mid-event: drop it, the next watch resumes
    # from the last complete event's resourceVersion.


def _jittered(backoff: tuple[float, float], failures: int) -> float:
    base, cap = backoff
    return min(cap, base * (2 ** min(failures - 1, 10))) * random.uniform(0.5, 1.0)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
