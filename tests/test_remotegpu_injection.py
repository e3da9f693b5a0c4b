"""Remote GPUs ("lupine") at admission: what a client container is given (HAMi #3013, #3201).

A client pod runs where no device plugin sees it, so everything it needs is written into its spec
at admission: where its server is (``LUPINE_SERVER`` from the decision annotation), who it is
(``LUPINE_WORKLOAD_ID``), and, with a library image and a memory request, HAMi-core preloaded
from an init container that runs first. Checked on the pure function, then through the webhook's
own review (JSON patch, reinvocation) with a family whose admission step is only this function.
"""
from __future__ import annotations

import copy

import pytest

from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.devices.remotegpu.injection import (
    COPY_COMMAND, LIB_DIR, LIB_FILE, LIB_NAME, SHARED_CACHE, inject,
)
from tests.test_webhook import admit, container, make_pod

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"
LIB_IMAGE = "projecthami/hami:v2.11"

SERVER_REF = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['hami.io/lupine-endpoint']"}}
UID_REF = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}


def _inject(pod: dict, index: int = 0, *, group: str = "containers", lib_image: str = LIB_IMAGE) -> bool:
    return inject(pod["spec"][group][index], pod, count_resource=COUNT, memory_resource=MEMORY, lib_image=lib_image)


def _env(c: dict) -> dict:
    """name -> value (or valueFrom); a name twice would make the kubelet pick one silently."""
    names = [var["name"] for var in c.get("env") or ()]
    assert len(names) == len(set(names)), names
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in c.get("env") or ()}


def _client(name: str = "main", *, count: str = "1", memory: str | None = "20000", env: list | None = None) -> dict:
    limits = {COUNT: count}
    if memory is not None:
        limits[MEMORY] = memory
    return container(name, limits=limits, env=env)


# -- where the server is, who the workload is ---------------------------------------------------

def test_the_server_and_workload_come_from_the_pod_through_the_downward_api():
    pod = make_pod(_client(memory=None))
    assert _inject(pod, lib_image="") is True
    env = _env(pod["spec"]["containers"][0])
    assert env == {"LUPINE_SERVER": SERVER_REF, "LUPINE_WORKLOAD_ID": UID_REF}
    assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]


def test_a_literal_server_is_replaced_since_the_server_is_chosen_after_admission():
    pod = make_pod(_client(memory=None, env=[{"name": "LUPINE_SERVER", "value": "10.0.0.9:14833"},
                                             {"name": "OTHER", "value": "kept"},
                                             {"name": "LUPINE_SERVER", "value": "10.0.0.8:14833"}]))
    _inject(pod, lib_image="")
    env = pod["spec"]["containers"][0]["env"]
    # In place of the first, the later duplicate dropped (it would win over ours).
    assert env[:2] == [{"name": "LUPINE_SERVER", "valueFrom": SERVER_REF}, {"name": "OTHER", "value": "kept"}]
    assert _env(pod["spec"]["containers"][0])["LUPINE_SERVER"] == SERVER_REF


@pytest.mark.parametrize("limits", [{}, {COUNT: "0"}, {MEMORY: "2000"}, {"nvidia.com/gpu": "1"}],
                         ids=["nothing", "zero-count", "memory-only", "local-gpu"])
def test_a_container_asking_no_remote_gpu_is_left_alone(limits):
    pod = make_pod(container(limits=limits))
    before = copy.deepcopy(pod)
    assert _inject(pod) is False
    assert pod == before


def test_the_family_switched_off_injects_nothing():
    pod = make_pod(_client())
    before = copy.deepcopy(pod)
    assert inject(pod["spec"]["containers"][0], pod, count_resource="", memory_resource=MEMORY,
                  lib_image=LIB_IMAGE) is False
    assert pod == before


# -- HAMi-core delivery ------------------------------------------------------------------------

def test_a_memory_request_with_a_library_image_preloads_hami_core_with_the_limit():
    pod = make_pod(_client(memory="20000"))
    assert _inject(pod) is True
    spec = pod["spec"]
    main = spec["containers"][0]
    assert _env(main) == {"LUPINE_SERVER": SERVER_REF, "LUPINE_WORKLOAD_ID": UID_REF, "LD_PRELOAD": LIB_FILE,
                          "CUDA_DEVICE_MEMORY_LIMIT": "20000m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": SHARED_CACHE}
    assert main["volumeMounts"] == [{"name": LIB_NAME, "mountPath": LIB_DIR}]
    assert spec["volumes"] == [{"name": LIB_NAME, "emptyDir": {}}]
    assert spec["initContainers"] == [{
        "name": LIB_NAME, "image": LIB_IMAGE,
        "command": ["sh", "-c", "cp /k8s-vgpu/lib/nvidia/libvgpu.so.* /hami-remote-gpu/libvgpu.so"],
        "volumeMounts": [{"name": LIB_NAME, "mountPath": "/hami-remote-gpu"}]}]


def test_the_memory_may_be_a_request_rather_than_a_limit():
    pod = make_pod(container(limits={COUNT: "1"}, requests={MEMORY: "1024"}))
    _inject(pod)
    assert _env(pod["spec"]["containers"][0])["CUDA_DEVICE_MEMORY_LIMIT"] == "1024m"


@pytest.mark.parametrize("lib_image,memory", [("", "20000"), (LIB_IMAGE, "0"), (LIB_IMAGE, None)],
                         ids=["no-image", "zero-memory", "no-memory"])
def test_no_library_without_an_image_or_a_memory_request(lib_image, memory):
    pod = make_pod(_client(memory=memory))
    assert _inject(pod, lib_image=lib_image) is True
    assert set(_env(pod["spec"]["containers"][0])) == {"LUPINE_SERVER", "LUPINE_WORKLOAD_ID"}
    assert "volumeMounts" not in pod["spec"]["containers"][0]
    assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]


def test_the_library_init_container_runs_before_the_pods_own():
    pod = make_pod(_client(), init=[container("fetch-data"), container("migrate")])
    _inject(pod)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [LIB_NAME, "fetch-data", "migrate"]


def test_a_library_init_container_found_later_is_moved_first():
    """A pod copied from an already admitted one (or another webhook appended its own init
    container after ours): the copy step is moved, not duplicated, and takes the configured image."""
    copier = {"name": LIB_NAME, "image": "old/hami:v2.10", "command": list(COPY_COMMAND),
              "volumeMounts": [{"name": LIB_NAME, "mountPath": LIB_DIR}], "imagePullPolicy": "IfNotPresent"}
    pod = make_pod(_client(), init=[container("fetch-data"), copier])
    pod["spec"]["volumes"] = [{"name": LIB_NAME, "emptyDir": {}}]
    _inject(pod)
    inits = pod["spec"]["initContainers"]
    assert [c["name"] for c in inits] == [LIB_NAME, "fetch-data"]
    assert inits[0]["image"] == LIB_IMAGE and inits[0]["imagePullPolicy"] == "IfNotPresent"
    assert pod["spec"]["volumes"] == [{"name": LIB_NAME, "emptyDir": {}}]


def test_an_own_ld_preload_literal_is_kept_after_the_library():
    pod = make_pod(_client(env=[{"name": "LD_PRELOAD", "value": "/opt/tracer.so:/opt/alloc.so"}]))
    _inject(pod)
    assert _env(pod["spec"]["containers"][0])["LD_PRELOAD"] == f"{LIB_FILE} /opt/tracer.so:/opt/alloc.so"


def test_the_library_is_moved_to_the_front_of_a_preload_that_already_names_it():
    pod = make_pod(_client(env=[{"name": "LD_PRELOAD", "value": f"/opt/tracer.so {LIB_FILE}"}]))
    _inject(pod)
    assert _env(pod["spec"]["containers"][0])["LD_PRELOAD"] == f"{LIB_FILE} /opt/tracer.so"


def test_ld_preload_from_a_source_is_refused_and_nothing_is_written():
    source = {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "tools", "key": "preload"}}}
    pod = make_pod(_client(name="trainer", env=[source]))
    before = copy.deepcopy(pod)
    with pytest.raises(RequestError) as refused:
        _inject(pod)
    assert str(refused.value) == (
        'container "trainer" takes LD_PRELOAD from a source, which cannot be combined with the RemoteGPU '
        f"memory limit: set LD_PRELOAD literally, or drop the {MEMORY} request")
    assert pod == before


def test_ld_preload_from_a_source_is_fine_when_no_library_is_preloaded():
    source = {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "tools", "key": "preload"}}}
    pod = make_pod(_client(memory=None, env=[source]))
    assert _inject(pod) is True
    assert _env(pod["spec"]["containers"][0])["LD_PRELOAD"] == source["valueFrom"]


@pytest.mark.parametrize("limits,message", [
    ({COUNT: "1.5"}, f'invalid {COUNT} request in container main: device count 1.5 is not a plain integer'),
    ({COUNT: "-1"}, f'invalid {COUNT} request in container main: device count -1 is out of range'),
    ({COUNT: "1", MEMORY: "1.5"}, f'container "main": {MEMORY} "1.5" is not a whole number of MiB'),
    ({COUNT: "1", MEMORY: "-5"}, f'container "main": {MEMORY} "-5" is out of range: must be between 0 and '
                                 f'2147483647 MiB'),
])
def test_a_malformed_request_is_refused_naming_container_resource_and_value(limits, message):
    pod = make_pod(container(limits=limits))
    with pytest.raises(RequestError) as refused:
        _inject(pod)
    assert str(refused.value) == message


@pytest.mark.parametrize("change,message", [
    (lambda pod: pod["spec"].update(volumes=[{"name": LIB_NAME, "hostPath": {"path": "/opt"}}]),
     f'volume "{LIB_NAME}" is not the emptyDir the library is copied into'),
    (lambda pod: pod["spec"].update(initContainers=[container(LIB_NAME)]),
     f'already has a container named "{LIB_NAME}"'),
    (lambda pod: pod["spec"]["containers"].append(container(LIB_NAME)),
     f'already has a container named "{LIB_NAME}"'),
    (lambda pod: pod["spec"]["containers"][0].update(volumeMounts=[{"name": "scratch", "mountPath": LIB_DIR + "/"}]),
     f'mounts volume "scratch" at {LIB_DIR}, where the RemoteGPU library goes'),
])
def test_a_pod_whose_names_collide_with_the_delivery_is_refused_whole(change, message):
    pod = make_pod(_client())
    change(pod)
    before = copy.deepcopy(pod)
    with pytest.raises(RequestError) as refused:
        _inject(pod)
    assert message in str(refused.value) and 'container "main"' in str(refused.value)
    assert pod == before


# -- idempotence ------------------------------------------------------------------------------

def _busy_pod() -> dict:
    return make_pod(_client("a", env=[{"name": "LD_PRELOAD", "value": "/opt/tracer.so"},
                                      {"name": "LUPINE_SERVER", "value": "stale:1"}]),
                    _client("b", memory="4000"), container("sidecar"),
                    init=[container("setup"), _client("warmup", memory="1000")])


def test_applying_twice_changes_nothing_the_second_time():
    pod = _busy_pod()
    for group, count in (("initContainers", 2), ("containers", 3)):
        for i in range(count):
            _inject(pod, i, group=group)
    once = copy.deepcopy(pod)
    for group, count in (("initContainers", 3), ("containers", 3)):
        for i in range(count):
            _inject(pod, i, group=group)
    assert pod == once
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [LIB_NAME, "setup", "warmup"]
    assert _env(pod["spec"]["containers"][1])["CUDA_DEVICE_MEMORY_LIMIT"] == "4000m"
    assert _env(pod["spec"]["initContainers"][2])["CUDA_DEVICE_MEMORY_LIMIT"] == "1000m"
    assert len(pod["spec"]["volumes"]) == 1


def test_a_second_pass_over_a_pod_the_api_server_defaulted_changes_nothing():
    """The API server defaults what a webhook added (pull policy, termination message) before a
    reinvocation shows the pod again: those fields must not read as a difference."""
    pod = make_pod(_client())
    _inject(pod)
    copier = pod["spec"]["initContainers"][0]
    copier.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log",
                  terminationMessagePolicy="File", resources={})
    defaulted = copy.deepcopy(pod)
    _inject(pod)
    assert pod == defaulted


# -- through the webhook's review --------------------------------------------------------------

class _RemoteOnly(DeviceVendor):
    """A family whose whole admission step is the injection (how the RemoteGPU family wires it)."""
    vendor_key = "RemoteGPU"
    count_resource_name = COUNT

    def __init__(self) -> None:
        self.seen: list[str] = []

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        self.seen.append(container["name"])
        return inject(container, pod, count_resource=COUNT, memory_resource=MEMORY, lib_image=LIB_IMAGE)


def test_the_webhook_patch_delivers_the_library_first_and_a_second_review_patches_nothing():
    """An init container asking for remote GPUs: the webhook walks the init containers while the
    injection puts the copy step in front of them; each container is mutated exactly once."""
    family = _RemoteOnly()
    pod = make_pod(_client("main"), init=[container("setup"), _client("warmup", memory="1000")])
    first, mutated = admit(copy.deepcopy(pod), vendors={"RemoteGPU": family})
    assert first["allowed"] and "patch" in first, first
    assert family.seen == ["setup", "warmup", "main"]
    spec = mutated["spec"]
    assert spec["schedulerName"] == "hami-scheduler"
    assert [c["name"] for c in spec["initContainers"]] == [LIB_NAME, "setup", "warmup"]
    assert _env(spec["initContainers"][2])["LD_PRELOAD"] == LIB_FILE
    assert _env(spec["containers"][0])["CUDA_DEVICE_MEMORY_LIMIT"] == "20000m"
    second, again = admit(copy.deepcopy(mutated), vendors={"RemoteGPU": _RemoteOnly()})
    assert second["allowed"] and "patch" not in second, second
    assert again == mutated


def test_the_webhook_denies_a_pod_whose_preload_comes_from_a_source():
    source = {"name": "LD_PRELOAD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    answer, _ = admit(make_pod(_client(env=[source])), vendors={"RemoteGPU": _RemoteOnly()})
    assert not answer["allowed"]
    assert answer["status"]["message"].startswith('container "main" takes LD_PRELOAD from a source')
