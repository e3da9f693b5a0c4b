"""A whole scheduler on loopback: the in-repo API server plus the real hami-scheduler.

``make run``, the end-to-end tests, the benchmarks and the simulator all start the scheduler this
way, and it talks to the embedded API server over HTTP through the same kubernetes-asyncio client
code it uses against a real cluster. There is no second, in-memory path for the rules.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import replace

from hami_py.app import Options, SchedulerApp
from hami_py.config import DeviceConfig
from hami_py.fakeapi import FakeApiServer, write_kubeconfig
from hami_py.fakeapi.deviceplugin import SimulatedDevicePlugin
from hami_py.k8s.client import KubeClient, load_configuration


async def wait_for(predicate, *, timeout: float = 10.0, interval: float = 0.005, what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def embedded_options(**overrides) -> Options:
    """Loopback, ephemeral ports, and an API budget that never throttles a local run."""
    base = Options(http_bind="127.0.0.1:0", metrics_bind_address="127.0.0.1:0", kube_qps=0, kube_burst=1000,
                   gc_freeze=False)
    return replace(base, **overrides)


@asynccontextmanager
async def running_scheduler(api: FakeApiServer, *, options: Options | None = None,
                            device_config: DeviceConfig | None = None, wait_ready: bool = True,
                            device_plugin: bool = True):
    """Start hami-scheduler against ``api`` (already started); stop it on exit.

    With ``device_plugin`` a SimulatedDevicePlugin finishes each bind as HAMi's device plugin
    would (it is reachable as ``app.device_plugin``)."""
    with tempfile.TemporaryDirectory(prefix="hami-py-") as tmp:
        kubeconfig = write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url)
        async with scheduler_with_kubeconfig(kubeconfig, plugin_kubeconfig=kubeconfig if device_plugin else None,
                                             options=options, device_config=device_config,
                                             wait_ready=wait_ready) as app:
            yield app


@asynccontextmanager
async def scheduler_with_kubeconfig(kubeconfig: str, *, plugin_kubeconfig: str | None, options: Options | None = None,
                                    device_config: DeviceConfig | None = None, wait_ready: bool = True):
    """hami-scheduler in-process against the API server ``kubeconfig`` names (the in-repo one,
    or a real one), with a SimulatedDevicePlugin of its own ``plugin_kubeconfig`` (None: none)."""
    app = SchedulerApp(options or embedded_options(), device_config=device_config or DeviceConfig.default(),
                       configuration=await load_configuration(kubeconfig))
    plugin = None
    if plugin_kubeconfig is not None:
        plugin = SimulatedDevicePlugin(KubeClient(await load_configuration(plugin_kubeconfig), qps=0, burst=1000))
        plugin.start()
    app.device_plugin = plugin
    try:
        await app.start()     # inside: a start that fails half-way (a port taken) is stopped too
        if wait_ready:
            await wait_for(lambda: app.ready, timeout=60, what="the usage cache to sync")
        yield app
    finally:
        await app.stop()
        if plugin is not None:
            await plugin.stop()
            await plugin.client.close()


@asynccontextmanager
async def embedded_cluster(**kw):
    """An embedded API server and a scheduler watching it: ``(api, app)``."""
    api = FakeApiServer()
    await api.start()
    try:
        async with running_scheduler(api, **kw) as app:
            yield api, app
    finally:
        await api.stop()
