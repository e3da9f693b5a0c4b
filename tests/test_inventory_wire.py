"""Feature-inventory rows of the HTTP surface and the command line: routes, the exact JSON
kube-scheduler reads, and what the process refuses to start with.

Each test names its inventory row (docs/FEATURES.md) in a docstring line.
"""
from __future__ import annotations

import orjson
import pytest

from hami_py.cli import build_parser, main as cli_main
from hami_py.fakeapi.objects import gpu_pod
from tests.test_inventory_filter import reference_node, register

RESULT_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


async def _raw_post(extender, url: str, body: bytes) -> tuple[int, str, bytes]:
    async with extender.session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, r.content_type, await r.read()


async def _get(extender, url: str) -> tuple[int, bytes]:
    async with extender.session.get(url) as r:
        return r.status, await r.read()


# ---------------------------------------------------------------------------------------------
# the extender server
# ---------------------------------------------------------------------------------------------

async def test_routes_answer_like_upstreams_server(api, app, extender):
    """Inventory: http-routes"""
    assert await _get(extender, f"{app.url}/healthz") == (200, b"")
    assert (await _get(extender, f"{app.url}/readyz"))[0] == 200
    names = await register(api, app, reference_node())
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    status, content_type, body = await _raw_post(extender, f"{app.url}/filter",
                                                 orjson.dumps({"Pod": pod, "NodeNames": names}))
    assert (status, content_type) == (200, "application/json")
    assert orjson.loads(body)["NodeNames"] == names
    for verb in ("filter", "bind", "webhook"):
        assert (await _get(extender, f"{app.url}/{verb}"))[0] == 405, verb
    assert (await _get(extender, f"{app.url}/nope"))[0] == 404


async def test_no_profiling_routes_without_the_flag(app, extender):
    """Inventory: http-pprof (never on the extender's listener; --profiling serves a listener of its own)"""
    assert (await _get(extender, f"{app.url}/debug/pprof/"))[0] == 404


async def test_results_carry_every_pascalcase_key_in_upstreams_order(api, app, extender):
    """Inventory: wire-pascalcase"""
    names = await register(api, app, reference_node())
    pod = api.create("pods", gpu_pod("fits", gpumem=1000))
    _, _, body = await _raw_post(extender, f"{app.url}/filter", orjson.dumps({"Pod": pod, "NodeNames": names}))
    result = orjson.loads(body)
    assert list(result) == RESULT_KEYS
    assert result == {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None,
                      "FailedAndUnresolvableNodes": None, "Error": ""}
    too_big = api.create("pods", gpu_pod("too-big", gpumem=100000))
    _, _, body = await _raw_post(extender, f"{app.url}/filter",
                                 orjson.dumps({"Pod": too_big, "NodeNames": names}))
    result = orjson.loads(body)
    assert list(result) == RESULT_KEYS and result["NodeNames"] is None
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
    _, _, body = await _raw_post(extender, f"{app.url}/bind", orjson.dumps({
        "PodName": "fits", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "n1"}))
    assert body == b'{"Error":""}'


@pytest.mark.parametrize("verb", ["filter", "bind"])
async def test_undecodable_body_is_an_error_in_a_200_answer(app, extender, verb):
    """Inventory: err-in-body-decode (the message is ours: docs/COMPATIBILITY.md "Extender entry")"""
    status, content_type, body = await _raw_post(extender, f"{app.url}/{verb}", b"{not-json")
    assert (status, content_type) == (200, "application/json")
    error = orjson.loads(body)["Error"]
    assert error.startswith("invalid JSON request body"), error


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------

async def test_metrics_have_their_own_port_default_9395(app, extender):
    """Inventory: metrics-server"""
    assert build_parser().parse_args([]).metrics_bind_address == ":9395"
    assert app.metrics_url != app.url
    status, body = await _get(extender, f"{app.metrics_url}/metrics")
    assert status == 200 and b"hami_build_info{" in body
    assert (await _get(extender, f"{app.url}/metrics"))[0] == 404


@pytest.mark.parametrize("flag", ["--cert_file", "--key_file"])
def test_half_a_tls_pair_is_refused_at_start(tmp_path, capsys, flag):
    """Inventory: http-tls (deliberate difference: upstream silently serves plain HTTP)"""
    half = tmp_path / "tls.pem"
    half.write_text("unused")
    assert cli_main([flag, str(half)]) == 2
    assert capsys.readouterr().err == "hami-scheduler: --cert_file and --key_file must be given together\n"


@pytest.mark.parametrize("content, message", [
    (None, "cannot read device config: No such file or directory"),
    ("# nothing configured\n", "all configurations are empty"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: [A100], profiles: [x.5gb]}\n",
     "invalid MIG profile 'x.5gb'"),
])
def test_unusable_device_config_stops_the_process(tmp_path, capsys, content, message):
    """Inventory: config-required, config-mig-allowlist"""
    path = tmp_path / "device-config.yaml"
    if content is not None:
        path.write_text(content)
    assert cli_main(["--device-config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami-scheduler: ") and message in err, err
