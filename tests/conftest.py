"""Shared fixtures: an embedded API server, a real scheduler watching it, and an extender client.

Every end-to-end test talks HTTP: the scheduler to the in-repo API server through
kubernetes-asyncio, and the test (playing kube-scheduler) to the scheduler's extender port.
"""
from __future__ import annotations

import ssl

import aiohttp
import pytest
import structlog
import trustme

from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient


@pytest.fixture(autouse=True)
def _restore_logging():
    """A test that runs a CLI (``hami-scheduler simulate`` configures logging) binds structlog to
    the stderr pytest captured for that test, closed once it ends: later tests would log into a
    closed file (and a log call inside a TLS handshake would abort the handshake)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
async def api():
    server = FakeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def scheduler_options():
    """Override in a test module to start the scheduler with other flags."""
    return embedded_options()


@pytest.fixture
async def app(api, scheduler_options):
    async with running_scheduler(api, options=scheduler_options) as running:
        yield running


@pytest.fixture
async def extender(app):
    client = ExtenderClient(app.url)
    try:
        yield client
    finally:
        await client.close()


def assert_books_balance(app) -> None:
    """The cache's per-device usage equals a recount from its pod records, and no device is
    charged beyond its capacity."""
    cache = app.cache
    recount = cache.recount()
    for j, dev_id in enumerate(cache.device_ids):
        if not dev_id or cache.vendor[j] < 0:
            continue
        slots, mem, cores = recount.get(dev_id, (0, 0, 0))
        assert (cache.used[j], cache.used_mem[j], cache.used_cores[j]) == (slots, mem, cores), dev_id
        assert cache.used[j] <= cache.count[j], f"{dev_id} slots oversubscribed"
        assert cache.used_mem[j] <= cache.total_mem[j], f"{dev_id} memory oversubscribed"
        assert cache.used_cores[j] <= max(cache.total_cores[j], 100), f"{dev_id} cores oversubscribed"


async def wait_until(predicate, what="condition", timeout=10.0):
    await wait_for(predicate, timeout=timeout, what=what)


@pytest.fixture(scope="module")
def ca():
    """A throwaway certificate authority for the TLS tests."""
    return trustme.CA()


@pytest.fixture
async def https(ca):
    """A client session that trusts only the test CA (verification on, as the API server does)."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session
