"""AWS Neuron: devices and cores from the node's capacity, core masks, device windows, upstream's
annotations, the webhook."""
from __future__ import annotations

import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import awsneuron
from hami_py.devices.awsneuron import (
    AWSNeuronConfig, NeuronAsk, allocate_core_mask, choose_window, device_count, split_cores,
)
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, NodeView, RequestError,
)
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.families import BY_KEY
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import (
    container as ctr,
    assert_books_balance, bind_placed, create_quota, decision_annotations, device_pod, place, register_nodes,
    wait_until,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
NEURON = VENDORS["AWSNeuron"]
COUNT, CORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"


def view(devices, cores, *, instance="inf2.xlarge", name="n1"):
    labels = {"node.kubernetes.io/instance-type": instance} if instance is not None else {}
    capacity = {COUNT: devices} if cores is None else {COUNT: devices, CORE: cores}
    return NodeView.of({}, name=name, labels=labels, capacity=capacity)


# -- inventory ----------------------------------------------------------------------------------------

def test_devices_and_their_core_masks_come_from_the_capacity_and_the_instance_type():
    # upstream's Test_GetNodeDevices: one device, two cores.
    [dev] = NEURON.parse_node_devices(view("1", "2", instance="inf2", name="test"))
    assert (dev.id, dev.index, dev.count, dev.devmem, dev.devcore, dev.type, dev.health, dev.custom) == \
        ("test-AWSNeuron-0", 0, 2, 0, 3, "AWSNeuron", True, {"AWSNodeType": "inf2"})
    devices = NEURON.parse_node_devices(view("12", "24", instance="inf2.48xlarge"))
    assert [d.id for d in devices][-1] == "n1-AWSNeuron-11" and {d.devcore for d in devices} == {3}
    # Cores per device are the node's own (upstream v2.10 kept the first node's for every node):
    # an Inferentia1 device has 4, all addressable (HAMi v2.11, #3082).
    [one] = NEURON.parse_node_devices(view("1", "4", instance="inf1.xlarge"))
    assert (one.count, one.devcore) == (4, 15)
    # More than 4 cores a device: 4 addressable (the mask), every core a slot.
    [big] = NEURON.parse_node_devices(view("1", "8", instance="trn2.48xlarge"))
    assert (big.count, big.devcore) == (8, 15)
    # No instance-type label: an empty type (aligned windows only).
    assert NEURON.parse_node_devices(view("1", "2", instance=None))[0].custom == {"AWSNodeType": ""}
    assert NEURON.parse_node_devices(view("0", "0")) == []
    assert NEURON.parse_node_devices(NodeView.of({}, name="n1", capacity={"cpu": "8"})) == []
    assert NEURON.registration_source() == "aws.amazon.com/neuron capacity"
    assert NEURON.kernel_flags == FLAG_CHARGE | FLAG_CHOOSE and not NEURON.uses_node_lock


@pytest.mark.parametrize("devices, cores, message", [
    ("two", "4", "aws.amazon.com/neuron 'two' is not a whole number of devices"),
    ("2", "x", "aws.amazon.com/neuroncore 'x' is not a whole number of cores"),
    # HAMi v2.11's words (09-19): cores per device are derived per node and must divide evenly.
    ("2", "1", "aws.amazon.com/neuroncore capacity 1 is not divisible by aws.amazon.com/neuron capacity 2"),
    ("4", "10", "aws.amazon.com/neuroncore capacity 10 is not divisible by aws.amazon.com/neuron capacity 4"),
    ("2", "0", "aws.amazon.com/neuroncore '0' must be a positive number of cores"),
    ("2", None, "aws.amazon.com/neuroncore is missing: aws.amazon.com/neuron '2' needs its cores"),
    ("1", str(2**31), "cores per AWS Neuron device 2147483648 exceeds the maximum of 2147483647"),
    ("5000", "10000", "aws.amazon.com/neuron '5000' is out of range: must be between 0 and 1024"),
])
def test_a_garbled_capacity_is_refused_precisely(devices, cores, message):
    with pytest.raises(DeviceDecodeError) as err:
        NEURON.parse_node_devices(view(devices, cores))
    assert str(err.value) == message


# -- requests and webhook ------------------------------------------------------------------------------

def test_requests_are_devices_or_cores_sized_by_each_nodes_cores_a_device():
    assert NEURON.container_request(ctr({COUNT: "1"}, {COUNT: "1"}), pod_annotations={}) == \
        ContainerRequest("AWSNeuron", 1, 0, 0, 2)
    assert NEURON.container_request(ctr(requests={COUNT: "2"}), pod_annotations={}).nums == 2
    # A core request's row asks one device a core (the most a node of one core a device gives);
    # each node's charger sizes it by that node's cores a device. Odd counts are not refused
    # (HAMi v2.11 dropped splitCoreRequest): the last device gets what is left.
    for cores, nums, each in (("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("6", 6, 4), ("7", 7, 4)):
        assert NEURON.container_request(ctr({CORE: cores}), pod_annotations={}) == \
            ContainerRequest("AWSNeuron", nums, 0, 0, each)
    assert [split_cores(k, 2) for k in (1, 2, 3, 4, 5)] == [(1,), (2,), (2, 1), (2, 2), (2, 2, 1)]
    assert [split_cores(k, 4) for k in (1, 3, 4, 5, 9)] == [(1,), (3,), (4,), (4, 1), (4, 4, 1)]
    for per_device in (1, 2, 3, 4):
        for k in range(1, 12):      # what a request's devices get is the split, computed per device
            ask = NeuronAsk(nums=k, cores=k, whole=False)
            parts = tuple(ask.part(i, per_device) for i in range(device_count(k, per_device)))
            assert parts == split_cores(k, per_device) and sum(parts) == k
            assert ask.smallest_part(per_device) == min(parts)
    # A request of billions of cores is read without listing its devices' parts (that list
    # would take gigabytes: one pod could exhaust the scheduler's memory); its row asks one device
    # more than any node registers, so every node is short of devices for it, as upstream says.
    huge = NEURON.container_request(ctr({CORE: "4000000001"}), pod_annotations={})
    assert (huge.nums, huge.coresreq) == (awsneuron.ROW_DEVICES, 4)
    assert NeuronAsk(huge.nums, 4000000001, False).smallest_part(4) == 1
    assert NEURON.container_request(ctr({"cpu": "1"}), pod_annotations={}) is None
    # The count wins over cores, as upstream reads them.
    assert NEURON.container_request(ctr({COUNT: "1", CORE: "1"}), pod_annotations={}).coresreq == 2


@pytest.mark.parametrize("limits, message", [
    ({CORE: "0"}, 'aws.amazon.com/neuroncore "0" must be greater than 0'),
    ({CORE: "-2"}, 'aws.amazon.com/neuroncore "-2" must be greater than 0'),
    ({COUNT: "1.5"}, 'aws.amazon.com/neuron "1.5" must be an integer'),
    ({COUNT: str(2**31)}, 'aws.amazon.com/neuron "2147483648" must not exceed 2147483647'),
    # Up to 4 cores a device now (#3082): 4 x MaxInt32 cores.
    ({CORE: str(2**33)}, 'aws.amazon.com/neuroncore "8589934592" must not exceed 8589934588'),
])
def test_a_malformed_request_is_refused_naming_container_and_value(limits, message):
    with pytest.raises(RequestError) as err:
        NEURON.container_request(ctr(limits), pod_annotations={})
    assert str(err.value) == f'container "main": {message}'


def test_the_webhook_validates_with_upstreams_messages():
    assert NEURON.mutate_admission(ctr({COUNT: "2"}), {}) is True
    assert NEURON.mutate_admission(ctr(requests={COUNT: "2"}), {}) is True
    assert NEURON.mutate_admission(ctr({CORE: "2"}), {}) is True
    assert NEURON.mutate_admission(ctr({}), {}) is False
    assert NEURON.mutate_admission(ctr({CORE: "3"}), {}) is True
    for limits, message in (({COUNT: str(2**31)}, "aws.amazon.com/neuron must not exceed 2147483647"),
                            ({CORE: "0"}, "aws.amazon.com/neuroncore must be greater than 0"),
                            ({CORE: str(2**33)}, "aws.amazon.com/neuroncore must not exceed 8589934588")):
        with pytest.raises(RequestError) as err:
            NEURON.mutate_admission(ctr(requests=limits), {})
        assert str(err.value) == message
    response, patched = admit(make_pod(container(limits={CORE: "1"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    response, _ = admit(make_pod(container(limits={CORE: "0"})))
    assert not response["allowed"]
    assert response["status"]["message"] == "aws.amazon.com/neuroncore must be greater than 0"


def test_config_section_and_quota_names():
    assert AWSNeuronConfig.from_section(Section.of("awsneuron", None)) == AWSNeuronConfig("", "")
    with pytest.raises(ConfigError) as err:
        AWSNeuronConfig.from_section(Section.of("awsneuron", {"resourceCoreName": 5}))
    assert str(err.value) == "device config: awsneuron.resourceCoreName: expected a string, got integer \"5\""
    assert NEURON.resource_names() == [COUNT, CORE]
    assert NEURON.quota_resources() == ("", CORE, 1)
    assert awsneuron.build_family(DeviceConfig(sections={}), None)[0].resource_names() == []


# -- the rules ------------------------------------------------------------------------------------------

def test_core_masks_are_the_lowest_contiguous_free_run():
    # Two-core devices (mask 3): upstream's old rule, unchanged.
    assert allocate_core_mask(0, 3, 2) == 3 and allocate_core_mask(0, 3, 1) == 1
    assert allocate_core_mask(1, 3, 1) == 2 and allocate_core_mask(2, 3, 1) == 1
    assert allocate_core_mask(1, 3, 2) is None and allocate_core_mask(3, 3, 1) is None
    # Four-core devices (Inferentia1, mask 15): any contiguous run, never scattered cores.
    assert allocate_core_mask(0, 15, 4) == 15 and allocate_core_mask(0, 15, 3) == 7
    assert allocate_core_mask(1, 15, 2) == 6 and allocate_core_mask(1, 15, 3) == 14
    assert allocate_core_mask(0b0101, 15, 2) is None          # cores 1 and 3 free, not adjacent
    assert allocate_core_mask(0b0101, 15, 1) == 2
    assert allocate_core_mask(0, 15, 5) is None and allocate_core_mask(0, 15, 0) is None


def test_device_windows_follow_the_instance_type():
    # upstream's Test_graphSelect
    assert choose_window(set(range(16)), 16, 16, "inf2") == 0
    assert choose_window(set(range(16)) - {7, 13}, 16, 8, "trn") is None
    assert choose_window(set(range(16)) - {7}, 16, 8, "trn") == 8
    assert choose_window(set(range(16)) - {5, 14}, 16, 8, "inf") == 6
    assert choose_window(set(range(16)), 16, 3, "trn1.32xlarge") is None      # only 1, 4, 8, 16 off inf
    assert choose_window(set(range(16)) - {0}, 16, 3, "inf2.48xlarge") == 1
    assert choose_window(set(range(16)) - {1}, 16, 4, "trn1.32xlarge") == 4   # aligned on 4


def test_annotations_are_upstreams():
    """upstream's Test_PatchAnnotations: device indexes for a device count in limits, core
    indexes (cores per device x index, +1 for the second core) otherwise."""
    def dev(uuid, index, mask, count):
        return ContainerDevice(uuid, "AWSNeuron", 0, mask,
                               custom={"index": index, "coresPerDevice": 2, "countInLimits": count})
    out = NEURON.encode_allocation([[dev("test1", 0, 3, True), dev("test2", 1, 3, True)]], node="n1",
                                   now=1700000000.25)
    assert out == {"hami.io/aws-neuron-devices-allocated": "test1,AWSNeuron,0,3:test2,AWSNeuron,0,3:;",
                   "AWS_NEURON_IDS": "0,1", "NEURON_ALLOC_TIME": "1700000000250000000",
                   "NEURON_ALLOCATED": "false", "aws.amazon.com/predicate-node": "n1"}
    out = NEURON.encode_allocation([[dev("test1", 0, 3, False)]], node="n1")
    assert (out["AWS_NEURON_IDS"], out["NEURON_RESOURCE_TYPE"]) == ("0,1", CORE)
    out = NEURON.encode_allocation([[dev("d", 3, 2, False)], [], [dev("e", 1, 1, False)]], node="n1")
    assert out["AWS_NEURON_IDS"] == "7,2"            # accumulated over the containers
    # Four cores a device (inf1): every bit of the mask is a core index, 4 x the device index up.
    four = ContainerDevice("f", "AWSNeuron", 0, 0b1110, custom={"index": 2, "coresPerDevice": 4, "countInLimits": False})
    assert NEURON.encode_allocation([[four]], node="n1")["AWS_NEURON_IDS"] == "9,10,11"
    # Data without the node's geometry is read with upstream's old 2 cores a device.
    old = ContainerDevice("g", "AWSNeuron", 0, 2, custom={"index": 3, "countInLimits": False})
    assert NEURON.encode_allocation([[old]], node="n1")["AWS_NEURON_IDS"] == "7"
    assert out["hami.io/aws-neuron-devices-allocated"] == "d,AWSNeuron,0,2:;;e,AWSNeuron,0,1:;"
    assert set(out) <= set(NEURON.decision_annotations())
    assert NEURON.decode_allocation(out)[0][0] == ContainerDevice("d", "AWSNeuron", 0, 2)
    assert NEURON.encode_allocation([[], []]) == {}


# -- end to end ---------------------------------------------------------------------------------------

def neuron_node(name, *, model="inf2", devices=None, gpus=0, **capacity):
    node = BY_KEY[model].node(name, devices=devices)
    if gpus:
        gpu = gpu_node(name, gpus=gpus)
        node["metadata"]["annotations"].update(gpu["metadata"]["annotations"])
        for part in ("capacity", "allocatable"):
            node["status"][part]["nvidia.com/gpu"] = gpu["status"]["capacity"]["nvidia.com/gpu"]
    for key, value in capacity.items():
        for part in ("capacity", "allocatable"):
            node["status"][part][key.replace("_", ".").replace("aws.amazon.com.", "aws.amazon.com/")] = value
    return node


def usage(app, node):
    return [(d["used"], d["usedcores"]) for d in app.cache.device_usage(node)]


async def test_one_core_pods_share_a_device_core_by_core(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=1))
    pod, result = await place(api, extender, device_pod("a", {CORE: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "a")
    assert ann["hami.io/aws-neuron-devices-allocated"] == "n1-AWSNeuron-0,AWSNeuron,0,1:;"
    assert (ann["AWS_NEURON_IDS"], ann["NEURON_RESOURCE_TYPE"], ann["NEURON_ALLOCATED"],
            ann["aws.amazon.com/predicate-node"]) == ("0", CORE, "false", "n1")
    assert int(ann["NEURON_ALLOC_TIME"]) > 10**18
    await bind_placed(api, app, extender, pod, result)
    # The second core of the same device (upstream's addCoreUsage: 3 - 1).
    pod_b, result = await place(api, extender, device_pod("b", {CORE: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "b")
    assert ann["hami.io/aws-neuron-devices-allocated"] == "n1-AWSNeuron-0,AWSNeuron,0,2:;"
    assert ann["AWS_NEURON_IDS"] == "1"
    assert usage(app, "n1") == [(2, 3)]
    _, result = await place(api, extender, device_pod("c", {CORE: "1"}), names)
    # Both slots taken: upstream checks the device's slots (2, its cores) before its cores.
    assert result["NodeNames"] is None and result["FailedNodes"] == {"n1": "1/1 CardTimeSlicingExhausted"}
    await bind_placed(api, app, extender, pod_b, {"NodeNames": ["n1"]})
    assert_books_balance(app)
    # Core 0 freed: the next one-core pod gets it back, while b keeps core 1.
    api.delete("pods", "a", namespace="default")
    await wait_until(lambda: usage(app, "n1") == [(1, 2)], "a's core released")
    _, result = await place(api, extender, device_pod("d", {CORE: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    assert decision_annotations(api, app, "d")["AWS_NEURON_IDS"] == "0"
    assert usage(app, "n1") == [(2, 3)]
    assert_books_balance(app)


async def test_a_two_core_request_takes_both_cores_of_an_unused_device(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=2))
    pod, result = await place(api, extender, device_pod("one", {CORE: "1"},
                                                        annotations={"aws.amazon.com/use-neuron-uuid": "n1-AWSNeuron-1"}),
                              names)
    assert result["NodeNames"] == ["n1"], result
    assert decision_annotations(api, app, "one")["AWS_NEURON_IDS"] == "2"      # 2 cores x device 1
    # Two cores: device 1 has only one left, device 0 gives both (mask 3).
    _, result = await place(api, extender, device_pod("two", {CORE: "2"}), names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "two")
    assert ann["hami.io/aws-neuron-devices-allocated"] == "n1-AWSNeuron-0,AWSNeuron,0,3:;"
    assert ann["AWS_NEURON_IDS"] == "0,1"
    _, result = await place(api, extender, device_pod("more", {CORE: "2"}), names)
    assert result["FailedNodes"] == {"n1": "2/2 CardInsufficientCore"}       # one core free on device 1
    assert_books_balance(app)


async def test_a_device_count_gives_whole_devices_and_their_indexes(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=1))
    pod, result = await place(api, extender, device_pod("w", {COUNT: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "w")
    assert ann["hami.io/aws-neuron-devices-allocated"] == "n1-AWSNeuron-0,AWSNeuron,0,3:;"
    assert ann["AWS_NEURON_IDS"] == "0" and "NEURON_RESOURCE_TYPE" not in ann
    bound = await bind_placed(api, app, extender, pod, result)
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"]["AWS_NEURON_IDS"] == "0"
    _, result = await place(api, extender, device_pod("x", {CORE: "1"}), names)
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientCore"}
    assert_books_balance(app)


async def test_several_devices_come_in_aligned_windows_off_inf_instances(api, app, extender):
    names = await register_nodes(api, app, neuron_node("t1", model="trn1", devices=8))
    _, result = await place(api, extender, device_pod("busy", {CORE: "1"},
                                                      annotations={"aws.amazon.com/use-neuron-uuid": "t1-AWSNeuron-5"}),
                            names)
    assert result["NodeNames"] == ["t1"], result
    _, result = await place(api, extender, device_pod("four", {COUNT: "4"}), names)
    assert result["NodeNames"] == ["t1"], result
    ann = decision_annotations(api, app, "four")
    assert ann["AWS_NEURON_IDS"] == "0,1,2,3"
    assert ann["hami.io/aws-neuron-devices-allocated"] == "".join(
        f"t1-AWSNeuron-{i},AWSNeuron,0,3:" for i in range(4)) + ";"
    # 4-7 hold device 5's pod: fewer unused devices than asked (the kernel's reasons), and 3
    # unused devices are no window size on trn1 (upstream's NumaNotFit).
    _, result = await place(api, extender, device_pod("again", {COUNT: "4"}), names)
    assert result["FailedNodes"] == {"t1": "3/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientCore"}
    _, result = await place(api, extender, device_pod("three", {COUNT: "3"}), names)
    assert result["FailedNodes"] == {"t1": "1/8 NumaNotFit, 5/8 CardInsufficientCore"}
    # 4 cores are 2 whole devices: no window size on trn1 either.
    _, result = await place(api, extender, device_pod("cores", {CORE: "4"}), names)
    assert result["FailedNodes"] == {"t1": "1/8 NumaNotFit, 5/8 CardInsufficientCore"}
    assert_books_balance(app)


async def test_inf_instances_take_any_window_of_unused_devices(api, app, extender):
    names = await register_nodes(api, app, neuron_node("i1", model="inf2", devices=6))
    _, result = await place(api, extender, device_pod("busy", {CORE: "1"},
                                                      annotations={"aws.amazon.com/use-neuron-uuid": "i1-AWSNeuron-1"}),
                            names)
    assert result["NodeNames"] == ["i1"], result
    _, result = await place(api, extender, device_pod("three", {COUNT: "3"}), names)
    assert result["NodeNames"] == ["i1"], result
    assert decision_annotations(api, app, "three")["AWS_NEURON_IDS"] == "2,3,4"
    # A core request of 4 cores is 2 whole devices: their 4 core indexes.
    _, result = await place(api, extender, device_pod("cores", {CORE: "4"}), names)
    assert result["NodeNames"] is None and "NumaNotFit" in result["FailedNodes"]["i1"], result   # only 0 and 5
    _, result = await place(api, extender, device_pod("core2", {CORE: "2"}), names)
    assert result["NodeNames"] == ["i1"], result
    assert_books_balance(app)


async def test_a_core_request_over_several_devices_names_their_cores(api, app, extender):
    names = await register_nodes(api, app, neuron_node("i1", model="inf2", devices=4))
    _, result = await place(api, extender, device_pod("cores", {CORE: "4"}), names)
    assert result["NodeNames"] == ["i1"], result
    ann = decision_annotations(api, app, "cores")
    assert ann["AWS_NEURON_IDS"] == "0,1,2,3" and ann["NEURON_RESOURCE_TYPE"] == CORE
    assert ann["hami.io/aws-neuron-devices-allocated"] == \
        "i1-AWSNeuron-0,AWSNeuron,0,3:i1-AWSNeuron-1,AWSNeuron,0,3:;"


async def test_two_containers_of_one_pod_take_the_two_cores_of_one_device(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=1))
    pod = device_pod("pair", {CORE: "1"})
    pod["spec"]["containers"].append({"name": "second", "image": "x", "resources": {"limits": {CORE: "1"}}})
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "pair")
    assert ann["hami.io/aws-neuron-devices-allocated"] == \
        "n1-AWSNeuron-0,AWSNeuron,0,1:;n1-AWSNeuron-0,AWSNeuron,0,2:;"
    assert ann["AWS_NEURON_IDS"] == "0,1"
    assert usage(app, "n1") == [(2, 3)]
    # A third container finds no core left on the node.
    pod = device_pod("trio", {CORE: "1"})
    pod["spec"]["containers"] += [{"name": f"c{i}", "image": "x", "resources": {"limits": {CORE: "1"}}}
                                  for i in range(2)]
    api.delete("pods", "pair", namespace="default")
    await wait_until(lambda: usage(app, "n1") == [(0, 0)], "pair released")
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] is None, result
    assert_books_balance(app)


async def test_a_garbled_capacity_is_refused_while_the_nodes_gpus_work(api, app, extender):
    node = neuron_node("mixed", devices=2, gpus=2, **{"aws.amazon.com/neuroncore": "3"})
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["mixed"].decode_error == (
        "aws.amazon.com/neuron capacity: aws.amazon.com/neuroncore capacity 3 is not divisible by "
        "aws.amazon.com/neuron capacity 2")
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result
    _, result = await place(api, extender, device_pod("n", {CORE: "1"}), names)
    assert result["NodeNames"] is None
    assert_books_balance(app)


async def test_a_malformed_request_is_refused_at_filter(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=2))
    _, result = await place(api, extender, device_pod("half", {CORE: "1.5"}), names)
    assert result["NodeNames"] is None
    assert result["Error"] == 'pod default/half: container "main": aws.amazon.com/neuroncore "1.5" must be an integer'


async def test_an_upstream_placed_pod_is_charged_from_its_annotation(api, app, extender):
    names = await register_nodes(api, app, neuron_node("n1", devices=1))
    pod = device_pod("legacy", {CORE: "1"}, annotations={
        "hami.io/vgpu-node": "n1", "hami.io/aws-neuron-devices-allocated": "n1-AWSNeuron-0,AWSNeuron,0,2:;"})
    pod["spec"]["nodeName"] = "n1"
    api.create("pods", pod)
    await wait_until(lambda: usage(app, "n1") == [(1, 2)], "charged core 1")
    _, result = await place(api, extender, device_pod("next", {CORE: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    assert decision_annotations(api, app, "next")["AWS_NEURON_IDS"] == "0"
    assert_books_balance(app)


async def test_namespace_quota_counts_neuroncores_not_mask_values(api, app, extender):
    """HAMi after v2.10 (#3082) counts ``limits.aws.amazon.com/neuroncore`` in cores, the bits of
    the masks the books hold: a whole two-core device is 2 (its mask is 3), core 1 is 1 (mask 2)."""
    names = await register_nodes(api, app, neuron_node("n1", devices=2))
    await create_quota(api, app, {"limits.aws.amazon.com/neuroncore": "3"}, namespace="default")
    _, result = await place(api, extender, device_pod("whole", {COUNT: "1"}), names)
    assert result["NodeNames"] == ["n1"], result
    assert app.cache.quota.used["default"][("AWSNeuron", "cores")] == 2
    _, result = await place(api, extender, device_pod("core", {CORE: "1"}), names)
    assert result["NodeNames"] == ["n1"], result       # 3 cores, where the masks add up to 4
    assert app.cache.quota.used["default"][("AWSNeuron", "cores")] == 3
    _, result = await place(api, extender, device_pod("over", {CORE: "1"}), names)
    assert "ResourceQuotaNotFit" in result["FailedNodes"]["n1"], result
    assert result["FailedNodes"] == {"n1": "1/2 CardInsufficientCore, 1/2 ResourceQuotaNotFit"}
    # Another namespace has no quota: the same pod fits there.
    other = device_pod("elsewhere", {CORE: "1"})
    other["metadata"]["namespace"] = "free"
    _, result = await place(api, extender, other, names)
    assert result["NodeNames"] == ["n1"], result
    assert_books_balance(app)


async def test_a_whole_inferentia1_device_counts_its_four_cores_against_the_quota(api, app, extender):
    names = await register_nodes(api, app, inf1_node("i1", devices=2))
    await create_quota(api, app, {"limits.aws.amazon.com/neuroncore": "5"}, namespace="default")
    _, result = await place(api, extender, device_pod("whole", {COUNT: "1"}), names)
    assert result["NodeNames"] == ["i1"], result
    assert app.cache.quota.used["default"][("AWSNeuron", "cores")] == 4      # mask 15
    _, result = await place(api, extender, device_pod("two", {CORE: "2"}), names)
    assert "ResourceQuotaNotFit" in result["FailedNodes"]["i1"], result
    _, result = await place(api, extender, device_pod("one", {CORE: "1"}), names)
    assert result["NodeNames"] == ["i1"], result
    assert app.cache.quota.used["default"][("AWSNeuron", "cores")] == 5
    assert_books_balance(app)


async def test_the_quota_counts_the_init_peak_or_the_app_sum_whichever_is_larger(api, app, extender):
    """An init container runs before the app containers: a pod holds the larger of its init
    containers' cores and its app containers' sum on a device, at the filter and in the books."""
    names = await register_nodes(api, app, neuron_node("n1", devices=4))
    await create_quota(api, app, {"limits.aws.amazon.com/neuroncore": "2"}, namespace="default")
    pod = device_pod("staged", {CORE: "1"})
    pod["spec"]["initContainers"] = [{"name": "warm", "image": "busybox",
                                      "resources": {"limits": {CORE: "2"}}}]
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"], result       # max(2, 1) cores, not 3
    assert app.cache.quota.used["default"][("AWSNeuron", "cores")] == 2
    # App containers run together: their cores add up (1 + 2 > 2), though each alone would fit.
    await create_quota(api, app, {"limits.aws.amazon.com/neuroncore": "2"}, namespace="team")
    pod = device_pod("sum", {CORE: "1"})
    pod["metadata"]["namespace"] = "team"
    pod["spec"]["containers"].append({"name": "second", "image": "busybox", "resources": {"limits": {CORE: "2"}}})
    _, result = await place(api, extender, pod, names)
    assert "ResourceQuotaNotFit" in result["FailedNodes"]["n1"], result
    pod = device_pod("alone", {CORE: "2"})
    pod["metadata"]["namespace"] = "team"
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"], result
    assert_books_balance(app)


def test_the_webhooks_quota_pre_check_counts_the_cores_asked():
    """3 cores count 3 (two devices, 2 and 1 cores), a whole device the 2 cores every device has."""
    calls = []

    def fit_quota(namespace, vendor, memory, cores):
        calls.append((vendor, memory, cores))
        return cores <= 3

    response, _ = admit(make_pod(container(limits={CORE: "3"})), fit_quota=fit_quota)
    assert response["allowed"] and calls == [("AWSNeuron", 0, 3)]
    calls.clear()
    response, _ = admit(make_pod(container(limits={COUNT: "2"})), fit_quota=fit_quota)
    assert not response["allowed"] and calls == [("AWSNeuron", 0, 4)]
    assert response["status"]["message"] == "exceeding resource quota"


async def test_a_device_count_in_requests_only_is_annotated_with_core_indexes(api, app, extender):
    """upstream's PatchAnnotations names device indexes only for a count in limits: a count in
    requests alone gets the device's core indexes and NEURON_RESOURCE_TYPE, as upstream writes."""
    names = await register_nodes(api, app, neuron_node("n1", devices=2))
    pod = device_pod("req", {}, annotations={"aws.amazon.com/use-neuron-uuid": "n1-AWSNeuron-1"})
    pod["spec"]["containers"][0]["resources"] = {"requests": {COUNT: "1"}}
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "req")
    assert (ann["AWS_NEURON_IDS"], ann["NEURON_RESOURCE_TYPE"]) == ("2,3", CORE)
    assert ann["hami.io/aws-neuron-devices-allocated"] == "n1-AWSNeuron-1,AWSNeuron,0,3:;"


async def test_an_odd_core_request_takes_the_rest_on_its_last_device(api, app, extender):
    """3 cores on inf2 (2 a device): two unused devices, both cores of the first and core 0 of the
    second, as HAMi v2.11 places them (v2.10 refused an odd count above 2)."""
    names = await register_nodes(api, app, neuron_node("i1", model="inf2", devices=2))
    _, result = await place(api, extender, device_pod("three", {CORE: "3"}), names)
    assert result["NodeNames"] == ["i1"], result
    ann = decision_annotations(api, app, "three")
    assert ann["hami.io/aws-neuron-devices-allocated"] == \
        "i1-AWSNeuron-0,AWSNeuron,0,3:i1-AWSNeuron-1,AWSNeuron,0,1:;"
    assert (ann["AWS_NEURON_IDS"], ann["NEURON_RESOURCE_TYPE"]) == ("0,1,2", CORE)
    assert usage(app, "i1") == [(1, 3), (1, 1)]
    assert_books_balance(app)


def inf1_node(name, devices):
    """An Inferentia1 node: 4 NeuronCores a device."""
    node = neuron_node(name, model="inf2", devices=devices, **{"aws.amazon.com/neuroncore": str(4 * devices)})
    node["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "inf1.6xlarge"
    return node


async def test_inferentia1_devices_give_contiguous_runs_of_up_to_four_cores(api, app, extender):
    """#3082: an inf1 device's 4 cores are all given (v2.10 addressed 2), one contiguous run a
    container, the lowest free; scattered free cores do not make a run."""
    names = await register_nodes(api, app, inf1_node("f1", devices=1))
    assert [(d.count, d.devcore) for d in app.cache.nodes["f1"].devices] == [(4, 15)]
    for name, cores, ids in (("a", "1", "0"), ("b", "2", "1,2"), ("c", "1", "3")):
        _, result = await place(api, extender, device_pod(name, {CORE: cores}), names)
        assert result["NodeNames"] == ["f1"], result
        assert decision_annotations(api, app, name)["AWS_NEURON_IDS"] == ids
    assert usage(app, "f1") == [(3, 15)]
    _, result = await place(api, extender, device_pod("full", {CORE: "1"}), names)
    assert result["FailedNodes"] == {"f1": "1/1 CardInsufficientCore"}
    # b leaves: cores 1-2 free again; a 2-core pod gets them back, a 3-core one does not fit.
    api.delete("pods", "b", namespace="default")
    await wait_until(lambda: usage(app, "f1") == [(2, 9)], "b's cores released")
    _, result = await place(api, extender, device_pod("three", {CORE: "2"}), names)
    assert result["NodeNames"] == ["f1"], result
    assert decision_annotations(api, app, "three")["AWS_NEURON_IDS"] == "1,2"
    assert_books_balance(app)


async def test_scattered_free_cores_of_an_inferentia1_device_are_no_run(api, app, extender):
    names = await register_nodes(api, app, inf1_node("f1", devices=1))
    for name in "abcd":
        _, result = await place(api, extender, device_pod(name, {CORE: "1"}), names)
        assert result["NodeNames"] == ["f1"], result
    for name in "ac":
        api.delete("pods", name, namespace="default")
    await wait_until(lambda: usage(app, "f1") == [(2, 10)], "cores 0 and 2 released")
    # Cores 0 and 2 are free, not adjacent: the device's free cores add up, no run of 2 does.
    _, result = await place(api, extender, device_pod("pair", {CORE: "2"}), names)
    assert result["FailedNodes"] == {"f1": "1/1 CardInsufficientCore"}
    _, result = await place(api, extender, device_pod("one", {CORE: "1"}), names)
    assert result["NodeNames"] == ["f1"], result
    assert decision_annotations(api, app, "one")["AWS_NEURON_IDS"] == "0"
    assert_books_balance(app)


async def test_a_whole_inferentia1_device_is_its_four_cores(api, app, extender):
    names = await register_nodes(api, app, inf1_node("f1", devices=2))
    _, result = await place(api, extender, device_pod(
        "w", {COUNT: "1"}, annotations={"aws.amazon.com/use-neuron-uuid": "f1-AWSNeuron-0"}), names)
    assert result["NodeNames"] == ["f1"], result
    ann = decision_annotations(api, app, "w")
    assert (ann["hami.io/aws-neuron-devices-allocated"], ann["AWS_NEURON_IDS"]) == ("f1-AWSNeuron-0,AWSNeuron,0,15:;", "0")
    # A count in requests only is annotated with the device's core indexes: 4 a device.
    pod = device_pod("req", {}, annotations={"aws.amazon.com/use-neuron-uuid": "f1-AWSNeuron-1"})
    pod["spec"]["containers"][0]["resources"] = {"requests": {COUNT: "1"}}
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["f1"], result
    assert decision_annotations(api, app, "req")["AWS_NEURON_IDS"] == "4,5,6,7"
    assert_books_balance(app)


@pytest.mark.parametrize("cores, node, devices, masks, ids", [
    # inf1: 4 cores a device, so 3 or 4 cores are ONE device (even on a node of one device), 5 two.
    ("3", "inf1", 1, [7], "0,1,2"),
    ("4", "inf1", 1, [15], "0,1,2,3"),
    ("5", "inf1", 2, [15, 1], "0,1,2,3,4"),
    # inf2: 2 cores a device, so the same asks take 2, 2 and 3 devices.
    ("3", "inf2", 2, [3, 1], "0,1,2"),
    ("4", "inf2", 2, [3, 3], "0,1,2,3"),
    ("5", "inf2", 3, [3, 3, 1], "0,1,2,3,4"),
])
async def test_a_core_request_takes_devices_by_the_nodes_cores_a_device(api, app, extender, cores, node, devices,
                                                                         masks, ids):
    """HAMi after v2.10 (#3082): a core request keeps its total and is spread over as many of the
    node's devices as its addressable cores a device need, the last with what is left; the masks
    the annotations carry are what the books charge. A node of exactly those devices fits."""
    built = inf1_node("n1", devices) if node == "inf1" else neuron_node("n1", model="inf2", devices=devices)
    names = await register_nodes(api, app, built)
    _, result = await place(api, extender, device_pod("p", {CORE: cores}), names)
    assert result["NodeNames"] == ["n1"], result
    ann = decision_annotations(api, app, "p")
    assert ann["hami.io/aws-neuron-devices-allocated"] == "".join(
        f"n1-AWSNeuron-{i},AWSNeuron,0,{mask}:" for i, mask in enumerate(masks)) + ";"
    assert (ann["AWS_NEURON_IDS"], ann["NEURON_RESOURCE_TYPE"]) == (ids, CORE)
    assert usage(app, "n1") == [(1, mask) for mask in masks]
    assert_books_balance(app)


@pytest.mark.parametrize("node, devices", [("inf1", 1), ("inf2", 2)])
async def test_a_node_with_fewer_devices_than_its_count_for_the_cores_is_short_of_devices(api, app, extender, node,
                                                                                         devices):
    """5 cores need 2 inf1 devices or 3 inf2 devices: a node with fewer reads NodeInsufficientDevice,
    as upstream words a device count beyond the node's."""
    built = inf1_node("n1", devices) if node == "inf1" else neuron_node("n1", model="inf2", devices=devices)
    names = await register_nodes(api, app, built)
    _, result = await place(api, extender, device_pod("p", {CORE: "5"}), names)
    assert result["NodeNames"] is None and result["FailedNodes"] == {"n1": "NodeInsufficientDevice"}, result


async def test_four_cores_take_one_inf1_device_or_two_inf2_devices_in_one_cluster(api, app, extender):
    """The device count is each node's own: 4 cores fit a one-device inf1 node and not a one-device
    inf2 node, in the same filter (the inf2 node, listed first, is short of devices for them)."""
    names = await register_nodes(api, app, neuron_node("i1", model="inf2", devices=1), inf1_node("f1", 1))
    _, result = await place(api, extender, device_pod("four", {CORE: "4"}), names)
    assert result["NodeNames"] == ["f1"], result
    assert decision_annotations(api, app, "four")["AWS_NEURON_IDS"] == "0,1,2,3"
    assert usage(app, "f1") == [(1, 15)]
    assert_books_balance(app)
