"""Security defaults: where the extender listens, what it accepts, what it logs, how the
webhook is reached.

The extender's verbs change the cluster (/filter patches pods, /bind binds them with the
scheduler's own credentials), so whoever can reach them can schedule around every policy. The
default is therefore loopback, where only the kube-scheduler next to it can call; the webhook,
which the API server must reach from outside the pod, gets a TLS listener of its own
(``--webhook-bind-address``) that serves nothing else but the probes; requests are bounded in
size and depth; names that end up in API URLs must be Kubernetes names; and the credentials the
scheduler holds never reach its logs. RBAC least privilege is checked against the code's real API
calls by tests/test_manifests.py::test_rbac_grants_exactly_what_a_run_uses.
"""
from __future__ import annotations

import base64
import logging
from pathlib import Path

import aiohttp
import orjson
import pytest
import structlog
import yaml

from hami_py.app import Options, SchedulerApp
from hami_py.cli import build_parser, main as cli_main, options_from_args
from hami_py.config import DeviceConfig
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.http.args import MAX_JSON_DEPTH, may_nest_deeper, nesting_error
from hami_py.http.server import DEFAULT_BODY_LIMIT
from hami_py.k8s.client import load_configuration
from hami_py.logs import configure_logging
from tests.test_webhook import apply_json_patch, container, envelope, make_pod

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
SECRET_TOKEN = "hami-test-bearer-8f3c1d9e7a2b4c6d"


def test_extender_listens_on_loopback_unless_told_otherwise():
    assert Options().http_bind.startswith("127.0.0.1:")
    options = options_from_args(build_parser().parse_args([]))
    assert options.http_bind == "127.0.0.1:8080"


async def test_the_running_extender_is_bound_to_loopback_only(app):
    sockets = [s for runner in app._runners for site in runner.sites for s in site._server.sockets]
    addresses = {s.getsockname()[0] for s in sockets}
    assert addresses == {"127.0.0.1"}, addresses


def test_request_limits_are_bounded_by_default():
    assert DEFAULT_BODY_LIMIT == 1 << 20 and Options().body_limit == DEFAULT_BODY_LIMIT
    assert nesting_error([[[1]]], limit=3) is None
    assert not may_nest_deeper(b'[[["x{"]]]', limit=4) and may_nest_deeper(b'[[["x{["]]]', limit=4)
    assert nesting_error([[[[1]]]], limit=3) == "request body nests deeper than 3 levels"
    # Deep enough for any real ExtenderArgs (managedFields nest about 15 deep), shallow enough
    # that what is handed back can always be written out again.
    assert 40 <= MAX_JSON_DEPTH <= 200


async def test_oversized_bodies_are_refused_by_every_verb(app):
    client = ExtenderClient(app.url)
    try:
        big = b'{"x":"' + b"a" * DEFAULT_BODY_LIMIT + b'"}'
        for verb in ("filter", "bind"):
            status, body = await client.post(verb, big)
            assert status == 200 and body["Error"] == f"request body exceeds the limit of {DEFAULT_BODY_LIMIT} bytes"
        status, body = await client.post("webhook", big)
        assert status == 200 and body["response"]["status"]["code"] == 400
        assert "exceeds the limit" in body["response"]["status"]["message"]
    finally:
        await client.close()


@pytest.mark.parametrize("field, value, message", [
    ("PodName", "victim/binding", "extender args PodName 'victim/binding' is not a valid pod name"),
    ("PodName", "../../nodes/n1", "is not a valid pod name"),
    ("PodNamespace", "kube-system/pods", "is not a valid namespace name"),
    ("Node", "n1?dryRun=All", "is not a valid node name"),
    ("PodName", ["p"], "extender args PodName must be a string, not array"),
    ("PodUID", 5, "extender args PodUID must be a string, not number"),
])
async def test_names_that_would_reach_api_urls_must_be_kubernetes_names(api, app, field, value, message):
    client = ExtenderClient(app.url)
    try:
        before = len(api.requests)
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1", field: value}
        status, body = await client.post("bind", args)
        assert status == 200 and message in body["Error"], body
        # Refused at the door: not one API call was made for it.
        assert not [r for r in list(api.requests)[before:] if "/binding" in r[1] or "/pods/" in r[1]]
    finally:
        await client.close()


async def test_filter_refuses_a_pod_name_that_is_a_path(api, app):
    client = ExtenderClient(app.url)
    try:
        api.create("nodes", gpu_node("n1", gpus=1))
        await wait_for(lambda: "n1" in app.cache.nodes, what="node")
        pod = gpu_pod("x/status", gpumem=1000)
        pod["metadata"]["uid"] = "u"
        result = await client.filter(pod, ["n1"])
        assert result["Error"] == "extender args Pod.metadata.name 'x/status' is not a valid object name"
        assert not app.cache.pods
    finally:
        await client.close()


# -- secrets ------------------------------------------------------------------------------------

def _kubeconfig_with_secret(path: Path, url: str) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c", "preferences": {},
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": SECRET_TOKEN}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


async def test_bearer_token_never_appears_in_debug_logs(api, tmp_path, capsys, caplog):
    """Debug logging on (structlog and every stdlib logger, kubernetes-asyncio and aiohttp
    included) through a run with successes and failures: the token is nowhere in the output,
    the metrics or the Events the scheduler writes."""
    saved = structlog.get_config()
    caplog.set_level(logging.DEBUG)
    configure_logging(json=True, level=logging.DEBUG)
    try:
        configuration = await load_configuration(_kubeconfig_with_secret(tmp_path / "kubeconfig", api.url))
        assert SECRET_TOKEN in str(configuration.api_key)      # the client does hold it
        app = SchedulerApp(embedded_options(debug=True, verbosity=10), device_config=DeviceConfig.default(),
                           configuration=configuration)
        await app.start()
        client = ExtenderClient(app.url)
        try:
            await wait_for(lambda: app.ready, what="sync")
            api.create("nodes", gpu_node("n1", gpus=1))
            await wait_for(lambda: "n1" in app.cache.nodes, what="node")
            ok = api.create("pods", gpu_pod("ok", gpumem=1000))
            assert (await client.schedule(ok, ["n1"])).node == "n1"
            refused = api.create("pods", gpu_pod("refused", gpumem=1000))
            api.faults.add(method="POST", path="/pods/refused/binding$", status=401)
            assert (await client.filter(refused, ["n1"]))["NodeNames"] == ["n1"]
            assert (await client.bind(refused, "n1"))["Error"]
            api.faults.add(method="GET", path="^/api/v1/pods$", status=403, times=2)
            api.drop_watches()
            await wait_for(lambda: api.open_watches >= 2, what="watches back")
            async with client.session.get(app.metrics_url + "/metrics") as r:
                metrics = await r.text()
        finally:
            await client.close()
            await app.stop()
    finally:
        structlog.configure(**saved)
    captured = capsys.readouterr()
    logged = captured.out + captured.err + caplog.text + "".join(repr(r.args) for r in caplog.records)
    assert "debug" in logged and "bind failed" in logged           # debug output was produced
    assert SECRET_TOKEN not in logged
    assert SECRET_TOKEN not in metrics
    assert all(SECRET_TOKEN not in orjson.dumps(e).decode() for e in api.list("events"))


# -- manifests ----------------------------------------------------------------------------------

def _manifest_docs() -> list[dict]:
    # manifests/ ships with the repository: a tree without it must fail these checks, not skip them.
    assert (MANIFESTS / "kustomization.yaml").is_file(), f"{MANIFESTS.name}/kustomization.yaml is missing"
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _hami_container(docs: list[dict]) -> dict:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                if any(a.startswith("--http_bind") for a in c.get("args", [])))


def test_webhook_is_reached_over_tls_only():
    docs = _manifest_docs()
    hooks = [h for d in docs if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
             for h in d["webhooks"]]
    assert hooks
    container = _hami_container(docs)
    args = dict(a.split("=", 1) for a in container["args"] if "=" in a)
    assert args.get("--cert_file") and args.get("--key_file"), "the webhook's listener serves plain HTTP"
    # The webhook's own listener when it has one, else the extender's (upstream's layout).
    webhook_listener = args.get("--webhook-bind-address") or args["--http_bind"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for hook in hooks:
        config = hook["clientConfig"]
        if "url" in config:
            assert config["url"].startswith("https://"), config
            continue
        # A service reference is always called over HTTPS; it must lead to the TLS listener.
        service = services[config["service"]["name"]]
        port = next(p for p in service["spec"]["ports"] if p["port"] == config["service"].get("port", 443))
        target = port["targetPort"]
        assert (ports[target] if isinstance(target, str) else target) == int(webhook_listener.rpartition(":")[2])


def test_extender_verbs_are_not_reachable_from_outside_the_pod():
    """The manifests bind the extender (/filter, /bind) to the pod's loopback (--extender-bind),
    where only the kube-scheduler sidecar calls it; what the pod exposes (its container ports, and
    so the Service) is the cluster listener (--http_bind: webhook, refit, probes), which serves no
    extender verb (tests/test_listeners.py shows it end to end)."""
    docs = _manifest_docs()
    container = _hami_container(docs)
    options = options_from_args(build_parser().parse_args(container["args"]))
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert options.extender_bind.startswith("127.0.0.1:") or policies
    assert not options.webhook_bind_address, "/webhook on the cluster listener, as upstream's layout"
    exposed = {p["containerPort"] for p in container["ports"]}
    assert int(options.extender_bind.rpartition(":")[2]) not in exposed
    assert int(options.http_bind.rpartition(":")[2]) in exposed


# -- the webhook's own listener -----------------------------------------------------------------

@pytest.fixture
def split_options(ca, tmp_path):
    """Both listeners on loopback with ephemeral ports, TLS with a throwaway certificate."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return embedded_options(cert_file=str(cert_file), key_file=str(key_file),
                            webhook_bind_address="127.0.0.1:0", scheduler_name="hami-scheduler")


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes]:
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


async def test_the_webhook_listener_serves_the_webhook_and_probes_and_no_extender_verb(api, split_options, https):
    api.create("nodes", gpu_node("n1", gpus=1))
    async with running_scheduler(api, options=split_options, device_plugin=False) as app:
        await wait_for(lambda: "n1" in app.cache.nodes, what="node")
        assert app.webhook_url.startswith("https://") and app.url.startswith("https://")
        assert app.webhook_url != app.url
        # The webhook listener answers AdmissionReviews and the kubelet's probes...
        pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), namespace="default")
        status, raw = await _post(https, f"{app.webhook_url}/webhook", envelope(pod, uid="r1"))
        answer = orjson.loads(raw)["response"]
        assert status == 200 and (answer["uid"], answer["allowed"]) == ("r1", True)
        admitted = apply_json_patch(pod, orjson.loads(base64.b64decode(answer["patch"])))
        assert admitted["spec"]["schedulerName"] == "hami-scheduler"
        for probe in ("healthz", "readyz"):
            async with https.get(f"{app.webhook_url}/{probe}") as r:
                assert r.status == 200, probe
        # ...and nothing that changes the cluster, however well-formed the request.
        created = api.create("pods", admitted)
        before = len(api.requests)
        meta = created["metadata"]
        status, _ = await _post(https, f"{app.webhook_url}/filter", {"Pod": created, "NodeNames": ["n1"]})
        assert status == 404
        status, _ = await _post(https, f"{app.webhook_url}/bind", {
            "PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": "n1"})
        assert status == 404
        # Not one call about the pod (no patch, no Binding), and no reservation.
        assert not [r for r in list(api.requests)[before:] if "/pods/" in r[1]] and not app.cache.pods
        # The extender's listener has the verbs, and no longer the webhook.
        status, _ = await _post(https, f"{app.url}/webhook", envelope(pod, uid="r2"))
        assert status == 404
        extender = ExtenderClient(app.url, session=https)
        placement = await extender.schedule(created, ["n1"])
        assert (placement.node, placement.error) == ("n1", "")
        assert api.get("pods", meta["name"], namespace="default")["spec"]["nodeName"] == "n1"


async def test_the_webhook_listener_is_tls_only(api, split_options):
    async with running_scheduler(api, options=split_options, device_plugin=False) as app:
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                async with plain.post(app.webhook_url.replace("https://", "http://") + "/webhook",
                                      data=orjson.dumps(envelope(make_pod(container()))),
                                      headers={"Content-Type": "application/json"}) as r:
                    await r.read()


def test_a_webhook_listener_without_a_certificate_is_refused(capsys):
    """The API server calls webhooks over HTTPS only: a plain webhook listener is a mistake."""
    assert cli_main(["--webhook-bind-address", "0.0.0.0:9443"]) == 2
    assert capsys.readouterr().err == ("hami-scheduler: --webhook-bind-address needs --cert_file and "
                                       "--key_file: the API server calls webhooks over HTTPS only\n")
    defaults = options_from_args(build_parser().parse_args([]))
    assert defaults.webhook_bind_address == ""                    # upstream's layout unless asked
    parsed = options_from_args(build_parser().parse_args(["--webhook-bind-address=:9443"]))
    assert parsed.webhook_bind_address == ":9443"
