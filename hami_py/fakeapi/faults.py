"""Fault injection for the in-repo API server: errors, 429 + Retry-After, hangs and delays.

Why a module of its own: reliability tests script failures by method and path, independent of
what the request would have done; the server only asks which fault, if any, a request meets.
"""
from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass

from hami_py.fakeapi.errors import ApiError


@dataclass(eq=False)
class Fault:
    """One injected failure; ``hits`` counts the requests it caught."""
    method: str | None
    path: re.Pattern | None
    status: int = 500
    retry_after: float | None = None
    hang: bool = False
    times: int | None = 1
    delay: float | None = None
    after_apply: bool = False
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or self.path.search(path) is not None))

    def error(self) -> ApiError:
        message = ("Too many requests, please try again later." if self.status == 429
                   else f"Internal error occurred: injected fault ({self.status})")
        details = None if self.retry_after is None else {
            "retryAfterSeconds": math.ceil(self.retry_after)}
        return ApiError(self.status, message, retry_after=self.retry_after, details=details)


class FaultSet:
    """The faults a server applies, first match wins; hung requests wait here for release."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._released = asyncio.Event()

    def add(self, *, method: str | None = None, path: str | None = None, status: int = 500,
            retry_after: float | None = None, hang: bool = False, times: int | None = 1,
            delay: float | None = None, after_apply: bool = False) -> Fault:
        """Fail (``status``), stall (``hang``) or slow down (``delay``) matching requests.

        ``after_apply`` serves the request first and then answers with the error anyway: the
        write landed but the client saw a failure (a timeout after commit). Not for watches.
        """
        fault = Fault(method.upper() if method else None, re.compile(path) if path else None,
                      status, retry_after, hang, times, delay, after_apply)
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Forget every fault; requests hung by one are served normally."""
        self._faults.clear()
        self.release()

    def take(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.matches(method, path):
                fault.hits += 1
                if fault.times is not None and fault.hits >= fault.times:
                    self._faults.remove(fault)
                return fault
        return None

    def release(self) -> None:
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def wait_released(self) -> None:
        await self._released.wait()
