"""One set of books, property-tested over all fourteen device families.

A pod is charged once while it is only reserved (our /filter's decision, nothing written yet),
again when the watch shows it bound with the decision's annotations, again when the device plugin
answers ``success``, and again after a restart rebuilds the books from the API server's objects.
Upstream HAMi reads every state back from the same annotations, so it answers a probe pod the same
in all four. Here, after every step of a random sequence, a fixed set of probe pods must get the
same node and the same reasons from the live books as from a model rebuilt from the pods'
annotations alone (tests/books_model.py).
"""
from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hami_py.fakeapi.families import BY_KEY
from hami_py.fakeapi.objects import gpu_node
from tests.books_model import World, books_pod

DRS_KEY_ANN = "enflame.com/gcu-drs-capacity"


def _drs_node(name: str, cards: int) -> dict:
    node = gpu_node(name, gpus=1)
    del node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    devices = [{"index": str(i), "minor": str(i), "capacity": 6} for i in range(cards)]
    node["metadata"]["annotations"][DRS_KEY_ANN] = orjson.dumps(
        {"devices": devices, "profiles": {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}}).decode()
    return node


def _lupine_node(name: str, cards: int) -> dict:
    """n0 serves its cards over the network (hami.io/lupine-server); any other node is a GPU-less
    client: a remote-GPU pod is placed on a client and charged on the server."""
    node = gpu_node(name, gpus=cards)
    if name != "n0":
        del node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
        return node
    registered = orjson.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    for device in registered:
        device["mode"] = "remote"
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(registered).decode()
    node["metadata"]["labels"]["hami.io/lupine-server"] = ""
    node["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.10"}]
    return node


def _model_node(key: str, **kwargs):
    return lambda name, devices: BY_KEY[key].node(name, devices=devices, **kwargs)


def _ascend_soft_node(name: str, devices: int) -> dict:
    node = BY_KEY["ascend910b3"].node(name, devices=devices)
    node["metadata"]["annotations"].update({"hami-vnpu-core": "true", "hami.io/enpu": "true"})
    return node


def _c(limits: dict, name: str = "main") -> dict:
    return {"name": name, "resources": {"limits": {k: str(v) for k, v in limits.items()}}}


# Per family: how a node of it is built (name, devices), and the request shapes its pods take:
# each a function of a draw (0..3) to one container's limits.
FAMILIES: dict[str, tuple] = {
    "nvidia": (lambda name, devices: gpu_node(name, gpus=devices), [
        lambda d: {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000 * (d + 1), "nvidia.com/gpucores": 25 * (d % 2 + 1)},
        lambda d: {"nvidia.com/gpu": 1 + d % 2},
    ]),
    "ascend": (_model_node("ascend910b3"), [
        lambda d: {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": (8192, 16384, 32768, 65536)[d]},
        lambda d: {"huawei.com/Ascend910B3": 1},
    ]),
    # Nodes running both soft splits (hami-core and ENPU): which pods share an NPU depends on the
    # modes and ENPU policies of those already on it, read back from their annotations.
    "ascend-soft": (_ascend_soft_node, [
        lambda d: {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": (8192, 16384, 20480, 32768)[d],
                   "huawei.com/Ascend910B3-core": (20, 30, 50, 100)[d]},
        lambda d: {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 4096 * (d + 1)},
    ]),
    "cambricon": (_model_node("mlu370"), [
        lambda d: {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 24 * (d + 1),
                   "cambricon.com/mlu.smlu.vcore": 25 * (d % 2 + 1)},
        lambda d: {"cambricon.com/vmlu": 1},
    ]),
    "hygon": (_model_node("z100"), [
        lambda d: {"hygon.com/dcunum": 1, "hygon.com/dcumem": 4096 * (d + 1), "hygon.com/dcucores": 20 * (d % 3 + 1)},
    ]),
    "iluvatar": (_model_node("mr-v100"), [
        lambda d: {"iluvatar.ai/MR-V100-vgpu": 1, "iluvatar.ai/MR-V100.vMem": 16 * (d + 1),
                   "iluvatar.ai/MR-V100.vCore": 25 * (d % 2 + 1)},
    ]),
    "kunlun": (_model_node("kunlun"), [lambda d: {"kunlunxin.com/xpu": (1, 1, 2, 4)[d]}]),
    "kunlun-vxpu": (_model_node("kunlun-vxpu"), [
        lambda d: {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": (24576, 24576, 49152, 98304)[d]},
    ]),
    "enflame": (_model_node("gcu"), [lambda d: {"enflame.com/gcu": 1 + d % 2}]),
    "enflame-drs": (_drs_node, [lambda d: {"enflame.com/drs-gcu": (1, 3, 3, 6)[d]},
                                lambda d: {"enflame.com/gcu-memory": (6, 20, 20, 40)[d]}]),
    "metax-gpu": (_model_node("metax-gpu"), [lambda d: {"metax-tech.com/gpu": 1 + d % 2}]),
    "metax-sgpu": (_model_node("metax-sgpu"), [
        lambda d: {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 8 * (d + 1), "metax-tech.com/vcore": 30 + 10 * d},
        lambda d: {"metax-tech.com/sgpu": 1},
    ]),
    "mthreads": (_model_node("mthreads"), [
        lambda d: {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 16 * (d + 1), "mthreads.com/sgpu-core": 4 * (d + 1)},
        lambda d: {"mthreads.com/vgpu": 1},
    ]),
    "biren": (_model_node("biren"), [lambda d: {"birentech.com/gpu": 1 + d % 2}]),
    "vastai": (_model_node("vastai"), [lambda d: {"vastaitech.com/va": 1 + d % 2}]),
    "vastai-die": (_model_node("vastai-die"), [lambda d: {"vastaitech.com/va": 1 + d % 2}]),
    "awsneuron": (_model_node("inf2"), [
        lambda d: {"aws.amazon.com/neuroncore": 1 + d % 2},
        lambda d: {"aws.amazon.com/neuron": 1 + d % 2},
    ]),
    "remotegpu": (_lupine_node, [
        lambda d: {"nvidia.com/remote-gpu": 1 + d % 2},
        lambda d: {"nvidia.com/remote-gpu": 1, "nvidia.com/remote-gpu-memory": (20000, 40000, 80000, 200000)[d]},
    ]),
    "amd": (_model_node("mi300x"), [
        lambda d: {"amd.com/gpu": 1, "amd.com/gpumem": 1000 * (d + 1), "amd.com/gpucores": (25, 50, 50, 75)[d]},
        lambda d: {"amd.com/gpu": 1},
    ]),
}

# Pod annotations a family's pods may carry that change how they are charged or placed.
POD_ANNOTATIONS = {
    "ascend-soft": [{}, {"huawei.com/vnpu-mode": "hami-core"},
                    {"huawei.com/vnpu-mode": "enpu", "huawei.com/enpu-policy": "elastic"},
                    {"huawei.com/vnpu-mode": "enpu", "huawei.com/enpu-policy": "fixed-share"}],
    "metax-sgpu": [{}, {"metax-tech.com/sgpu-qos-policy": "fixed-share"},
                   {"metax-tech.com/sgpu-qos-policy": "best-effort"}],
}


def _shapes(family: str):
    _, shapes = FAMILIES[family]
    annotations = POD_ANNOTATIONS.get(family, [{}])
    return st.tuples(st.integers(0, len(shapes) - 1), st.integers(0, 3), st.integers(0, len(annotations) - 1),
                     st.booleans())


def _pod(family: str, name: str, shape: tuple) -> dict:
    _, shapes = FAMILIES[family]
    which, draw, ann, with_init = shape
    annotations = POD_ANNOTATIONS.get(family, [{}])[ann]
    init = [_c(shapes[which](draw), "setup")] if with_init else None
    return books_pod(name, [_c(shapes[which](draw))], init=init, annotations=annotations)


def _probes(family: str) -> list[dict]:
    """Every shape of the family at every size: what the books must answer alike."""
    _, shapes = FAMILIES[family]
    out = []
    for which in range(len(shapes)):
        for draw in range(4):
            for ann in range(len(POD_ANNOTATIONS.get(family, [{}]))):
                out.append(_pod(family, f"probe-{which}-{draw}-{ann}", (which, draw, ann, False)))
    return out


STEP = st.sampled_from(("create", "filter", "bind", "allocated", "delete", "restart"))


def check_sequence(family: str, devices: tuple[int, ...], steps: list[tuple[str, int, tuple]]) -> None:
    build, _ = FAMILIES[family]
    world = World([build(f"n{i}", d) for i, d in enumerate(devices)])
    probes = _probes(family)
    for number, (step, pick, shape) in enumerate(steps):
        if step == "create":
            world.create(_pod(family, f"p{number}", shape))
        elif step == "restart":
            world.restart()
        else:
            pool = {"filter": world.pending, "bind": world.reserved, "allocated": world.bound,
                    "delete": lambda: list(world.objects)}[step]()
            if not pool:
                continue
            uid = sorted(pool)[pick % len(pool)]
            getattr(world, step)(uid)
        # Every pod's named state, against what the objects say it must be.
        states = {uid: record.state for uid, record in world.cache.pods.items()}
        assert states == world.expected_states(), f"{family}: after step {number} ({step}): pod states"
        model = world.model()
        # The books themselves first (what every later answer is computed from), then the answers.
        for name in world.names:
            assert world.cache.device_usage(name) == model.cache.device_usage(name), (
                f"{family}: after step {number} ({step}) node {name}: live books "
                f"{world.cache.device_usage(name)}, from the annotations {model.cache.device_usage(name)}")
        for probe in probes:
            live, expected = world.probe(probe), model.probe(probe)
            assert live == expected, (
                f"{family}: after step {number} ({step}) probe {probe['metadata']['name']} "
                f"{probe['spec']['containers'][0]['resources']['limits']}: live books {live}, "
                f"from the annotations {expected}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_probe_gets_the_same_answer_from_the_live_books_as_from_the_annotations(family, data):
    devices = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2), label="devices per node")
    steps = data.draw(st.lists(st.tuples(STEP, st.integers(0, 7), _shapes(family)), min_size=1, max_size=14),
                      label="steps")
    check_sequence(family, tuple(devices), steps)


@pytest.mark.parametrize("family", ["amd", "mthreads", "metax-gpu", "ascend", "kunlun-vxpu"])
def test_the_check_catches_a_reservation_charged_apart_from_its_annotations(family, monkeypatch):
    """The check above can fail: a second set of books (a reservation charged one MiB and one core
    more than its annotations say, as the five families' reservations once were charged from the
    kernel's outputs) is caught at the first filter, in every family the issue named."""
    from hami_py.cache.pod_ledger import PodLedger

    original = PodLedger.charge_of

    def second_set_of_books(self, annotations, shape):
        entries, instances = original(self, annotations, shape)
        if "hami.io/bind-phase" not in annotations:     # only our /filter's reservation
            for entry in entries:
                entry.mem += 1
                entry.cores += 1
        return entries, instances

    monkeypatch.setattr(PodLedger, "charge_of", second_set_of_books)
    with pytest.raises(AssertionError, match=r"after step 1 \(filter\) node n0: live books"):
        check_sequence(family, (1,), [("create", 0, (0, 0, 0, False)), ("filter", 0, (0, 0, 0, False))])
