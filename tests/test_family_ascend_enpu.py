"""Ascend's vNPU modes after HAMi v2.10: template mode (#2970/#2975), the hami-core core budget
(#2952), ENPU, the third soft split (#3110), the 910C super-pod gate (#2853) and
``vnpuDeviceSplitCount`` (#3203).

The mode rules are checked where they live (config, webhook, the device selector, the chooser
over a real usage cache) and end to end against the in-repo API server: an ENPU pod lands only on
an ENPU node, and never on an NPU (a DIE) beside a hami-core pod, nor the reverse.
"""
from __future__ import annotations

import orjson
import pytest

from hami_py.cache.usage import UsageCache
from hami_py.config import ConfigError, DeviceConfig, parse_device_config
from hami_py.devices.ascend import build_family, parse_vnpus
from hami_py.devices.ascend.modes import NodeModes, normalize_policy, pod_policy
from hami_py.devices.base import ChoiceAsk, ContainerRequest, NodeView, RequestError
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.embedded import embedded_options
from hami_py.reasons import MODE_NOT_FIT, OK
from tests.conftest import assert_books_balance, place, register_nodes, wait_until
from tests.test_family_ascend import ON, _allocated, npu_node, npu_pod, npu_registration, npu_uuid, vendor
from tests.test_webhook import admit, container, make_pod

ENPU = {"huawei.com/vnpu-mode": "enpu"}
CORE = {"huawei.com/vnpu-mode": "hami-core"}
TEMPLATE = {"huawei.com/vnpu-mode": "template"}


def node_annotations(core: bool | None, enpu: bool | None) -> dict:
    out = {}
    if core is not None:
        out["hami-vnpu-core"] = "true" if core else "false"
    if enpu is not None:
        out["hami.io/enpu"] = "true" if enpu else "false"
    return out


def modes_node(name: str, *, core: bool, enpu: bool, npus: int = 2, devcore: int | None = None) -> dict:
    """A 910B3 node whose plugin runs hami-core and/or ENPU (``devcore``: what it registers)."""
    devices = npu_registration(name, "Ascend910B3", npus, hami_core=core)
    if devcore is not None:
        for dev in devices:
            dev["devcore"] = devcore
    node = npu_node(name, registrations={"Ascend910B3": devices}, annotations=node_annotations(core, enpu),
                    allocatable={"huawei.com/Ascend910B3": str(npus * 4)})
    node["metadata"]["annotations"]["hami.io/node-handshake-Ascend910B3"] = "Reported_2026.01.01 00:00:00"
    return node


# ---------------------------------------------------------------------------------------------
# config: hamiVnpuMode, enpuPolicy, vnpuDeviceSplitCount
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, mode", [
    ("{}", "template"),
    ("hamiVnpuMode: ''", "template"),
    ("hamiVnpuMode: template", "template"),
    ("hamiVnpuMode: hami-core", "hami-core"),
    ("hamiVnpuMode: hamiCore", "hami-core"),
    ("hamiVnpuMode: enpu", "enpu"),
    ("hamiVnpuMode: ' ENPU '", "enpu"),
    ("hamiVnpuCore: true", "hami-core"),
    ("hamiVnpuCore: false", "template"),
    ("hamiVnpuMode: null\nhamiVnpuCore: true", "hami-core"),
    ("hamiVnpuMode: template\nhamiVnpuCore: true", "template"),
    ("hamiVnpuMode: enpu\nhamiVnpuCore: true", "enpu"),
    ("hamiVnpuMode: hamiCore\nhamiVnpuCore: false", "hami-core"),
])
def test_the_default_mode_is_read_as_upstream_reads_it(text, mode):
    """Upstream's TestVNPUModeConfig table; the default answers for nodes that say nothing."""
    body = "vnpus: {}" if text == "{}" else "vnpus:\n  " + text.replace("\n", "\n  ")
    config = parse_device_config(f"nvidia:\n  resourceCountName: nvidia.com/gpu\n{body}\n", "cfg.yaml")
    vnpus = parse_vnpus(config.section("vnpus"))
    assert vnpus.mode == mode
    v = vendor()
    v.mode = vnpus.mode
    assert v.node_modes({}) == NodeModes(hami_core=mode == "hami-core", enpu=mode == "enpu")
    for core in (True, False):
        for enpu in (True, False):
            assert v.node_modes(node_annotations(core, enpu)) == NodeModes(core, enpu)


@pytest.mark.parametrize("value, shown", [("enup", '"enup"'), ("false", '"false"'), ("invalid", '"invalid"'),
                                          ("hami_core", '"hami_core"')])
def test_an_unknown_mode_stops_the_scheduler_whether_ascend_is_on_or_not(value, shown):
    config = DeviceConfig(sections={"vnpus": {"hamiVnpuMode": value, "hamiVnpuCore": True, "configs": []}})
    message = ("device config: vnpus.hamiVnpuMode: must be template, hami-core (or hamiCore), "
               f"or enpu, got {shown}")
    for switches in (ON, FamilySwitches()):
        with pytest.raises(ConfigError) as err:
            build_family(config, switches)
        assert str(err.value) == message
    with pytest.raises(ConfigError, match="vnpus.hamiVnpuMode: expected a string, got list"):
        build_family(DeviceConfig(sections={"vnpus": {"hamiVnpuMode": ["enpu"]}}), ON)


def test_the_family_gets_the_mode_and_the_policy_as_written():
    shipped = parse_vnpus(DeviceConfig.default().section("vnpus"))
    assert (shipped.mode, shipped.enpu_policy, shipped.vnpu_device_split_count) == ("template", "", 10)
    section = {**DeviceConfig.default().sections["vnpus"], "hamiVnpuMode": "ENPU", "enpuPolicy": " Fixed "}
    vendors = build_family(DeviceConfig(sections={"vnpus": section}), ON)
    assert {(v.mode, v.enpu_policy) for v in vendors} == {("enpu", " Fixed ")}


@pytest.mark.parametrize("value, ok", [(None, 10), (1, 1), (16, 16), (0, None), (-3, None)])
def test_vnpu_device_split_count_is_a_positive_integer(value, ok):
    section = {} if value is None else {"vnpuDeviceSplitCount": value}
    if ok is not None:
        assert parse_vnpus(DeviceConfig(sections={"vnpus": section}).section("vnpus")).vnpu_device_split_count == ok
        return
    with pytest.raises(ConfigError) as err:
        build_family(DeviceConfig(sections={"vnpus": section}), FamilySwitches())
    assert str(err.value) == ("device config: vnpus.vnpuDeviceSplitCount: must be a positive integer "
                              f"(hami-core slots per NPU), got {value}")
    with pytest.raises(ConfigError, match="vnpuDeviceSplitCount: expected an integer"):
        build_family(DeviceConfig(sections={"vnpus": {"vnpuDeviceSplitCount": "ten"}}), FamilySwitches())


# ---------------------------------------------------------------------------------------------
# ENPU policies
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, policy", [
    ("1", "fixed-share"), ("fixed", "fixed-share"), (" FIXED_SHARE ", "fixed-share"), ("fixed-share", "fixed-share"),
    ("2", "elastic"), (" ELASTIC ", "elastic"),
    ("3", "best-effort"), ("best_effort", "best-effort"), ("BestEffort", "best-effort"), ("best-effort", "best-effort"),
    (" \t ", ""), ("elatsic", None), ("4", None), ("invalid", None),
])
def test_policy_spellings(raw, policy):
    assert normalize_policy(raw) == policy


def test_policy_sources_in_order():
    """Annotation, upstream's softShareDev annotation, its label, the config's default, elastic."""
    key = "huawei.com/scheduler.softShareDev.policy"
    assert pod_policy({"huawei.com/enpu-policy": "fixed", key: "2"}, {key: "3"}, "").policy == "fixed-share"
    assert pod_policy({key: "3"}, {key: "1"}, "fixed").policy == "best-effort"
    assert pod_policy({}, {key: "2"}, "fixed").policy == "elastic"
    assert pod_policy({"huawei.com/enpu-policy": " "}, {}, "best-effort").policy == "best-effort"
    assert pod_policy({}, None, " \t ").policy == "elastic"
    bad = pod_policy({}, {key: "invalid"}, "elastic")
    assert (bad.policy, bad.source, bad.raw) == (None, f"label {key}", "invalid")
    # A valid pod policy wins over an invalid default; a blank one does not hide it.
    assert pod_policy({"huawei.com/enpu-policy": " FIXED_SHARE "}, {}, "invalid").policy == "fixed-share"
    assert pod_policy({"huawei.com/enpu-policy": " "}, {}, "invalid").policy is None


# ---------------------------------------------------------------------------------------------
# webhook
# ---------------------------------------------------------------------------------------------

def enpu_admit(v, *, limits: dict | None = None, requests: dict | None = None, annotations: dict | None = None,
               labels: dict | None = None):
    """(asks for NPUs, container, pod) after the vendor's webhook, for an ENPU pod."""
    resources = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    ctr = {"name": "main", "resources": resources}
    meta = {"name": "p", "annotations": {**ENPU, **(annotations or {})}}
    if labels:
        meta["labels"] = labels
    pod = {"metadata": meta, "spec": {"containers": [ctr]}}
    return v.mutate_admission(ctr, pod), ctr, pod


def test_enpu_admission_keeps_memory_writes_one_npu_and_the_policy():
    v = vendor("Ascend910C", runtime_class_name="ascend")           # super pod: ENPU takes no module
    asks, ctr, pod = enpu_admit(v, limits={"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "20480"})
    assert asks
    for part in ("limits", "requests"):
        assert ctr["resources"][part] == {"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "20480"}
    assert pod["metadata"]["annotations"]["huawei.com/enpu-policy"] == "elastic"
    assert pod["spec"]["runtimeClassName"] == "ascend"
    # A count in requests only is one (ENPU reads limits, then requests); without memory, the NPU's.
    asks, ctr, _ = enpu_admit(v, requests={"huawei.com/Ascend910C": "1"})
    assert asks
    assert ctr["resources"]["limits"] == {"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "65536"}
    # The memory limit wins over the request; the aliases of enpu count.
    _, ctr, _ = enpu_admit(v, requests={"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "16384"},
                           limits={"huawei.com/Ascend910C-memory": "20480"},
                           annotations={"huawei.com/vnpu-mode": "vcann-rt"})
    assert ctr["resources"]["requests"]["huawei.com/Ascend910C-memory"] == "20480"
    # No count at all: not an NPU container, nothing written.
    asks, ctr, pod = enpu_admit(v, limits={"cpu": "1"})
    assert not asks and ctr["resources"] == {"limits": {"cpu": "1"}} and "huawei.com/enpu-policy" not in \
        pod["metadata"]["annotations"]


@pytest.mark.parametrize("limits, requests, message", [
    ({"huawei.com/Ascend910C": "2"}, None, "ENPU mode supports exactly one Ascend device per container, got 2"),
    ({"huawei.com/Ascend910C": "3"}, None, "ENPU mode supports exactly one Ascend device per container, got 3"),
    (None, {"huawei.com/Ascend910C": "0"}, "ENPU mode supports exactly one Ascend device per container, got 0"),
    ({"huawei.com/Ascend910C": "2"}, {"huawei.com/Ascend910C": "1"},
     "ENPU mode supports exactly one Ascend device per container, got 2"),
])
def test_enpu_containers_take_exactly_one_npu(limits, requests, message):
    v = vendor("Ascend910C")
    with pytest.raises(RequestError) as err:
        enpu_admit(v, limits=limits, requests=requests)
    assert str(err.value) == message


def test_an_invalid_enpu_policy_is_refused_and_other_modes_keep_theirs():
    v = vendor()
    with pytest.raises(RequestError) as err:
        enpu_admit(v, limits={"huawei.com/Ascend910B3": "1"}, labels={"huawei.com/scheduler.softShareDev.policy": "x"})
    assert str(err.value) == ('invalid ENPU scheduling policy "x" in label huawei.com/scheduler.softShareDev.policy: '
                              "must be fixed-share (1), elastic (2) or best-effort (3)")
    v.enpu_policy = "elatsic"
    with pytest.raises(RequestError, match=r'^invalid ENPU scheduling policy "elatsic" in vnpus.enpuPolicy'):
        enpu_admit(v, limits={"huawei.com/Ascend910B3": "1"})
    _, _, pod = enpu_admit(v, limits={"huawei.com/Ascend910B3": "1"}, annotations={"huawei.com/enpu-policy": "3"})
    assert pod["metadata"]["annotations"]["huawei.com/enpu-policy"] == "best-effort"
    # A hami-core or template pod is not an ENPU one: its policy annotation is none of our business.
    # (A pod naming no mode keeps its memory as asked: its node rounds it, HAMi #3107.)
    for mode, memory in (("hami-core", "20480"), ("template", "32768"), (None, "20480")):
        ann = {"huawei.com/enpu-policy": "invalid-ENPU-only-override"}
        if mode:
            ann["huawei.com/vnpu-mode"] = mode
        ctr = {"name": "main", "resources": {"limits": {"huawei.com/Ascend910B3": "1",
                                                        "huawei.com/Ascend910B3-memory": "20480"}}}
        pod = {"metadata": {"annotations": ann}, "spec": {"containers": [ctr]}}
        assert v.mutate_admission(ctr, pod)
        assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == memory
        assert pod["metadata"]["annotations"]["huawei.com/enpu-policy"] == "invalid-ENPU-only-override"


def test_webhook_review_patches_the_enpu_policy_and_denies_two_npus():
    vendors = build_vendors(DeviceConfig.default(), ON)
    pod = make_pod(container(limits={"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "10000",
                                     "huawei.com/Ascend910B3-core": "30"}))
    pod["metadata"]["annotations"] = {**ENPU, "huawei.com/scheduler.softShareDev.policy": "1"}
    response, patched = admit(pod, vendors=vendors)
    assert response["allowed"]
    assert patched["metadata"]["annotations"]["huawei.com/enpu-policy"] == "fixed-share"
    assert patched["spec"]["containers"][0]["resources"]["requests"]["huawei.com/Ascend910B3-memory"] == "10000"
    pod = make_pod(container(limits={"huawei.com/Ascend910B3": "2"}))
    pod["metadata"]["annotations"] = dict(ENPU)
    response, _ = admit(pod, vendors=vendors)
    assert not response["allowed"]
    assert response["status"]["message"] == "ENPU mode supports exactly one Ascend device per container, got 2"
    # A mode-less pod asking for cores is admitted as a hami-core one.
    pod = make_pod(container(limits={"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-core": "30"}))
    response, patched = admit(pod, vendors=vendors)
    assert response["allowed"] and patched["metadata"]["annotations"]["huawei.com/vnpu-mode"] == "hami-core"


def test_an_enpu_container_naming_no_cores_is_charged_the_whole_npus_compute():
    v = vendor()
    limits = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "20480"}
    ctr = {"name": "main", "resources": {"limits": limits}}
    assert v.container_request(ctr, pod_annotations=ENPU) == ContainerRequest("Ascend910B3", 1, 20480, 0, 100)
    assert v.container_request(ctr, pod_annotations=CORE).coresreq == 0
    ctr["resources"]["limits"]["huawei.com/Ascend910B3-core"] = "20"
    assert v.container_request(ctr, pod_annotations=ENPU).coresreq == 20


# ---------------------------------------------------------------------------------------------
# node-wide rules (the device selector) and the core budget
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pod, core, enpu, default, fits", [
    # upstream's TestENPUNodeOverridesAndDefaultCoreAccounting rows
    (ENPU, False, True, "template", True),
    (ENPU, None, False, "enpu", False),              # the node turns the default off
    (ENPU, None, None, "enpu", True),                # the default answers for a silent node
    (ENPU, None, None, "template", False),
    ({}, True, False, "template", True),
    ({}, False, True, "template", False),             # ENPU-only: the pod must say enpu
    ({"huawei.com/vnpu-mode": "typo"}, False, True, "template", False),
    (CORE, False, True, "template", False),
    ({"huawei.com/vnpu-mode": "vcann-rt"}, False, True, "template", True),
    ({"huawei.com/vnpu-mode": "ubs-virt"}, False, True, "template", True),
    ({"huawei.com/vnpu-mode": "typo"}, False, False, "template", True),
    ({"huawei.com/vnpu-mode": "typo"}, True, False, "template", True),
    (CORE, True, True, "template", True),
    (TEMPLATE, True, True, "template", False),
    (TEMPLATE, False, True, "template", False),
    (TEMPLATE, True, False, "template", False),      # #2970: template never on hami-core
    (TEMPLATE, False, False, "template", True),
    ({**ENPU, "huawei.com/enpu-policy": "invalid"}, True, True, "template", False),
])
def test_which_nodes_a_mode_may_use(pod, core, enpu, default, fits):
    v = vendor()
    v.mode = default
    annotations = node_annotations(core, enpu)
    (dev,) = v.parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910B3": orjson.dumps(
        npu_registration("n", "Ascend910B3", 1)).decode(), **annotations}))
    gate = v.device_selector(pod, annotations)
    assert (OK if gate is None else gate(dev)) == (OK if fits else MODE_NOT_FIT)


def test_an_invalid_default_policy_refuses_enpu_pods_only():
    v = vendor()
    v.enpu_policy = " invalid "
    annotations = node_annotations(False, True)
    dev = v.parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910B3": orjson.dumps(
        npu_registration("n", "Ascend910B3", 1)).decode(), **annotations}))[0]
    assert v.device_selector(ENPU, annotations)(dev) == MODE_NOT_FIT
    assert v.device_selector({**ENPU, "huawei.com/enpu-policy": "fixed"}, annotations)(dev) == OK
    assert v.device_selector(CORE, node_annotations(True, False))(dev) == OK


@pytest.mark.parametrize("core, enpu, registered, budget, mode", [
    (True, False, 20, 100, "hami-core"),        # an older plugin writes the AI cores: one NPU = 100 %
    (True, False, 100, 100, "hami-core"),
    (True, False, 250, 250, "hami-core"),       # a deliberate oversell is kept
    (False, True, 24, 100, "enpu"),
    (True, True, 150, 150, "hami-core+enpu"),
    (False, False, 20, 20, ""),                 # template: the hardware's AI cores, as registered
    (False, False, 250, 250, ""),
])
def test_soft_split_nodes_count_cores_as_a_percentage_budget(core, enpu, registered, budget, mode):
    devices = npu_registration("n", "Ascend910B3", 2)
    for dev in devices:
        dev["devcore"] = registered
    node = NodeView.of({"hami.io/node-register-Ascend910B3": orjson.dumps(devices).decode(),
                        **node_annotations(core, enpu)})
    assert {(d.devcore, d.mode) for d in vendor().parse_node_devices(node)} == {(budget, mode)}


# ---------------------------------------------------------------------------------------------
# the chooser over a real usage cache
# ---------------------------------------------------------------------------------------------

def test_enpu_and_hami_core_never_share_an_npu_in_the_chooser():
    """Upstream's TestENPUFitBackendIsolation and TestENPUFitIgnoresMissingPodInfo, over the books:
    NPU 0 holds a pod of one mode, NPU 1 is free; the incoming pod's choice."""
    vendors = build_vendors(DeviceConfig.default(), ON)
    v = vendors["Ascend910B3"]

    def choice(existing: dict, incoming: dict, free: bool = True):
        cache = UsageCache(vendors)
        cache.upsert_node(modes_node("dual", core=True, enpu=True))
        holder = npu_pod("holder", memory=20480, cores=20, annotations=existing)
        holder["metadata"]["uid"] = "uid-holder"
        holder["metadata"]["annotations"].update({
            "hami.io/vgpu-node": "dual", "hami.io/bind-phase": "success",
            "hami.io/Ascend910B3-devices-allocated": f"{npu_uuid('dual', 'Ascend910B3', 0)},Ascend910B3,20480,20:;"})
        holder["spec"]["nodeName"] = "dual"
        holder["status"]["phase"] = "Running"
        cache.on_pod_event("ADDED", holder)
        index = cache.node_index_of["dual"]
        choose = v.chooser(cache, ChoiceAsk(incoming, rows=(ContainerRequest("Ascend910B3", 1, 20480, 0, 20),)))
        return choose(index, [0, 1] if free else [0], 1)

    enpu = {**ENPU, "huawei.com/enpu-policy": "elastic"}
    assert choice({}, enpu) == ([1], 10.0)                       # a mode-less pod on hami-core is hami-core
    assert choice({}, enpu, free=False) == MODE_NOT_FIT
    assert choice(CORE, enpu, free=False) == MODE_NOT_FIT
    assert choice(enpu, {}, free=False) == MODE_NOT_FIT
    assert choice(enpu, CORE, free=False) == MODE_NOT_FIT
    assert choice(enpu, CORE) == ([1], 10.0)
    assert choice(enpu, enpu, free=False) == ([0], 10.0)        # same policy: they share
    assert choice({**ENPU, "huawei.com/enpu-policy": "fixed"}, {**ENPU, "huawei.com/enpu-policy": "1"},
                  free=False) == ([0], 10.0)
    assert choice({**ENPU, "huawei.com/enpu-policy": "fixed-share"}, enpu, free=False) == MODE_NOT_FIT
    assert choice(ENPU, enpu, free=False) == MODE_NOT_FIT         # an ENPU tenant with no recorded policy
    assert choice({**ENPU, "huawei.com/enpu-policy": "unknown"}, enpu, free=False) == MODE_NOT_FIT
    assert choice(CORE, CORE, free=False) == ([0], 10.0)
    assert choice({}, {}, free=False) == ([0], 10.0)


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scheduler_options():
    return embedded_options(enable_ascend=True)


def enpu_pod(name: str, *, memory: int = 20480, cores: int | None = 20, policy: str | None = None,
             annotations: dict | None = None) -> dict:
    ann = {**ENPU, **(annotations or {})}
    if policy is not None:
        ann["huawei.com/enpu-policy"] = policy
    return npu_pod(name, memory=memory, cores=cores, annotations=ann)


async def test_an_enpu_pod_lands_only_on_an_enpu_node_never_beside_a_hami_core_pod(api, app, extender):
    """The issue's done-when, through /filter and the books."""
    names = await register_nodes(api, app, npu_node("hard", {"Ascend910B3": 2}),
                                 modes_node("core", core=True, enpu=False), modes_node("dual", core=True, enpu=True),
                                 modes_node("enpu", core=False, enpu=True))
    dual0, dual1 = npu_uuid("dual", "Ascend910B3", 0), npu_uuid("dual", "Ascend910B3", 1)
    # ENPU pods: only ENPU nodes, whatever else is offered.
    _, result = await place(api, extender, enpu_pod("e-0", policy="elastic"), ["hard", "core"])
    assert result["FailedNodes"] == {"hard": "2/2 ModeNotFit", "core": "2/2 ModeNotFit"}
    # A hami-core pod on the dual node's NPU 0 ...
    _, result = await place(api, extender, npu_pod("c-1", memory=8192, cores=30, soft=True,
                                                   annotations={"hami.io/use-Ascend910B3-uuid": dual0}), ["dual"])
    assert result["NodeNames"] == ["dual"], result
    # ... keeps every ENPU pod on NPU 1, which fits several of one policy.
    for i in range(2):
        _, result = await place(api, extender, enpu_pod(f"e-{i + 1}", policy="elastic"), ["dual"])
        assert result["NodeNames"] == ["dual"], result
        assert _allocated(api, app, f"e-{i + 1}", "Ascend910B3")[1][0][0].uuid == dual1
    # NPU 0 only: refused, in upstream's words.
    _, result = await place(api, extender, enpu_pod("e-3", policy="elastic",
                                                    annotations={"hami.io/use-Ascend910B3-uuid": dual0}), ["dual"])
    assert result["FailedNodes"] == {"dual": "1/2 CardUuidMismatch, 1/2 ModeNotFit"}
    # The reverse: a hami-core pod (and a mode-less one, hami-core there) never joins the ENPU NPU.
    for name, ann in (("c-2", {"huawei.com/vnpu-mode": "hami-core"}), ("m-1", {})):
        _, result = await place(api, extender, npu_pod(name, memory=8192, annotations=ann), ["dual"])
        assert result["NodeNames"] == ["dual"], result
        assert _allocated(api, app, name, "Ascend910B3")[1][0][0].uuid == dual0
    # Another policy does not share the ENPU NPU; the ENPU-only node takes it.
    _, result = await place(api, extender, enpu_pod("e-4", policy="fixed-share"), ["dual", "enpu"])
    assert result["NodeNames"] == ["enpu"], result
    # The ENPU-only node refuses a pod that does not say enpu.
    _, result = await place(api, extender, npu_pod("m-2", memory=8192), ["enpu"])
    assert result["FailedNodes"] == {"enpu": "2/2 ModeNotFit"}
    ann, devices = _allocated(api, app, "e-4", "Ascend910B3")
    assert orjson.loads(ann["huawei.com/Ascend910B3"]) == [
        {"UUID": devices[0][0].uuid, "memory": 20480, "core": 20}]      # soft split: no template name
    assert_books_balance(app)


async def test_enpu_pods_without_cores_hold_their_npu_whole(api, app, extender):
    names = await register_nodes(api, app, modes_node("enpu", core=False, enpu=True, npus=1))
    _, result = await place(api, extender, enpu_pod("whole", cores=None, policy="elastic"), names)
    assert result["NodeNames"] == ["enpu"], result
    assert _allocated(api, app, "whole", "Ascend910B3")[1][0][0].usedcores == 100
    _, result = await place(api, extender, enpu_pod("more", policy="elastic"), names)
    assert result["FailedNodes"] == {"enpu": "1/1 CardInsufficientCore"}
    assert_books_balance(app)


async def test_a_deliberate_oversell_shares_cores_but_not_a_card_held_whole(api, app, extender):
    names = await register_nodes(api, app, modes_node("sold", core=True, enpu=False, npus=1, devcore=200))
    # A budget of 200: three pods of 60 cores share the NPU (180), a fourth does not fit.
    for i in range(3):
        _, result = await place(api, extender, npu_pod(f"s-{i}", memory=4096, cores=60, soft=True), names)
        assert result["NodeNames"] == ["sold"], result
    _, result = await place(api, extender, npu_pod("s-3", memory=4096, cores=60, soft=True), names)
    assert result["FailedNodes"] == {"sold": "1/1 CardInsufficientCore"}
    # A pod asking the whole NPU (100) needs it unused, oversold or not: 140 left is not enough.
    for i in (1, 2):
        api.delete("pods", f"s-{i}", namespace="default")
    await wait_until(lambda: app.cache.device_usage("sold")[0]["usedcores"] == 60, "two pods gone")
    _, result = await place(api, extender, npu_pod("whole", memory=4096, cores=100, soft=True), names)
    assert result["FailedNodes"] == {"sold": "1/1 ExclusiveDeviceAllocateConflict"}
    api.delete("pods", "s-0", namespace="default")
    await wait_until(lambda: app.cache.device_usage("sold")[0]["used"] == 0, "NPU free")
    _, result = await place(api, extender, npu_pod("whole-2", memory=4096, cores=100, soft=True), names)
    assert result["NodeNames"] == ["sold"], result
    # Held whole by one pod: not oversold, even with 100 of its 200 left.
    _, result = await place(api, extender, npu_pod("s-4", memory=4096, cores=10, soft=True), names)
    assert result["FailedNodes"] == {"sold": "1/1 CardInsufficientCore"}
    _, result = await place(api, extender, npu_pod("s-5", memory=4096, soft=True), names)
    assert result["FailedNodes"] == {"sold": "1/1 CardComputeUnitsExhausted"}
    assert_books_balance(app)


async def test_910c_without_super_pod_is_counted_npu_by_npu(api):
    """HAMi #2853: module pairs only behind the super-pod gate; an odd request fits elsewhere."""
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    config = DeviceConfig.default()
    for chip in config.sections["vnpus"]["configs"]:
        if chip["commonWord"] == "Ascend910C":
            chip["superPod"] = False
    async with running_scheduler(api, options=embedded_options(enable_ascend=True), device_config=config) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, npu_node("c-1", {"Ascend910C": 4}))
            _, result = await place(api, extender, npu_pod("three", "Ascend910C", count=3, memory=65536), names)
            assert result["NodeNames"] == ["c-1"], result
            assert len(_allocated(api, app, "three", "Ascend910C")[1][0]) == 3
            assert_books_balance(app)
        finally:
            await extender.close()


@pytest.mark.parametrize("mode, split, count, devcore, core_annotation, enpu_annotation", [
    ("template", None, 4, 20, "false", None),      # a slot per smallest template (16 GiB of 64)
    ("hami-core", None, 10, 100, "true", None),     # the chart's vnpuDeviceSplitCount
    ("hami-core", 7, 7, 100, "true", None),         # the node's own vDeviceCount wins
    ("enpu", None, 10, 100, "false", "true"),
])
def test_fake_nodes_register_as_the_plugin_in_the_configs_mode(mode, split, count, devcore, core_annotation,
                                                               enpu_annotation):
    from hami_py.fakeapi.families import BY_KEY
    config = DeviceConfig.default()
    config.sections["vnpus"]["hamiVnpuMode"] = mode
    node = BY_KEY["ascend910b3"].node("n", devices=2, config=config, split=split)
    annotations = node["metadata"]["annotations"]
    registered = orjson.loads(annotations["hami.io/node-register-Ascend910B3"])
    assert {(d["count"], d["devcore"]) for d in registered} == {(count, devcore)}
    assert annotations["hami-vnpu-core"] == core_annotation
    assert annotations.get("hami.io/enpu") == enpu_annotation
