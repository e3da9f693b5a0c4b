"""The admission rules (hami_py.scheduling.admission.rules) and NVIDIA's admission defaults.

Every case goes through ``review()``: an AdmissionReview dict in, the answer dict out, with the
patch applied by an independent RFC 6902 implementation below, so what is asserted is the pod
the API server would store.
"""
from __future__ import annotations

import base64
import copy

import orjson
import pytest
from hypothesis import example, given, settings, strategies as st

from hami_py.config import DeviceConfig
from hami_py.devices.nvidia import nvidia_config
from hami_py.devices.registry import build_vendors
from hami_py.scheduling.admission.rules import (
    ADMISSION_V1, ADMISSION_V1BETA1, AdmissionSettings, json_patch, review, scheduler_applies,
)

OURS = AdmissionSettings(scheduler_name="hami-scheduler", force_overwrite_default_scheduler=True)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_json_patch(document: object, operations: list[dict]) -> object:
    """A small, strict RFC 6902 (add/remove/replace) for checking patches."""
    doc = copy.deepcopy(document)
    for op in operations:
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        parent = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                assert 0 <= index <= len(parent), op
                parent.insert(index, op["value"])
            elif op["op"] == "replace":
                parent[index] = op["value"]
            else:
                del parent[index]
        else:
            if op["op"] == "add":
                parent[last] = op["value"]
            elif op["op"] == "replace":
                assert last in parent, f"replace of a missing member: {op}"
                parent[last] = op["value"]
            else:
                assert last in parent, f"remove of a missing member: {op}"
                del parent[last]
    return doc


def make_pod(*containers: dict, init: list[dict] | None = None, scheduler: str | None = "default-scheduler",
             node: str | None = None, namespace: str | None = "team-a", **spec_extra) -> dict:
    spec: dict = {"containers": list(containers)}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node
    spec.update(spec_extra)
    meta: dict = {"name": "trainer"}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def container(name: str = "main", *, limits: dict | None = None, requests: dict | None = None,
              env: list | None = None, privileged: bool | None = None) -> dict:
    c: dict = {"name": name, "image": "cuda:12"}
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    if env is not None:
        c["env"] = env
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    return c


def envelope(pod: object, *, version: str = ADMISSION_V1, uid: str = "7f9c-uid", namespace: str | None = None) -> dict:
    request: dict = {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                     "operation": "CREATE", "object": pod}
    if namespace is not None:
        request["namespace"] = namespace
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}


def vendors_with(**nvidia_keys):
    """The chart's vendors, with these keys of the ``nvidia`` section overridden."""
    config = DeviceConfig.default()
    config.sections["nvidia"].update(nvidia_keys)
    return build_vendors(config)


CHART_VENDORS = vendors_with()


def admit(pod: dict, *, settings: AdmissionSettings = OURS, vendors=None, fit_quota=None, **kw):
    """(response, patched pod or None)."""
    args = {"settings": settings, "vendors": vendors or CHART_VENDORS}
    if fit_quota is not None:
        args["fit_quota"] = fit_quota
    answer = review(envelope(pod, **kw), **args)
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    patched = None
    if response["allowed"]:
        operations = orjson.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        if operations:
            assert response["patchType"] == "JSONPatch"
        patched = apply_json_patch(pod, operations)
    return response, patched


def limits_of(pod: dict, index: int = 0, group: str = "containers") -> dict:
    return pod["spec"][group][index].get("resources", {}).get("limits", {})


def env_of(pod: dict, index: int = 0, group: str = "containers") -> list:
    return pod["spec"][group][index].get("env", [])


# ---------------------------------------------------------------------------------------------
# scheduler name
# ---------------------------------------------------------------------------------------------

# (pod's schedulerName, --scheduler-name, --force-overwrite-default-scheduler) -> processed?
# Upstream: processed when the pod names no scheduler, names default-scheduler while
# force-overwrite is on, or already names --scheduler-name.
SCHEDULER_TABLE = [
    ("", "hami-scheduler", True, True),
    ("", "", True, True),
    ("default-scheduler", "hami-scheduler", True, True),
    ("default-scheduler", "hami-scheduler", False, False),
    ("default-scheduler", "", True, True),
    ("default-scheduler", "", False, False),
    ("hami-scheduler", "hami-scheduler", False, True),
    ("volcano", "hami-scheduler", True, False),
    ("volcano", "", True, False),
]


@pytest.mark.parametrize("pod_scheduler,flag,force,processed", SCHEDULER_TABLE)
def test_which_pods_the_webhook_processes(pod_scheduler, flag, force, processed):
    settings = AdmissionSettings(scheduler_name=flag, force_overwrite_default_scheduler=force)
    assert scheduler_applies(pod_scheduler, settings=settings) is processed
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}), scheduler=pod_scheduler or None)
    response, patched = admit(pod, settings=settings)
    assert response["allowed"]
    if not processed:
        assert response["status"] == {"code": 200, "message": "pod already has different scheduler assigned"}
        assert "patch" not in response
        return
    # processed: the vendor defaults apply; the name is rewritten only when --scheduler-name is set
    assert limits_of(patched)["nvidia.com/gpucores"] == "100"
    expected = flag or pod_scheduler or None
    assert patched["spec"].get("schedulerName") == expected


def test_device_pod_from_default_scheduler_goes_to_ours():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
    response, patched = admit(pod)
    assert response["allowed"] and response["status"] == {"code": 200}
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    operations = orjson.loads(base64.b64decode(response["patch"]))
    assert operations == [{"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}]


def test_pod_without_devices_keeps_its_scheduler_and_gets_no_patch():
    pod = make_pod(container(limits={"cpu": "2", "memory": "1Gi"}))
    response, patched = admit(pod)
    assert response["allowed"] and "patch" not in response
    assert patched == pod


def test_pod_without_scheduler_name_gets_ours_added():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}), scheduler=None)
    response, patched = admit(pod)
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in \
        orjson.loads(base64.b64decode(response["patch"]))


# ---------------------------------------------------------------------------------------------
# denials
# ---------------------------------------------------------------------------------------------

def test_pod_with_no_containers_is_denied():
    response, _ = admit(make_pod())
    assert response == {"uid": "7f9c-uid", "allowed": False,
                        "status": {"code": 403, "reason": "Forbidden", "message": "pod has no containers"}}


def test_pod_with_only_init_containers_is_denied():
    response, _ = admit(make_pod(init=[container("setup")]))
    assert not response["allowed"] and response["status"]["message"] == "pod has no containers"


@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_device_pod_with_a_privileged_container_is_denied(where):
    sidecar = container("debug", privileged=True)
    gpu = container("main", limits={"nvidia.com/gpu": "1"})
    pod = make_pod(gpu, sidecar) if where == "containers" else make_pod(gpu, init=[sidecar])
    response, _ = admit(pod)
    assert not response["allowed"]
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "container debug is privileged"}


def test_first_privileged_container_is_named_init_containers_first():
    pod = make_pod(container("main", limits={"nvidia.com/gpu": "1"}, privileged=True),
                   init=[container("setup", privileged=True)])
    response, _ = admit(pod)
    assert response["status"]["message"] == "container setup is privileged"


def test_privileged_pod_without_devices_is_allowed():
    response, patched = admit(make_pod(container(privileged=True)))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "default-scheduler"


def test_privileged_false_is_not_privileged():
    response, _ = admit(make_pod(container(limits={"nvidia.com/gpu": "1"}, privileged=False)))
    assert response["allowed"]


def test_device_pod_already_on_a_node_is_denied():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}), node="gpu-node-1")
    response, _ = admit(pod)
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "pod has node assigned"}


def test_pod_on_a_node_without_devices_is_allowed():
    response, _ = admit(make_pod(container(), node="gpu-node-1"))
    assert response["allowed"]


def test_node_assigned_device_pod_is_allowed_without_scheduler_name():
    """Upstream only refuses it while rewriting the scheduler name (--scheduler-name set)."""
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}), node="gpu-node-1")
    response, patched = admit(pod, settings=AdmissionSettings(scheduler_name=""))
    assert response["allowed"] and patched["spec"]["nodeName"] == "gpu-node-1"


# ---------------------------------------------------------------------------------------------
# NVIDIA defaults
# ---------------------------------------------------------------------------------------------

def test_memory_only_container_gets_the_default_gpu_count():
    pod = make_pod(container(limits={"nvidia.com/gpumem": "4000"}))
    _, patched = admit(pod)
    assert limits_of(patched) == {"nvidia.com/gpumem": "4000", "nvidia.com/gpu": "1"}
    assert patched["spec"]["schedulerName"] == "hami-scheduler"


def test_default_gpu_count_follows_the_config():
    pod = make_pod(container(limits={"nvidia.com/gpucores": "20"}))
    _, patched = admit(pod, vendors=vendors_with(defaultGPUNum=2))
    assert limits_of(patched)["nvidia.com/gpu"] == "2"


def test_without_a_default_count_a_memory_only_container_is_no_device_request():
    pod = make_pod(container(limits={"nvidia.com/gpumem": "4000"}))
    response, patched = admit(pod, vendors=vendors_with(defaultGPUNum=0))
    assert response["allowed"] and "patch" not in response
    assert patched["spec"]["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize("limits,cores", [
    ({"nvidia.com/gpu": "1"}, "100"),                                        # whole card
    ({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"}, "100"),  # all of the memory
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, None),    # a share
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}, None),             # a share
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, "30"),             # cores given
])
def test_exclusive_cores_default(limits, cores):
    _, patched = admit(make_pod(container(limits=dict(limits))))
    assert limits_of(patched).get("nvidia.com/gpucores") == cores


def test_gpu_count_in_requests_only_still_gets_exclusive_cores():
    pod = make_pod(container(requests={"nvidia.com/gpu": "1"}))
    _, patched = admit(pod)
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpucores": "100"}}
    assert patched["spec"]["schedulerName"] == "hami-scheduler"


def test_priority_limit_becomes_cuda_task_priority():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/priority": "1"},
                             env=[{"name": "MODE", "value": "train"}]))
    response, patched = admit(pod)
    assert env_of(patched) == [{"name": "MODE", "value": "train"}, {"name": "CUDA_TASK_PRIORITY", "value": "1"}]
    # the existing variable is not rewritten: the patch appends one element
    assert {"op": "add", "path": "/spec/containers/0/env/1", "value": {"name": "CUDA_TASK_PRIORITY", "value": "1"}} \
        in orjson.loads(base64.b64decode(response["patch"]))


def test_core_policy_env_goes_into_every_container():
    pod = make_pod(container("main", limits={"nvidia.com/gpu": "1"}), container("sidecar"),
                   init=[container("setup")])
    _, patched = admit(pod, vendors=vendors_with(gpuCorePolicy="force"))
    for group, index in (("initContainers", 0), ("containers", 0), ("containers", 1)):
        assert env_of(patched, index, group) == [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]


def test_overwrite_env_hides_gpus_from_containers_without_a_request():
    pod = make_pod(container("main", limits={"nvidia.com/gpu": "1"}), container("sidecar"))
    _, patched = admit(pod, vendors=vendors_with(overwriteEnv=True))
    assert env_of(patched, 0) == []
    assert env_of(patched, 1) == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


def test_runtime_class_is_set_for_device_pods_only_when_absent():
    vendors = vendors_with(runtimeClassName="nvidia")
    _, patched = admit(make_pod(container(limits={"nvidia.com/gpu": "1"})), vendors=vendors)
    assert patched["spec"]["runtimeClassName"] == "nvidia"
    _, patched = admit(make_pod(container(limits={"nvidia.com/gpu": "1"}), runtimeClassName="kata"), vendors=vendors)
    assert patched["spec"]["runtimeClassName"] == "kata"
    _, patched = admit(make_pod(container()), vendors=vendors)
    assert "runtimeClassName" not in patched["spec"]


def test_init_container_requests_count():
    pod = make_pod(container("main"), init=[container("warmup", limits={"nvidia.com/gpumem": "1000"})])
    _, patched = admit(pod)
    assert limits_of(patched, 0, "initContainers")["nvidia.com/gpu"] == "1"
    assert patched["spec"]["schedulerName"] == "hami-scheduler"


@pytest.mark.parametrize("part", ["limits", "requests"])
@pytest.mark.parametrize("resource, value", [
    ("nvidia.com/gpumem-percentage", "150"), ("nvidia.com/gpumem-percentage", "-1"),
    ("nvidia.com/gpumem-percentage", "50.5"), ("nvidia.com/gpumem-percentage", "200"),
    ("nvidia.com/gpucores", "150"), ("nvidia.com/gpucores", "-5"), ("nvidia.com/gpucores", "12.5"),
])
def test_memory_percentage_out_of_range_is_an_error(part, resource, value):
    """HAMi after v2.10 (#2740, #2789): a percentage that is not an integer in 0..100, in limits
    or in requests, is refused, not rounded; denied (403) like every refusal, never a 500
    (upstream's Errored answer, which once let ``-1`` through as a webhook fault)."""
    resources = {"limits": {"nvidia.com/gpu": "1"}, "requests": {}}
    resources[part][resource] = value
    pod = make_pod(container("main", **resources))
    response, _ = admit(pod)
    assert not response["allowed"]
    assert response["status"] == {"code": 403, "reason": "Forbidden",
                                  "message": f"invalid {resource} value {value} in container main: "
                                             "must be an integer between 0 and 100"}


@pytest.mark.parametrize("limits, message", [
    *(({"nvidia.com/gpu": count}, f"invalid nvidia.com/gpu request in container main: device count {count} {reason}")
      for count, reason in (("1Ei", "is out of range"), ("1e19", "is not a plain integer"), ("-1", "is out of range"),
                            ("2147483648", "is out of range"))),
    *(({"nvidia.com/gpu": "1", "nvidia.com/gpumem": memory},
       f'container "main": nvidia.com/gpumem "{memory}" is out of range: must be between 0 and 2147483647 MiB')
      for memory in ("-1", "2147483648")),
])
def test_an_invalid_count_or_memory_is_denied_with_upstreams_reason(limits, message):
    response, _ = admit(make_pod(container("main", limits=limits)))
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": message}


def test_a_count_of_zero_is_admitted_not_refused():
    """An explicit 0 asks for no device of the family (#2994): no refusal (the filter passes it through)."""
    response, patched = admit(make_pod(container("main", limits={"nvidia.com/gpu": "0"})))
    assert response["allowed"] and limits_of(patched)["nvidia.com/gpu"] == "0"


def test_malformed_device_request_is_denied_with_the_reason():
    """Deliberate difference: upstream admits it and later binds the pod without devices."""
    pod = make_pod(container("main", limits={"nvidia.com/gpu": "1.5"}))
    response, _ = admit(pod)
    assert not response["allowed"] and response["status"]["code"] == 403
    assert response["status"]["message"] == \
        "invalid nvidia.com/gpu request in container main: device count 1.5 is not a plain integer"


def test_mutation_never_changes_the_input_pod():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}), scheduler=None)
    before = copy.deepcopy(pod)
    admit(pod, vendors=vendors_with(gpuCorePolicy="disable", runtimeClassName="nvidia"))
    assert pod == before


# ---------------------------------------------------------------------------------------------
# quota pre-check
# ---------------------------------------------------------------------------------------------

class QuotaStub:
    def __init__(self, fits: bool):
        self.fits = fits
        self.calls: list[tuple] = []

    def __call__(self, namespace, vendor_key, memory, cores):
        self.calls.append((namespace, vendor_key, memory, cores))
        return self.fits


def test_quota_refusal_denies_the_pod():
    quota = QuotaStub(False)
    response, _ = admit(make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"})),
                        fit_quota=quota)
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "exceeding resource quota"}
    assert quota.calls == [("team-a", "NVIDIA", 4000, 0)]


def test_quota_sums_containers_and_takes_the_largest_init_container():
    quota = QuotaStub(True)
    pod = make_pod(container("a", limits={"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}),
                   container("b", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"}),
                   init=[container("i1", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4500", "nvidia.com/gpucores": "5"}),
                         container("i2", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "90"})])
    response, _ = admit(pod, fit_quota=quota)
    assert response["allowed"]
    # app: 2x1000 + 3000 = 5000 MiB, 2x10 + 20 = 40 cores; init max: 4500 MiB, 90 cores
    assert quota.calls == [("team-a", "NVIDIA", 5000, 90)]


def test_quota_counts_the_webhooks_own_defaults():
    quota = QuotaStub(True)
    admit(make_pod(container(limits={"nvidia.com/gpumem": "2000"})), fit_quota=quota)
    assert quota.calls == [("team-a", "NVIDIA", 2000, 0)]  # the defaulted count (1) applied


def test_quota_is_not_asked_about_pods_without_device_memory_or_cores():
    quota = QuotaStub(False)
    response, _ = admit(make_pod(container(limits={"cpu": "1"})), fit_quota=quota)
    assert response["allowed"] and quota.calls == []
    # a whole card asks for 0 MiB here but 100 cores (the exclusive default)
    response, _ = admit(make_pod(container(limits={"nvidia.com/gpu": "1"})), fit_quota=quota)
    assert not response["allowed"] and quota.calls == [("team-a", "NVIDIA", 0, 100)]


def test_quota_uses_the_request_namespace_when_the_object_has_none():
    quota = QuotaStub(True)
    admit(make_pod(container(limits={"nvidia.com/gpumem": "2000"}), namespace=None), fit_quota=quota,
          namespace="team-b")
    assert quota.calls[0][0] == "team-b"


def test_quota_not_checked_for_other_schedulers_pods():
    quota = QuotaStub(False)
    response, _ = admit(make_pod(container(limits={"nvidia.com/gpumem": "2000"}), scheduler="volcano"),
                        fit_quota=quota)
    assert response["allowed"] and quota.calls == []


# ---------------------------------------------------------------------------------------------
# the envelope and malformed input
# ---------------------------------------------------------------------------------------------

def test_v1beta1_review_is_answered_in_v1beta1():
    answer = review(envelope(make_pod(container(limits={"nvidia.com/gpu": "1"})), version=ADMISSION_V1BETA1),
                    settings=OURS, vendors=CHART_VENDORS)
    assert answer["apiVersion"] == ADMISSION_V1BETA1 and answer["response"]["uid"] == "7f9c-uid"
    assert answer["response"]["allowed"]


@pytest.mark.parametrize("body,message", [
    ([], "expected an AdmissionReview object, got a list"),
    ({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview"},
     'expected kind AdmissionReview in admission.k8s.io/v1 or admission.k8s.io/v1beta1, '
     'got kind "AdmissionReview" in apiVersion "admission.k8s.io/v2"'),
    ({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview"}, "AdmissionReview has no request object (request is null)"),
    ({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "request": {"object": {}}},
     "request.uid: expected a non-empty string"),
    (envelope(None), "request.object: expected a Pod object, got null"),
    (envelope({"kind": "Service", "spec": {}}), 'request.object is a "Service", not a Pod'),
    (envelope({"spec": {"containers": "main"}}), "spec.containers: expected a list, got a string"),
    (envelope({"spec": {"containers": [7]}}), "spec.containers[0]: expected a container object, got a number"),
    (envelope({"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": {"n": 1}}}}]}}),
     "spec.containers[0].resources.limits[nvidia.com/gpu]: expected a quantity, got an object"),
    (envelope({"spec": {"initContainers": [{"securityContext": {"privileged": "yes"}}], "containers": []}}),
     "spec.initContainers[0].securityContext.privileged: expected a boolean, got a string"),
    (envelope({"metadata": {"annotations": {"a": 1}}, "spec": {}}),
     "metadata.annotations[a]: expected a string, got a number"),
    (envelope({"spec": {"schedulerName": 3, "containers": [{}]}}), "spec.schedulerName: expected a string, got a number"),
])
def test_malformed_review_gets_an_error_response(body, message):
    answer = review(body, settings=OURS, vendors=CHART_VENDORS)
    response = answer["response"]
    assert answer["apiVersion"] in (ADMISSION_V1, ADMISSION_V1BETA1) and answer["kind"] == "AdmissionReview"
    assert response["allowed"] is False
    assert response["status"] == {"code": 400, "message": message}


def test_a_fault_of_ours_is_a_500_answer_not_an_exception():
    def broken_quota(*_):
        raise RuntimeError("quota cache exploded")
    response, _ = admit(make_pod(container(limits={"nvidia.com/gpumem": "2000"})), fit_quota=broken_quota)
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert "quota cache exploded" in response["status"]["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12)


_NVIDIA = nvidia_config(DeviceConfig.default())
NVIDIA_RESOURCES = [_NVIDIA.resource_count_name, _NVIDIA.resource_memory_name,
                    _NVIDIA.resource_memory_percentage_name, _NVIDIA.resource_core_name,
                    _NVIDIA.resource_priority_name]


def _mostly(good, bad=json_values):
    """``good`` most of the time, else any JSON value: the shape checks stay in play without
    drowning the device path in 400s."""
    return st.integers(0, 7).flatmap(lambda n: bad if n == 7 else good)


# A quantity as a user may write it: mostly plausible, sometimes malformed, sometimes not a string.
quantities = _mostly(st.integers(0, 16).map(str) | st.integers(0, 100000).map(str)
                     | st.sampled_from(["-1", "1.5", "500m", "2Gi", "0.3Ki", "1e3", "", "two"]))
resource_lists = st.dictionaries(st.sampled_from([*NVIDIA_RESOURCES, "cpu", "memory"]), quantities,
                                 min_size=1, max_size=4)
resources = _mostly(st.fixed_dictionaries({"limits": resource_lists}, optional={"requests": resource_lists}))
env_lists = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["A", "B"]), "value": st.text(max_size=3)}),
                     max_size=2)
containers = st.fixed_dictionaries(
    {"name": _mostly(st.sampled_from(["main", "side"])), "resources": resources},
    optional={"env": _mostly(env_lists),
              "securityContext": _mostly(st.fixed_dictionaries({}, optional={"privileged": st.booleans()}))})


def test_no_review_makes_the_webhook_raise():
    """Random pods, most of them asking for NVIDIA devices in well- and ill-formed ways: every
    review gets an answer, an allowed one with a patch that applies, and the device path (admitted
    to our scheduler, or refused by the vendor) is actually reached."""
    outcomes: dict[str, int] = {}

    @settings(max_examples=150, deadline=None)
    @given(spec=st.fixed_dictionaries({}, optional={
               "containers": json_values, "initContainers": _mostly(st.lists(containers, max_size=2)),
               "schedulerName": _mostly(st.sampled_from(["default-scheduler", "hami-scheduler", "other"])),
               "nodeName": _mostly(st.just("n1")), "runtimeClassName": _mostly(st.sampled_from(["nvidia", ""]))}),
           app_containers=_mostly(st.lists(containers, min_size=1, max_size=2), st.just([])))
    # Regression: a null container name beside a malformed device request.
    @example(spec={}, app_containers=[{"name": None, "resources": {"limits": {"nvidia.com/gpu": "-1"}}}])
    def one_review(spec, app_containers):
        pod = {"metadata": {"name": "x"}, "spec": dict(spec)}
        if app_containers:
            pod["spec"]["containers"] = app_containers
        answer = review(envelope(pod), settings=OURS, vendors=CHART_VENDORS)
        response = answer["response"]
        code = response["status"]["code"]
        assert code in (200, 400, 403), response     # a vendor's refusal is a denial, never a 500
        if response["allowed"]:
            operations = orjson.loads(base64.b64decode(response["patch"])) if "patch" in response else []
            admitted = apply_json_patch(pod, operations)
            asks = any(name in ((c.get("resources") or {}).get(kind) or {}) for c in admitted["spec"]["containers"]
                       for kind in ("limits", "requests") for name in NVIDIA_RESOURCES)
            ours = admitted["spec"].get("schedulerName") == "hami-scheduler"
            outcome = "admitted to hami-scheduler" if asks and ours else "allowed"
        elif any(name in response["status"]["message"] for name in NVIDIA_RESOURCES):
            outcome = "device request refused"
        else:
            outcome = f"denied {code}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    one_review()
    assert outcomes.get("admitted to hami-scheduler") and outcomes.get("device request refused"), outcomes


# ---------------------------------------------------------------------------------------------
# JSON Patch
# ---------------------------------------------------------------------------------------------

def test_patch_paths_escape_slashes_and_tildes():
    before = {"limits": {"a~b": "1"}}
    after = {"limits": {"a~b": "2", "nvidia.com/gpu": "1"}}
    assert json_patch(before, after) == [
        {"op": "replace", "path": "/limits/a~0b", "value": "2"},
        {"op": "add", "path": "/limits/nvidia.com~1gpu", "value": "1"},
    ]


@settings(max_examples=100, deadline=None)
@given(before=json_values, after=json_values)
def test_patch_turns_before_into_after(before, after):
    document = {"root": before}
    assert apply_json_patch(document, json_patch(document, {"root": after})) == {"root": after}


# -- hami.io/numa-alignment (HAMi after v2.10: the NUMA refit's opt-in) ---------------------------

@pytest.mark.parametrize("value", ["best-effort", "strict", " Strict ", "BEST-EFFORT"])
def test_a_numa_alignment_the_device_plugin_reads_is_admitted(value):
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}))
    pod["metadata"]["annotations"] = {"hami.io/numa-alignment": value}
    response, patched = admit(pod)
    assert response["allowed"] and patched["metadata"]["annotations"] == {"hami.io/numa-alignment": value}


@pytest.mark.parametrize("value", ["", "besteffort", "true", "strict,best-effort"])
def test_any_other_numa_alignment_is_denied_with_the_values_it_takes(value):
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}))
    pod["metadata"]["annotations"] = {"hami.io/numa-alignment": value}
    response, _ = admit(pod)
    assert not response["allowed"]
    assert response["status"] == {"code": 403, "reason": "Forbidden",
                                  "message": f"invalid hami.io/numa-alignment annotation {value!r}: "
                                             "expected best-effort or strict"}


def test_another_schedulers_pod_is_not_judged_on_its_numa_alignment():
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}), scheduler="volcano")
    pod["metadata"]["annotations"] = {"hami.io/numa-alignment": "sometimes"}
    response, _ = admit(pod)
    assert response["allowed"]
