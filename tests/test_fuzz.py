"""Hostile input: whatever arrives, the answer is a clear error, the server stays up, and one
garbled object never stops the others from being scheduled.

Two doors take input from outside: the HTTP bodies kube-scheduler and the API server send
(/filter, /bind, /webhook) and the node and pod annotations the cache decodes (anyone allowed to
edit a pod or run a device plugin writes them). Hypothesis throws random JSON, mutated valid
requests, raw bytes, huge and negative numbers, garbled annotation text and plausible device
registrations with a field at an extreme (so that many are accepted and then used) at both; a few
example tests cover what hypothesis cannot draw well (truncated bodies, lying Content-Length,
slow clients, nesting deeper than the decoders allow).

Bodies are checked through a real scheduler on loopback (``LoopCluster``); annotations also go
straight into a ``UsageCache``, where thousands of examples cost little.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.embedded import wait_for
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.decision.requests import MAX_DEVICES_PER_POD, parse_pod_requests
from tests.reliability_helpers import LoopCluster, finish_allocation, wait_books_balance

FILTER_FIELDS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
NODES = ["n1", "n2"]
EXAMPLES = int(os.environ.get("HAMI_FUZZ_EXAMPLES", "150"))     # per HTTP fuzz test; longer runs: raise it
FUZZ = settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=list(HealthCheck))

# -- strategies ---------------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1, 1e308, -1e308, 0.5, 1e-300]))
quantity_text = st.one_of(
    st.sampled_from(["1", "0", "-1", "1.5", "1e3", "1E400", "Infinity", "NaN", "0x10", " 1", "1 ", "", "1Gi",
                     "100m", "99999999999999999999999", "+5", "٣", "1_000", "nan", "-0", "00001"]),
    st.text(max_size=12), st.integers(-(1 << 70), 1 << 70).map(str))
json_leaf = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
quantity = st.one_of(quantity_text, numbers, json_value)


def base_pod(uid: str = "fuzz-uid") -> dict:
    pod = gpu_pod("fuzzed", gpus=1, gpumem=1000, gpucores=10)
    pod["metadata"]["uid"] = uid
    return pod


# Paths into an ExtenderArgs body, and what may be put there.
_ARG_PATHS = [
    ("Pod",), ("Pod", "metadata"), ("Pod", "metadata", "name"), ("Pod", "metadata", "namespace"),
    ("Pod", "metadata", "uid"), ("Pod", "metadata", "annotations"), ("Pod", "metadata", "labels"),
    ("Pod", "spec"), ("Pod", "spec", "containers"), ("Pod", "spec", "initContainers"),
    ("Pod", "spec", "containers", 0), ("Pod", "spec", "containers", 0, "resources"),
    ("Pod", "spec", "containers", 0, "resources", "limits"),
    ("Pod", "spec", "containers", 0, "resources", "requests"), ("NodeNames",), ("Nodes",),
    ("Pod", "status"), ("Unknown",), ("Pod", "metadata", "ownerReferences"),
]
_LIMITS = ("Pod", "spec", "containers", 0, "resources", "limits")
_RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"]
_POD_ANNOTATIONS = ["nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid",
                    "nvidia.com/nouse-gpuuuid", "hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy",
                    "nvidia.com/numa-bind", "hami.io/device-scoring-weights", "nvidia.com/vgpu-mode",
                    "hami.io/vgpu-node", "hami.io/vgpu-devices-allocated"]


def _set(doc, path, value) -> None:
    for key in path[:-1]:
        if isinstance(doc, dict) and key in doc:
            doc = doc[key]
        elif isinstance(doc, list) and isinstance(key, int) and key < len(doc):
            doc = doc[key]
        else:
            return
    if isinstance(doc, dict) and isinstance(path[-1], str):
        doc[path[-1]] = value
    elif isinstance(doc, list) and isinstance(path[-1], int) and path[-1] < len(doc):
        doc[path[-1]] = value


@st.composite
def extender_args(draw) -> dict:
    """A valid ExtenderArgs for a GPU pod with a few parts replaced by something else."""
    args = {"Pod": base_pod(), "NodeNames": list(NODES), "Nodes": None}
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["anywhere", "quantity", "annotation", "nodenames"]))
        if kind == "anywhere":
            _set(args, draw(st.sampled_from(_ARG_PATHS)), draw(json_value))
        elif kind == "quantity":
            _set(args, (*_LIMITS, draw(st.sampled_from(_RESOURCES))), draw(quantity))
        elif kind == "annotation":
            _set(args, ("Pod", "metadata", "annotations", draw(st.sampled_from(_POD_ANNOTATIONS))),
                 draw(st.one_of(st.text(max_size=30), json_value)))
        else:
            args["NodeNames"] = draw(st.lists(st.one_of(st.sampled_from(NODES + ["ghost", ""]), json_value),
                                              max_size=4))
    if draw(st.booleans()):
        args = {draw(st.sampled_from(["pod", "POD", "nodenames", "NODES"])) if k != "Nodes" else k: v
                for k, v in args.items()}
    return args


@st.composite
def bind_args(draw) -> dict:
    args = {"PodName": "fuzzed", "PodNamespace": "default", "PodUID": "fuzz-uid", "Node": "n1"}
    for key in draw(st.lists(st.sampled_from(sorted(args) + ["Extra"]), max_size=3)):
        args[key] = draw(st.one_of(json_value, st.text(max_size=40),
                                   st.sampled_from(["../x", "a/b", "%2F", "default/../kube-system", "n1\x00"])))
    return args


@st.composite
def admission_reviews(draw) -> dict:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "operation": "CREATE", "namespace": "default", "object": base_pod()}}
    paths = [("request",), ("request", "uid"), ("request", "object"), ("request", "object", "spec"),
             ("request", "operation"), ("request", "namespace"), ("apiVersion",), ("kind",),
             ("request", "object", "metadata"), ("request", "object", "spec", "containers", 0, "resources", "limits")]
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            _set(review, draw(st.sampled_from(paths)), draw(json_value))
        else:
            _set(review, ("request", "object", *_LIMITS[1:], draw(st.sampled_from(_RESOURCES))), draw(quantity))
    return review


def _json_bytes(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


# -- the cluster under fire ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    with LoopCluster() as c:
        for name in NODES:
            c.api.create("nodes", gpu_node(name, gpus=2))
        c.api.create("pods", base_pod())
        c.run(wait_for(lambda: all(n in c.app.cache.nodes for n in NODES), what="nodes"))
        yield c


async def _post(cluster: LoopCluster, verb: str, body: bytes, content_type: str = "application/json"):
    async with cluster.extender.session.post(f"{cluster.app.url}/{verb}", data=body,
                                             headers={"Content-Type": content_type}) as r:
        return r.status, await r.read()


def _check_filter_answer(status: int, raw: bytes) -> dict:
    assert status == 200, raw[:300]
    answer = orjson.loads(raw)
    assert set(answer) == FILTER_FIELDS, answer
    assert isinstance(answer["Error"], str)
    return answer


def _still_serving(cluster: LoopCluster) -> None:
    async def health():
        async with cluster.extender.session.get(f"{cluster.app.url}/healthz") as r:
            return r.status
    assert cluster.run(health()) == 200


def _settle(cluster: LoopCluster) -> None:
    """Delete every pod a fuzzed filter placed and nothing bound (its reservation, which writes
    nothing to the pod, goes with it; so does a decision left on an unbound pod), then check the
    books: the next test starts from a fresh, unplaced pod."""
    api = cluster.api
    for pod in api.list("pods"):
        node = (pod["metadata"].get("annotations") or {}).get("hami.io/vgpu-node")
        reserved = pod["metadata"].get("uid") in cluster.app.cache.pods
        if (node or reserved) and not pod["spec"].get("nodeName"):
            api.delete("pods", pod["metadata"]["name"], namespace="default")
    cluster.run(wait_books_balance(api, cluster.app))
    if api.get("pods", "fuzzed", namespace="default") is None:
        api.create("pods", base_pod())


def test_filter_answers_any_mutated_request_with_a_result_or_a_clear_error(cluster):
    @FUZZ
    @given(args=extender_args())
    def check(args):
        status, raw = cluster.run(_post(cluster, "filter", _json_bytes(args)))
        answer = _check_filter_answer(status, raw)
        if answer["NodeNames"]:
            # A placement or a pass-through: either way only names it was given.
            given_names = next((v for k, v in args.items() if k.lower() == "nodenames"), None)
            assert all(name in given_names for name in answer["NodeNames"]), (answer, args)
    check()
    _still_serving(cluster)
    _settle(cluster)


def test_filter_and_bind_answer_any_json_or_bytes(cluster):
    @FUZZ
    @given(body=st.one_of(json_value.map(_json_bytes), st.binary(max_size=200),
                          st.text(max_size=100).map(str.encode)), verb=st.sampled_from(["filter", "bind"]))
    def check(body, verb):
        status, raw = cluster.run(_post(cluster, verb, body))
        if verb == "filter":
            answer = _check_filter_answer(status, raw)
            try:
                valid = isinstance(orjson.loads(body), dict)
            except orjson.JSONDecodeError:
                valid = False
            if not valid:
                assert answer["Error"], answer
        else:
            assert status == 200, raw[:300]
            answer = orjson.loads(raw)
            assert set(answer) == {"Error"} and isinstance(answer["Error"], str)
    check()
    _still_serving(cluster)
    _settle(cluster)


def test_bind_answers_any_mutated_request(cluster):
    @FUZZ
    @given(args=bind_args())
    def check(args):
        status, raw = cluster.run(_post(cluster, "bind", _json_bytes(args)))
        assert status == 200, raw[:300]
        answer = orjson.loads(raw)
        assert set(answer) == {"Error"} and isinstance(answer["Error"], str)
        # Whatever was bound gets its allocation finished, so the next bind is not blocked.
        for node in NODES:
            lock = cluster.api.get("nodes", node)["metadata"].get("annotations", {}).get("hami.io/mutex.lock")
            if lock:
                _, ns, name = lock.split(",")
                if cluster.api.get("pods", name, namespace=ns):
                    finish_allocation(cluster.api, name, node, namespace=ns)
                else:
                    cluster.api.patch("nodes", node, {"metadata": {"annotations": {"hami.io/mutex.lock": None}}})
    check()
    _still_serving(cluster)
    _settle(cluster)


def test_webhook_answers_any_body_with_an_admission_review(cluster):
    @FUZZ
    @given(body=st.one_of(admission_reviews().map(_json_bytes), json_value.map(_json_bytes),
                          st.binary(max_size=100)),
           content_type=st.sampled_from(["application/json", "application/json", "text/plain", ""]))
    def check(body, content_type):
        status, raw = cluster.run(_post(cluster, "webhook", body, content_type))
        assert status == 200, raw[:300]
        answer = orjson.loads(raw)
        assert answer["kind"] == "AdmissionReview" and isinstance(answer["response"]["allowed"], bool)
        code = answer["response"]["status"]["code"]
        assert code != 500, answer        # 500 is how the webhook reports a bug of its own
        if code >= 400:
            assert answer["response"]["status"].get("message"), answer
    check()
    _still_serving(cluster)


# -- what hypothesis cannot draw well -----------------------------------------------------------

def _deep(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("verb", ["filter", "bind", "webhook"])
@pytest.mark.parametrize("depth", [200, 1000, 100000])
def test_deeply_nested_bodies_are_refused_clearly(cluster, verb, depth):
    pod = orjson.dumps(base_pod())
    body = {"filter": b'{"Pod":' + pod[:-1] + b',"x":' + _deep(depth) + b'},"NodeNames":["n1"]}',
            "bind": b'{"PodName":' + _deep(depth) + b"}",
            "webhook": b'{"request":' + _deep(depth) + b"}"}[verb]
    status, raw = cluster.run(_post(cluster, verb, body))
    assert status == 200, raw[:300]
    answer = orjson.loads(raw)
    if verb == "webhook":
        assert answer["response"]["status"]["code"] == 400 and answer["response"]["status"]["message"], answer
    else:
        assert "nests deeper" in answer["Error"] or "depth limit" in answer["Error"], answer


def test_deep_node_list_of_a_pod_we_pass_through_is_refused_clearly(cluster):
    """A pod without a device request is handed back untouched, ``Nodes`` and all; nesting that
    deep cannot be written back, so it must be refused on the way in."""
    cpu = orjson.dumps({"metadata": {"name": "cpu", "namespace": "default", "uid": "c"},
                        "spec": {"containers": [{"name": "c"}]}})
    status, raw = cluster.run(_post(cluster, "filter", b'{"Pod":' + cpu + b',"NodeNames":["n1"],"Nodes":'
                                    + _deep(300) + b"}"))
    answer = _check_filter_answer(status, raw)
    assert "deep" in answer["Error"], answer


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "", "application/yaml"])
def test_filter_reads_json_whatever_the_content_type_says(cluster, content_type):
    """kube-scheduler always sends JSON; like upstream, the declared type is not checked, the
    body is. (The webhook, whose caller is the API server, refuses anything but JSON.)"""
    args = {"Pod": {"metadata": {"name": "cpu", "namespace": "default"}, "spec": {"containers": [{"name": "c"}]}},
            "NodeNames": ["n1"]}
    status, raw = cluster.run(_post(cluster, "filter", orjson.dumps(args), content_type))
    assert _check_filter_answer(status, raw) == {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None,
                                                 "FailedAndUnresolvableNodes": None, "Error": ""}
    status, raw = cluster.run(_post(cluster, "filter", b"Pod=x&NodeNames=n1", content_type))
    assert _check_filter_answer(status, raw)["Error"].startswith("invalid JSON request body")


def test_a_pod_asking_for_absurdly_many_devices_is_refused_without_allocating_for_them(cluster):
    """The filter's output arrays (and the kernel's scratch) are sized by the devices a pod asks
    for; ``nvidia.com/gpu: 2147483647`` is a valid int32, and any user may create such a pod. It
    must be refused by its number, not cost gigabytes (the OOM killer took a fuzz run there)."""
    api = cluster.api
    for i, count in enumerate(["10000", "2147483647"]):
        pod = gpu_pod(f"greedy{i}", gpumem=1000)
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = count
        pod = api.create("pods", pod)
        result = cluster.run(cluster.extender.filter(pod, NODES))
        assert result["Error"] == (f"pod default/greedy{i}: asks for {int(count)} devices in all; "
                                   f"a pod may ask for at most {MAX_DEVICES_PER_POD}"), result
        api.delete("pods", f"greedy{i}", namespace="default")
    _still_serving(cluster)


def test_a_pod_without_a_uid_is_refused_and_reserves_nothing(cluster):
    """A reservation is keyed by the pod's UID and the patch preconditioned on it. A request whose
    pod lacks one (the fuzzer found it) once reserved under "" and patched the real pod by name:
    the pod's own events came under its real UID, and the "" reservation outlived the pod."""
    api = cluster.api
    pod = api.get("pods", "fuzzed", namespace="default")
    for meta, error in (({"uid": ""}, "filter request for pod default/fuzzed carries no UID"),
                        ({"uid": None}, "filter request for pod default/fuzzed carries no UID"),
                        ({"name": ""}, "extender args pod has no metadata.name or metadata.uid")):
        sent = copy.deepcopy(pod)
        sent["metadata"].update(meta)
        sent["metadata"] = {k: v for k, v in sent["metadata"].items() if v is not None}
        result = cluster.run(cluster.extender.filter(sent, NODES))
        assert result["Error"].endswith(error), result
        assert result["NodeNames"] is None
    assert "" not in cluster.app.cache.pods
    assert "hami.io/vgpu-node" not in (api.get("pods", "fuzzed", namespace="default")["metadata"].get("annotations") or {})
    cluster.run(wait_books_balance(api, cluster.app))


def _server_peers(app) -> set:
    """Client addresses of the connections the scheduler's HTTP servers hold open right now."""
    return {handler.transport.get_extra_info("peername")
            for runner in app._runners for handler in runner.server.connections if handler.transport is not None}


async def _raw_exchange(url: str, request: bytes, *, read: bool = True) -> bytes:
    """Send raw bytes; the first answer bytes, or nothing when ``read`` is false (hang up)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 16), timeout=10) if read else b""
    finally:
        writer.close()


def test_truncated_and_lying_bodies(cluster):
    url = cluster.app.url
    body = orjson.dumps({"Pod": base_pod(), "NodeNames": NODES})

    async def scenario():
        # Content-Length promises more than arrives, then the client hangs up.
        await _raw_exchange(url, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body[:40], read=False)
        # A Content-Length far beyond the limit is refused before any body is read.
        answer = await _raw_exchange(url, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                          b"Content-Length: 99999999999\r\n\r\n{")
        assert b" 200 " in answer.split(b"\r\n")[0] or b" 413 " in answer.split(b"\r\n")[0], answer[:200]
        # Chunked, growing past the limit.
        chunk = b"x" * 60000
        request = b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + \
            b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(30)) + b"0\r\n\r\n"
        answer = await _raw_exchange(url, request)
        assert b"exceeds the limit" in answer or b" 413 " in answer.split(b"\r\n")[0], answer[:200]
        # A body cut in the middle of the JSON.
        answer = await _raw_exchange(url, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n"
                                          b"Connection: close\r\n\r\n" + body[:40])
        assert b"invalid JSON request body" in answer, answer[:300]
    cluster.run(scenario())
    _still_serving(cluster)
    cluster.run(wait_books_balance(cluster.api, cluster.app))


def test_slow_clients_do_not_stall_the_others(cluster):
    """Connections that send a few bytes and then nothing (slowloris) hold no lock and no
    reservation: every other request is answered meanwhile, and nothing is half-applied."""
    url = cluster.app.url
    host, port = url.removeprefix("http://").split(":")
    pod = cluster.api.get("pods", "fuzzed", namespace="default")

    async def scenario():
        idle = []
        try:
            for _ in range(40):
                _, writer = await asyncio.open_connection(host, int(port))
                idle.append(writer)
                writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{\"Pod\":")
                await writer.drain()
            # The server holds all 40 (accepted, a handler each) before the other requests go out.
            ours = {w.get_extra_info("sockname") for w in idle}
            await wait_for(lambda: ours <= _server_peers(cluster.app), what="the server holds the 40 slow connections")
            for _ in range(5):
                result = await cluster.extender.filter(pod, NODES)
                assert result["Error"] == "" and result["NodeNames"], result
            async with cluster.extender.session.get(f"{url}/healthz") as r:
                assert r.status == 200
        finally:
            for writer in idle:
                writer.transport.abort()
    cluster.run(scenario())
    api = cluster.api
    api.delete("pods", "fuzzed", namespace="default")
    cluster.run(wait_books_balance(api, cluster.app))
    api.create("pods", base_pod())


# -- annotations ------------------------------------------------------------------------------

VENDORS = build_vendors(DeviceConfig.default())
GOOD_DEVICES = registration("good", gpus=2)
allocation_text = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="GPU-0123456789abcdef,:;NVIDIA -", max_size=80),
    st.builds(lambda uuid, mem, cores, tail: f"{uuid},NVIDIA,{mem},{cores}:{tail}",
              st.sampled_from([d["id"] for d in GOOD_DEVICES] + ["GPU-unknown", ""]),
              quantity_text, quantity_text, st.sampled_from(["", ";", ";;", ":", ",x"])))

_MISSING = object()   # the field is left out (Go decodes it as the zero value)
_PLAUSIBLE_DEVICE = {"index": 0, "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100", "numa": 0,
                     "mode": "hami-core", "health": True}
_EXTREME_FIELDS = {
    "id": ["", "GPU-p0", GOOD_DEVICES[0]["id"], _MISSING],     # empty, twice on the node, another node's GPU
    "index": [2**64 - 1, 2**64, -1, _MISSING],
    "count": [0, -1, 1, 2**31 - 1, -(2**31), 2**31, _MISSING],
    "devmem": [0, -5, 999, 2**31 - 1, -(2**31), 2**31, _MISSING],
    "devcore": [0, -100, 4, 101, 2**31 - 1, _MISSING],
    "type": ["", "Tesla T4", "AMD-MI300", _MISSING],
    "numa": [-1, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, _MISSING],
    "mode": ["mig", "mps", "", _MISSING],
    "health": [False, _MISSING, "true", 1],
}


@st.composite
def plausible_registration(draw) -> str:
    """A registration a device plugin could write: valid fields, with now and then one or two at
    an extreme (negative count, devmem 2**31-1, health false, a missing field...). Most are
    accepted, so the checks on an accepted node run; JSON or the legacy colon form."""
    devices = []
    for i in range(draw(st.integers(1, 3))):
        dev = {"id": f"GPU-p{i}", **_PLAUSIBLE_DEVICE, "index": i}
        n_odd = draw(st.sampled_from([0, 0, 1, 1, 2]))
        for field in draw(st.permutations(sorted(_EXTREME_FIELDS)))[:n_odd]:
            value = draw(st.sampled_from(_EXTREME_FIELDS[field]))
            if value is _MISSING:
                del dev[field]
            else:
                dev[field] = value
        devices.append(dev)
    if draw(st.sampled_from([True, True, False])):
        return json.dumps(devices)   # the standard encoder: 2**64 too (orjson stops at 64 bits)
    fields = ("id", "count", "devmem", "devcore", "type", "numa", "health", "index", "mode")
    n_fields = draw(st.sampled_from([7, 9]))
    segments = []
    for dev in devices:
        values = [dev.get(f, "") for f in fields[:n_fields]]
        segments.append(",".join("true" if v is True else "false" if v is False else str(v) for v in values))
    return ":".join(segments) + ":"


garbled_registration = st.one_of(
    st.text(max_size=80),
    json_value.map(lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode()),
    st.lists(st.fixed_dictionaries({}, optional={
        "id": st.one_of(st.sampled_from(["GPU-a", "GPU-a", "GPU-b"]), json_leaf),
        "index": numbers, "count": numbers, "devmem": numbers, "devcore": numbers, "type": json_leaf,
        "numa": numbers, "mode": json_leaf, "health": json_leaf}), max_size=4)
    .map(lambda devs: orjson.dumps(devs).decode()),
    st.text(alphabet="GPU-ab0123456789,:NVIDIA true false", max_size=80))


@st.composite
def registration_text(draw) -> str:
    """Two in three plausible, one in three garbled (st.one_of would flatten the garbled
    alternatives and draw each as often as the plausible one)."""
    return draw(plausible_registration() if draw(st.sampled_from([True, True, False])) else garbled_registration)


@st.composite
def pair_score_text(draw) -> str | None:
    """Mostly none or a well-formed pair-score annotation, sometimes a malformed one."""
    kind = draw(st.sampled_from(["none", "none", "plausible", "garbled"]))
    if kind == "none":
        return None
    if kind == "plausible":
        return draw(st.sampled_from(["null", "[]", '[{"uuid": "GPU-p0", "score": {"GPU-p1": 100}}]',
                                     '[{"uuid": "GPU-p0"}, null]']))
    return draw(st.text(max_size=30) | st.sampled_from(['[{"uuid": "GPU-p0", "score": {"GPU-p1": 1.5}}]',
                                                        '{"uuid": "GPU-p0"}', '[{"uuid": 5}]']))


def _cache_with_good_node() -> UsageCache:
    cache = UsageCache(VENDORS)
    cache.replace_nodes([gpu_node("good", devices=GOOD_DEVICES)])
    cache.replace_pods([], 1)
    return cache


def _self_consistent(cache: UsageCache) -> None:
    recount = cache.recount()
    for j, dev_id in enumerate(cache.device_ids):
        if dev_id and cache.vendor[j] >= 0:
            assert (cache.used[j], cache.used_mem[j], cache.used_cores[j]) == recount.get(dev_id, (0, 0, 0))


def _good_pod_still_schedules(cache: UsageCache, nodes: list[str]) -> None:
    pod = gpu_pod("victim", gpumem=1000, gpucores=5)
    pod["metadata"]["uid"] = "victim-uid"
    request = parse_pod_requests(pod, VENDORS, cache.vendor_ids)
    decision = Filterer(cache, VENDORS).decide(pod, nodes, request)
    assert decision.node is not None, decision.failed
    cache.remove_pod("victim-uid")


@settings(deadline=None, max_examples=2 * EXAMPLES)
@given(text=allocation_text, node=st.sampled_from(["good", "bad", "", "ghost"]),
       phase=st.sampled_from(["Pending", "Running", "Succeeded", "", "Weird"]),
       init=st.integers(0, 3), rv=st.one_of(st.sampled_from(["5", "", "x", "-3", "99999999999999999999"])))
def test_garbled_pod_allocation_never_breaks_the_cache(text, node, phase, init, rv):
    cache = _cache_with_good_node()
    pod = gpu_pod("garbled", gpumem=1000)
    pod["metadata"].update(uid="g-uid", resourceVersion=rv, annotations={
        "hami.io/vgpu-node": node, "hami.io/vgpu-devices-allocated": text})
    pod["spec"]["initContainers"] = [{"name": f"i{i}"} for i in range(init)]
    pod["status"] = {"phase": phase}
    cache.on_pod_event("ADDED", pod)
    cache.on_pod_event("MODIFIED", pod)
    _self_consistent(cache)
    # A garbled claim is ignored or charged as written; it never charges another node.
    charged = cache.pods.get("g-uid")
    assert charged is None or charged.node == node
    cache.on_pod_event("DELETED", pod)
    _self_consistent(cache)
    assert all(cache.used[j] == 0 and cache.used_mem[j] == 0 for j in range(len(cache.used)))
    _good_pod_still_schedules(cache, ["good"])


@settings(deadline=None, max_examples=2 * EXAMPLES)
@given(text=registration_text(), score=pair_score_text(),
       handshake=st.one_of(st.none(), st.sampled_from(["Requesting_2020-01-01 00:00:00", "Requesting_", "Requesting_x",
                                                       "Reported 2026-01-01 00:00:00", "Deleted_9999-99-99"])))
def test_garbled_node_registration_never_breaks_the_cache_or_other_nodes(text, score, handshake):
    cache = _cache_with_good_node()
    annotations = {"hami.io/node-nvidia-register": text}
    if score is not None:
        annotations["hami.io/node-nvidia-score"] = score
    if handshake is not None:
        annotations["hami.io/node-handshake"] = handshake
    bad = gpu_node("bad", annotations=annotations)
    cache.upsert_node(bad)
    cache.upsert_node(copy.deepcopy(bad))
    _self_consistent(cache)
    _good_pod_still_schedules(cache, ["bad", "good"])
    entry = cache.nodes["bad"]
    if entry.decode_error is not None:
        event("registration rejected")
    else:
        # Accepted (negative capacities included, as upstream): every field fits the kernel's
        # int32 arrays, and a pod placed there fits what the device registered.
        for dev in entry.devices:
            assert all(-(1 << 31) <= v < 1 << 31 for v in (dev.count, dev.devmem, dev.devcore, dev.numa))
        pod = gpu_pod("probe", gpumem=1000, gpucores=5)
        pod["metadata"]["uid"] = "probe-uid"
        decision = Filterer(cache, VENDORS).decide(pod, ["bad"], parse_pod_requests(pod, VENDORS, cache.vendor_ids))
        event("accepted, probe placed there" if decision.node == "bad" else "accepted, probe refused")
        if decision.node == "bad":
            for k, dev in enumerate(entry.devices):
                j = entry.offset + k
                assert cache.used[j] <= max(cache.count[j], 0) and cache.used_mem[j] <= max(cache.total_mem[j], 0)
    cache.remove_node("bad")
    _self_consistent(cache)


async def test_garbled_objects_in_the_cluster_never_stop_the_watch_or_the_others(api, app, extender):
    """End to end through the informers: garbled registrations and allocations arrive by watch
    and by list, and later events still flow and good pods still schedule."""
    api.create("nodes", gpu_node("good", gpus=1))
    for i, text in enumerate(["[{not json", "GPU-x,10,abc,100,NVIDIA,true:", '[{"id": 5}]', "[]", "null", "{}",
                              '[{"id":"GPU-z","count":-1,"devmem":-5,"devcore":100,"type":"NVIDIA","health":true}]',
                              '[{"id":"GPU-n","count":1,"devmem":9,"devcore":100,"type":"NVIDIA","numa":2147483648}]']):
        api.create("nodes", gpu_node(f"bad{i}", annotations={"hami.io/node-nvidia-register": text}))
    for i, text in enumerate(["garbage", "GPU-x,NVIDIA,abc,1:;", "GPU-x,NVIDIA:;", ";;;;", "x" * 10000]):
        pod = gpu_pod(f"garbled{i}")
        pod["metadata"]["annotations"].update({"hami.io/vgpu-node": "good", "hami.io/vgpu-devices-allocated": text})
        api.create("pods", pod)
    api.create("nodes", gpu_node("sentinel", gpus=1))
    await wait_for(lambda: "sentinel" in app.cache.nodes, what="events after the garbled ones")
    bad = [f"bad{i}" for i in range(8)]
    result = await extender.filter(api.create("pods", gpu_pod("victim", gpumem=1000)), [*bad, "good"])
    assert result["Error"] == "" and result["NodeNames"] == ["good"], result
    # The same objects again, by list: relist after a compaction.
    api.compact()
    api.drop_watches()
    api.create("nodes", gpu_node("sentinel2", gpus=1))
    await wait_for(lambda: "sentinel2" in app.cache.nodes, what="the relist")
    assert app.cache.nodes["bad7"].decode_error and "numa" in app.cache.nodes["bad7"].decode_error
    # bad6 registers a negative capacity: nothing is charged there, which is all that can be asked.
    await wait_books_balance(api, app, check_capacity=False)
