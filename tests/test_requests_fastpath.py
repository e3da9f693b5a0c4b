"""The filter asks a container only of the families whose resource names it carries
(``DeviceVendor.request_resource_names``): the answer must be exactly the one asking every family
gives, the same PodRequest or the same error, whatever the container holds."""
from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_py.config import DeviceConfig
from hami_py.devices.registry import EVERY_FAMILY, build_vendors
from hami_py.scheduling.decision.requests import askers_of, parse_pod_requests

REMOTE = {"resourceCountName": "lupine.example/gpu", "resourceMemoryName": "lupine.example/gpumem"}


def renamed(value, rename):
    """The config with every resource name (a string holding a '/') renamed."""
    if isinstance(value, dict):
        return {key: renamed(item, rename) for key, item in value.items()}
    if isinstance(value, list):
        return [renamed(item, rename) for item in value]
    if isinstance(value, str) and "/" in value:
        return rename(value)
    return value


def vendors_of(sections: dict) -> dict:
    vendors = build_vendors(DeviceConfig(sections=sections), EVERY_FAMILY)
    # Every resource name the config file spells: a family reading one it does not declare is
    # caught even when the name is not among those it manages.
    names: set[str] = set()
    renamed(sections, lambda name: names.add(name))
    CONFIG_NAMES[id(vendors)] = sorted(names)
    return vendors


CONFIG_NAMES: dict[int, list[str]] = {}


DEFAULT = DeviceConfig.default().sections
CONFIGS = {
    # The chart's names, every family on (the remote GPU family too).
    "chart": vendors_of({**DEFAULT, "remotegpu": REMOTE}),
    # Custom resource names throughout.
    "custom": vendors_of(renamed({**DEFAULT, "remotegpu": REMOTE},
                                 lambda name: "custom.example/" + name.replace("/", "-").replace(".", "-"))),
    # Memory and core names several families share (only count names must be distinct): a
    # container naming one of them is asked of all of those families, in vendor order.
    "shared": vendors_of(renamed(DEFAULT, lambda name: "shared.example/memory" if "mem" in name.lower()
                                 else "shared.example/cores" if "core" in name.lower() else name)),
    # The defaults of families without a section: empty names, which no container can name.
    "bare": vendors_of({}),
}


def name_groups(vendors: dict) -> list[list[str]]:
    """Per family, the names its requests are written with (what it declares, manages and says
    a simple request is spelled with)."""
    return [sorted({*vendor.resource_names(), *(vendor.request_resource_names() or ()),
                    *(name for name in vendor.request_resources()[:3] if name)})
            for vendor in vendors.values()]


JUNK = ["cpu", "memory", "nvidia.com/priority", "example.com/gpu", "", "hugepages-2Mi"]
LIKELY = st.sampled_from(["0", "1", "1", "2", "4", "50", "100", "4096", 1, 2, 3000])
ODD = st.one_of(
    st.sampled_from(["3", "8", "101", "200", "1024", "16384", "1.5", "-1", "1Gi", "24Gi", "1k", "2e3", "abc", "",
                     " 1", "0x10", "2147483648"]),
    st.integers(-3, 1 << 33), st.sampled_from([0.5, 1.0, 2.0, None, True, False, [], {}, ["1"]]),
)
VALUES = st.one_of(LIKELY, LIKELY, LIKELY, LIKELY, LIKELY, ODD)
MALFORMED = st.sampled_from([None, [], "junk", 0, 1, ["nvidia.com/gpu"], {}])
ANNOTATIONS = st.dictionaries(
    st.sampled_from(["metax-tech.com/sgpu-app-class", "huawei.com/vnpu-mode", "nvidia.com/use-gputype",
                     "hami.io/gpu-scheduler-policy"]),
    st.sampled_from(["online", "offline", "enpu", "hami-core", "A100", "binpack", ""]), max_size=2)


@st.composite
def pods(draw, vendors: dict) -> dict:
    """A pod whose containers mostly ask one family or two (with its names, junk ones and odd
    values), and now and then carry malformed resources."""
    groups = name_groups(vendors)

    def resource_list():
        names = [*draw(st.sampled_from(groups)), *JUNK]
        if draw(st.integers(0, 3)) == 0:
            names += draw(st.sampled_from(groups))
        if draw(st.integers(0, 3)) == 0:
            names += CONFIG_NAMES[id(vendors)]
        return draw(st.dictionaries(st.sampled_from(names), VALUES, max_size=4))

    def container():
        shape = draw(st.integers(0, 29))
        out = {"name": draw(st.sampled_from(["main", "side", "", "x y"]))}
        if shape == 0:
            return out
        if shape == 1:
            out["resources"] = draw(MALFORMED)
        elif shape == 2:
            out["resources"] = {"limits": draw(MALFORMED), "requests": resource_list()}
        elif shape == 3:
            out["resources"] = {"limits": resource_list(), "requests": draw(MALFORMED)}
        elif shape <= 20:
            out["resources"] = {"limits": resource_list()}
        else:
            out["resources"] = {"limits": resource_list(), "requests": resource_list()}
        return out

    app = [container() for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3])))]
    init = [container() for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2])))]
    return {"metadata": {"name": "p", "namespace": "default", "annotations": draw(ANNOTATIONS)},
            "spec": {"containers": app, "initContainers": init}}


def outcome(pod: dict, vendors: dict, prefilter: bool):
    vendor_ids = {key: i for i, key in enumerate(vendors)}
    try:
        return "answer", parse_pod_requests(copy.deepcopy(pod), vendors, vendor_ids, prefilter=prefilter)
    except Exception as err:     # noqa: BLE001: the error itself is what is compared
        return "error", type(err).__name__, str(err)


@settings(deadline=None, max_examples=800, suppress_health_check=list(HealthCheck))
@given(data=st.data(), config=st.sampled_from(sorted(CONFIGS)))
def test_asking_only_the_named_families_answers_as_asking_every_family(data, config):
    vendors = CONFIGS[config]
    pod = data.draw(pods(vendors))
    assert outcome(pod, vendors, True) == outcome(pod, vendors, False)


def test_every_family_declares_its_names_so_a_container_asks_only_its_own():
    """No family of the chart falls back to being asked about every container, and an NVIDIA
    container is asked of NVIDIA alone."""
    vendors = CONFIGS["chart"]
    assert [key for key, vendor in vendors.items() if vendor.request_resource_names() is None] == []
    askers = askers_of(vendors)
    container = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                                          "cpu": "2"}}}
    assert [key for key, _ in askers.asked(container)] == ["NVIDIA"]
    assert askers.asked({"name": "cpu-only", "resources": {"limits": {"cpu": "2"}}}) == []
    # Malformed resources reach every family, which words the error.
    assert len(askers.asked({"name": "bad", "resources": {"limits": ["nvidia.com/gpu"]}})) == len(vendors)


def test_a_fresh_copy_of_the_vendors_gives_the_same_answer():
    """Callers that pass ``dict(vendors)`` per request are answered from the same names."""
    vendors = CONFIGS["custom"]
    nvidia = vendors["NVIDIA"].request_resources()[0]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "resources": {"limits": {nvidia: "2"}}}]}}
    first = parse_pod_requests(pod, dict(vendors), {key: i for i, key in enumerate(vendors)})
    again = parse_pod_requests(pod, dict(vendors), {key: i for i, key in enumerate(vendors)})
    assert first == again and first.row_vendor == ["NVIDIA"] and first.total_nums == 2
