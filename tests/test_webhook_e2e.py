"""End to end over HTTPS: the API server's admission call, then kube-scheduler's filter and bind.

The scheduler serves with a throwaway certificate (trustme) and every client verifies it, as the
kube-apiserver does with the webhook's caBundle. The pod the webhook admits (patch applied by
the test, as the API server would) is created in the embedded API server and scheduled through
the same HTTPS port.
"""
from __future__ import annotations

import base64

import aiohttp
import orjson
import pytest

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node
from tests.conftest import assert_books_balance, create_quota, register_nodes
from tests.test_webhook import apply_json_patch, container, envelope, make_pod


@pytest.fixture
def tls_files(ca, tmp_path):
    cert = ca.issue_cert("127.0.0.1", "localhost", "hami-scheduler.hami-system.svc")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(cert_file), str(key_file)


@pytest.fixture
def scheduler_options(tls_files):
    cert_file, key_file = tls_files
    return embedded_options(cert_file=cert_file, key_file=key_file, scheduler_name="hami-scheduler")


async def _post_review(https, app, body, *, content_type="application/json"):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with https.post(f"{app.url}/webhook", data=data, headers={"Content-Type": content_type}) as r:
        return r.status, orjson.loads(await r.read())


async def test_admitted_pod_is_scheduled_by_hami_over_https(api, app, https):
    assert app.url.startswith("https://")
    await register_nodes(api, app, gpu_node("gpu-1", gpus=2))

    pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}), namespace="default")
    status, answer = await _post_review(https, app, envelope(pod, uid="a1b2"))
    assert status == 200
    response = answer["response"]
    assert (answer["apiVersion"], response["uid"], response["allowed"]) == ("admission.k8s.io/v1", "a1b2", True)
    admitted = apply_json_patch(pod, orjson.loads(base64.b64decode(response["patch"])))
    assert admitted["spec"]["schedulerName"] == "hami-scheduler"

    created = api.create("pods", admitted)
    extender = ExtenderClient(app.url, session=https)
    placement = await extender.schedule(created, ["gpu-1"])
    assert (placement.node, placement.error) == ("gpu-1", "")
    stored = api.get("pods", "trainer", namespace="default")
    assert stored["spec"]["nodeName"] == "gpu-1"
    devices = decode_pod_devices(stored["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"])
    assert [(d.usedmem, d.usedcores) for d in devices[0]] == [(3000, 0)]
    assert_books_balance(app)


async def test_denial_travels_back_over_https(app, https):
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}, privileged=True))
    status, answer = await _post_review(https, app, envelope(pod, uid="p-1"))
    assert status == 200
    assert answer["response"] == {"uid": "p-1", "allowed": False, "status": {
        "code": 403, "reason": "Forbidden", "message": "container main is privileged"}}


async def test_namespace_quota_the_running_app_watches_is_enforced_at_admission(api, app, https):
    """A real ResourceQuota in the API server, seen through the scheduler's watch: the review
    charges the pod's memory and cores to the pod's namespace."""
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "2048", "limits.nvidia.com/gpucores": "0"},
                       namespace="team-a")

    async def admitted(namespace: str, **limits: str) -> dict:
        pod = make_pod(container(limits={"nvidia.com/gpu": "1", **limits}), namespace=namespace)
        _, answer = await _post_review(https, app, envelope(pod))
        return answer["response"]

    over = await admitted("team-a", **{"nvidia.com/gpumem": "2049"})
    assert over["allowed"] is False
    assert over["status"] == {"code": 403, "reason": "Forbidden", "message": "exceeding resource quota"}
    assert (await admitted("team-a", **{"nvidia.com/gpumem": "2048"}))["allowed"] is True
    cores = await admitted("team-a", **{"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "1"})
    assert cores["allowed"] is False and cores["status"]["message"] == "exceeding resource quota"
    assert (await admitted("team-b", **{"nvidia.com/gpumem": "4096"}))["allowed"] is True  # not its quota


@pytest.mark.parametrize("body,content_type,message", [
    (b"{not json", "application/json", "invalid JSON in AdmissionReview"),
    (b"", "application/json", "request body is empty"),
    (b"{}", "text/plain", "contentType=text/plain, expected application/json"),
    (b"[1, 2]", "application/json", "expected an AdmissionReview object, got a list"),
    # Nested past the limit the extender's verbs keep (once a RecursionError and a 500 here).
    (b'{"request": {"object": {"spec": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}}}",
     "application/json", "request body nests deeper than 100 levels"),
])
async def test_malformed_request_gets_a_clear_error_review(app, https, body, content_type, message):
    status, answer = await _post_review(https, app, body, content_type=content_type)
    assert status == 200 and answer["kind"] == "AdmissionReview"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    assert answer["response"]["status"]["message"].startswith(message)


async def test_oversized_review_is_refused_and_the_server_keeps_serving(app, https):
    big = orjson.dumps(envelope(make_pod(container(env=[{"name": "X", "value": "y" * (2 << 20)}]))))
    status, answer = await _post_review(https, app, big)
    assert status == 200 and answer["response"]["status"]["code"] == 400
    assert "exceeds the limit" in answer["response"]["status"]["message"]
    _, answer = await _post_review(https, app, envelope(make_pod(container())))
    assert answer["response"]["allowed"] is True


async def test_webhook_counts_errors_not_denials(app, https):
    await _post_review(https, app, b"nope")
    await _post_review(https, app, envelope(make_pod()))  # denied: no containers
    errors = app.metrics.registry.get_sample_value("hami_extender_request_errors_total", {"verb": "webhook"})
    assert errors == 1


async def test_plain_http_is_not_served_on_the_tls_port(app):
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.post(app.url.replace("https://", "http://") + "/webhook", data=b"{}",
                                  headers={"Content-Type": "application/json"}) as r:
                await r.read()
