"""HAMi's two listener layouts, the device plugin's identity flags, and --profiling.

v2.10 serves everything on --http_bind. After v2.10 HAMi serves /filter and /bind on a loopback
listener of their own (--extender-bind) and keeps --http_bind for /webhook, /refit and the
probes; pprof is on a third, loopback, listener. hami-py starts with either chart's arguments.
"""
from __future__ import annotations

import aiohttp
import pytest

from hami_py.cli import main as cli_main
from hami_py.embedded import embedded_options, running_scheduler

PLUGIN = dict(device_plugin_namespace="hami-system", device_plugin_service_account="hami-device-plugin")


async def status_of(url: str, method: str = "POST", body: bytes = b"{}") -> int:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, data=body) as answer:
            await answer.read()
            return answer.status


@pytest.mark.parametrize("argv, why", [
    (["--extender-bind=127.0.0.1:9444"], "--extender-bind (HAMi's layout after v2.10) needs --device-plugin-namespace"),
    (["--device-plugin-namespace=hami-system"], "must be given together"),
    (["--device-plugin-service-account=hami-device-plugin"], "must be given together"),
    (["--extender-bind=nowhere"], "--extender-bind"),
])
def test_a_half_configured_refit_identity_is_refused_at_start(argv, why, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami-scheduler: ") and why in err and err.count("\n") == 1, err


async def test_with_extender_bind_each_listener_serves_its_own_routes(api):
    options = embedded_options(extender_bind="127.0.0.1:0", **PLUGIN)
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        assert app.url != app.cluster_url == app.webhook_url
        for verb in ("filter", "bind", "prioritize", "preempt"):
            assert await status_of(f"{app.url}/{verb}") in (200, 500)     # served (500: preempt's error)
            assert await status_of(f"{app.cluster_url}/{verb}") == 404
        for path in ("webhook", "refit"):
            assert await status_of(f"{app.url}/{path}") == 404
        assert await status_of(f"{app.cluster_url}/refit") == 401          # served: a caller with no token
        assert await status_of(f"{app.cluster_url}/webhook") == 200        # an AdmissionReview with the error
        for probe in ("healthz", "readyz"):
            assert await status_of(f"{app.cluster_url}/{probe}", "GET") == 200


async def test_without_extender_bind_http_bind_serves_everything_as_v2_10(api):
    async with running_scheduler(api, options=embedded_options(), device_plugin=False) as app:
        assert app.url == app.cluster_url == app.webhook_url
        assert await status_of(f"{app.url}/filter") == 200
        assert await status_of(f"{app.url}/webhook") == 200
        assert await status_of(f"{app.url}/refit") == 503                  # not configured


async def test_profiling_is_served_on_its_own_listener_only(api):
    options = embedded_options(profiling=True, profiling_bind_address="127.0.0.1:0")
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        assert app.profiling_url not in (app.url, app.metrics_url)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{app.profiling_url}/debug/pprof/goroutine") as answer:
                text = await answer.text()
            assert answer.status == 200 and "asyncio tasks" in text and "thread MainThread" in text
            async with session.get(f"{app.profiling_url}/debug/pprof/profile?seconds=0.2") as answer:
                assert answer.status == 200 and "function calls" in await answer.text()
            async with session.get(f"{app.profiling_url}/debug/pprof/profile?seconds=nine") as answer:
                assert answer.status == 400
            async with session.get(f"{app.profiling_url}/debug/pprof/heap") as answer:
                assert answer.status == 200 and "objects tracked" in await answer.text()
        assert await status_of(f"{app.url}/debug/pprof/goroutine", "GET") == 404
        assert await status_of(f"{app.profiling_url}/filter") == 404
    async with running_scheduler(api, options=embedded_options(), device_plugin=False) as app:
        assert not app.profiling_url                                       # off unless asked for


async def test_a_rotated_certificate_is_served_on_both_listeners_without_a_restart(api, ca, tmp_path):
    from tests.test_tls import HOSTS, der_of, install, served_certificate
    cert_file, key_file = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    first = ca.issue_cert(*HOSTS)
    install(first, cert_file, key_file)
    options = embedded_options(extender_bind="127.0.0.1:0", cert_file=cert_file, key_file=key_file,
                               cert_check_interval_s=0, **PLUGIN)
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        ports = [int(url.rsplit(":", 1)[1]) for url in (app.url, app.cluster_url)]
        assert app.url.startswith("https://") and app.cluster_url.startswith("https://")
        for port in ports:
            assert await served_certificate(ca, port) == der_of(first)
        second = ca.issue_cert(*HOSTS)
        install(second, cert_file, key_file)
        for port in ports:
            assert await served_certificate(ca, port) == der_of(second)
