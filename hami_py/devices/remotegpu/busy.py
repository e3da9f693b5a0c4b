"""Which cards the lupine servers themselves report in use, kept fresh off the request path.

The books only know the pods this scheduler placed; an interactive session or a client configured
by hand also occupies a card, and only the server sees it. Each server's ``/metrics`` lists a
``lupine_client_device_memory_used_bytes`` series per client and card: a card with any such series
is busy, whoever put the client there (HAMi #3013).

Upstream asks the servers from inside its fit (2 s timeout, one forced re-read at most once a
second when a fit meets a conflict). Here /filter never waits on the network: a background task
polls every server (same 2 s timeout per server, all at once) and the fit reads the last answers
synchronously. A fit that meets a conflict, or a server not polled yet, asks for an early poll
(at most one a second). A server that does not answer keeps its previous busy set, as upstream.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Callable, Iterable

import aiohttp
import structlog

log = structlog.get_logger(__name__)

CLIENT_MEMORY_METRIC = "lupine_client_device_memory_used_bytes"
UUID_LABEL = "device_uuid"
TIMEOUT_S = 2.0
INTERVAL_S = 5.0
EARLIEST_AGAIN_S = 1.0

# One label pair of the Prometheus text format; values may hold escaped quotes and backslashes.
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_busy(text: str) -> frozenset[str]:
    """The card UUIDs with a client memory series in one ``/metrics`` answer."""
    busy = set()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(CLIENT_MEMORY_METRIC):
            continue
        rest = line[len(CLIENT_MEMORY_METRIC):].lstrip()
        if not rest.startswith("{"):
            continue            # another metric sharing the prefix, or a series without labels
        end = rest.find("}")
        labels = rest[1:end if end >= 0 else len(rest)]
        for name, value in _LABEL.findall(labels):
            if name == UUID_LABEL and value:
                busy.add(value.replace('\\"', '"').replace("\\\\", "\\"))
    return frozenset(busy)


class BusyCards:
    """The last busy set each server (``host:port``) reported, and the task polling them."""

    def __init__(self, *, interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.reported: dict[str, frozenset[str]] = {}    # endpoint → busy card UUIDs
        self.polls = 0                                   # completed rounds (tests wait on it)
        self._wake: asyncio.Event | None = None
        self._failing: set[str] = set()                 # logged once until they answer again
        self._asked_at = float("-inf")

    def busy(self, endpoint: str, uuid: str) -> bool:
        return uuid in self.reported.get(endpoint, ())

    def polled(self, endpoint: str) -> bool:
        return endpoint in self.reported

    def ask_early(self) -> None:
        """Poll again soon (a fit met a conflict or an unpolled server): at most once a second,
        never waited for."""
        now = self.clock()
        if self._wake is not None and now - self._asked_at >= EARLIEST_AGAIN_S:
            self._asked_at = now
            self._wake.set()

    async def poll(self, session: aiohttp.ClientSession, endpoints: Iterable[str]) -> None:
        """One round: every server at once; one that fails keeps what it last reported."""
        wanted = sorted(set(endpoints))
        answers = await asyncio.gather(*(self._read(session, e) for e in wanted))
        reported = {e: (busy if busy is not None else self.reported.get(e, frozenset()))
                    for e, busy in zip(wanted, answers)}
        self.reported = reported
        self.polls += 1

    async def _read(self, session: aiohttp.ClientSession, endpoint: str) -> frozenset[str] | None:
        try:
            async with session.get(f"http://{endpoint}/metrics",
                                   timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                if response.status != 200:
                    raise aiohttp.ClientError(f"HTTP {response.status}")
                busy = parse_busy(await response.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError, ValueError) as exc:
            if endpoint not in self._failing:
                self._failing.add(endpoint)
                log.warning("lupine server metrics unreadable; keeping its last busy cards", endpoint=endpoint,
                            error=str(exc) or type(exc).__name__)
            return None
        if endpoint in self._failing:
            self._failing.discard(endpoint)
            log.info("lupine server metrics readable again", endpoint=endpoint)
        return busy

    async def run(self, endpoints: Callable[[], Iterable[str]]) -> None:
        """Poll ``endpoints()`` every ``interval_s`` (sooner when asked) until cancelled."""
        self._wake = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            while True:
                self._wake.clear()
                await self.poll(session, endpoints())
                try:
                    # Not asyncio.wait_for: a wake-up racing a cancel can swallow the cancel
                    # (see RegistrationKeeper._run), and /filter wakes this at any moment.
                    async with asyncio.timeout(self.interval_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
