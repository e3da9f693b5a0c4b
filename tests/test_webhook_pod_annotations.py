"""The pod annotations HAMi after v2.10 reads at admission: ``hami.io/overwrite-env`` with
``hami.io/overwrite-env-containers`` (#2966, NVIDIA and Ascend) and NVIDIA's
``nvidia.com/mig-profile-preference`` (#3014).
"""
from __future__ import annotations

import orjson
import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.nvidia.mig_preference import matches, parse_preference, slice_key
from hami_py.devices.overwrite_env import overwrite_env
from hami_py.devices.registry import FamilySwitches, build_vendors
from tests.test_webhook import admit, container, make_pod

NONE = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}
ASCEND_EMPTY = {"name": "ASCEND_VISIBLE_DEVICES", "value": ""}


def vendors(*, overwrite: bool, ascend: bool = False):
    config = DeviceConfig.default()
    config.sections["nvidia"]["overwriteEnv"] = overwrite
    for chip in config.sections["vnpus"]["configs"]:
        chip["overwriteEnv"] = overwrite
    return build_vendors(config, FamilySwitches(enable_ascend=ascend))


OFF, ON = vendors(overwrite=False), vendors(overwrite=True)


def pod_with(annotations: dict | None, *containers: dict) -> dict:
    pod = make_pod(*(containers or (container("app"), container("sidecar"))))
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


def hidden(pod: dict, *, vendors_, variable: dict = NONE) -> list[str]:
    """The containers the webhook sets the clearing variable on."""
    response, patched = admit(pod, vendors=vendors_)
    assert response["allowed"], response
    return [c["name"] for c in patched["spec"]["containers"] if variable in (c.get("env") or [])]


# -- hami.io/overwrite-env ------------------------------------------------------------------------

@pytest.mark.parametrize("annotations, config_off, config_on", [
    (None, [], ["app", "sidecar"]),                                             # unset: the config
    ({"hami.io/overwrite-env": "true"}, ["app", "sidecar"], ["app", "sidecar"]),
    ({"hami.io/overwrite-env": "1"}, ["app", "sidecar"], ["app", "sidecar"]),  # Go's ParseBool
    ({"hami.io/overwrite-env": "F"}, [], []),
    ({"hami.io/overwrite-env": "yes"}, [], ["app", "sidecar"]),                # no boolean: ignored
    ({"hami.io/overwrite-env": ""}, [], ["app", "sidecar"]),
    # The container's entry wins over the pod's, both ways.
    ({"hami.io/overwrite-env": "true", "hami.io/overwrite-env-containers": '{"sidecar": "false"}'},
     ["app"], ["app"]),
    ({"hami.io/overwrite-env": "false", "hami.io/overwrite-env-containers": '{"sidecar": "true"}'},
     ["sidecar"], ["sidecar"]),
    ({"hami.io/overwrite-env-containers": '{"app": "false"}'}, [], ["sidecar"]),
    # An entry that is no boolean falls back to the pod's; a value that is no JSON object of
    # strings (as Go's decoding into map[string]string) is ignored whole.
    ({"hami.io/overwrite-env": "true", "hami.io/overwrite-env-containers": '{"app": "maybe"}'},
     ["app", "sidecar"], ["app", "sidecar"]),
    ({"hami.io/overwrite-env-containers": '{"app": false}'}, [], ["app", "sidecar"]),
    ({"hami.io/overwrite-env-containers": "app=false"}, [], ["app", "sidecar"]),
    ({"hami.io/overwrite-env-containers": '{"*": "false"}'}, [], ["app", "sidecar"]),  # no wildcard
])
def test_the_pod_and_its_containers_decide_over_the_config(annotations, config_off, config_on):
    assert hidden(pod_with(annotations), vendors_=OFF) == config_off
    assert hidden(pod_with(annotations), vendors_=ON) == config_on


def test_a_container_asking_for_gpus_keeps_them_whatever_the_annotations_say():
    pod = pod_with({"hami.io/overwrite-env": "true", "hami.io/overwrite-env-containers": '{"gpu": "true"}'},
                   container("gpu", limits={"nvidia.com/gpu": "1"}), container("cpu"))
    assert hidden(pod, vendors_=OFF) == ["cpu"]


def test_ascend_reads_the_same_annotations_and_spares_any_chips_npus():
    """Every chip kind is a vendor of its own; a container asking for one chip's NPUs keeps its
    ASCEND_VISIBLE_DEVICES although the other chips' vendors see no request of theirs (#2953)."""
    pod = pod_with({"hami.io/overwrite-env": "true"},
                   container("npu", limits={"huawei.com/Ascend910B3": "1"}), container("cpu"))
    off = vendors(overwrite=False, ascend=True)
    response, patched = admit(pod, vendors=off)
    assert response["allowed"], response
    env = {c["name"]: [v for v in c.get("env") or [] if v["name"] == "ASCEND_VISIBLE_DEVICES"]
           for c in patched["spec"]["containers"]}
    assert env == {"npu": [], "cpu": [ASCEND_EMPTY]}      # once, though seven chip kinds looked at it
    no = pod_with({"hami.io/overwrite-env-containers": '{"cpu": "false"}'}, container("cpu"))
    assert hidden(no, vendors_=vendors(overwrite=True, ascend=True), variable=ASCEND_EMPTY) == []


def test_the_decision_is_a_function_of_the_pod_and_the_container():
    pod = {"metadata": {"annotations": {"hami.io/overwrite-env-containers": orjson.dumps({"a": "t"}).decode()}}}
    assert overwrite_env(pod, {"name": "a"}, default=False) is True
    assert overwrite_env(pod, {"name": "b"}, default=False) is False
    assert overwrite_env({}, {"name": "a"}, default=True) is True


# -- nvidia.com/mig-profile-preference --------------------------------------------------------------

def mig_pod(value: str) -> dict:
    return pod_with({"nvidia.com/mig-profile-preference": value, "nvidia.com/vgpu-mode": "mig"},
                    container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}))


def test_the_preference_is_a_trimmed_deduplicated_list_of_profiles_or_slice_keys():
    assert parse_preference(" 4g.40gb , 3g,,3g , 4g.40gb") == ["4g.40gb", "3g"]
    assert slice_key("3g.20gb") == "3g" and slice_key("3g") == "3g" and slice_key(".x") == ".x"
    assert matches("3g.20gb", "3g") and matches("3g.20gb", "3g.20gb") and not matches("3g.20gb", "3g.40gb")
    assert not matches("13g.20gb", "3g")


@pytest.mark.parametrize("value", ["3g.20gb", "4g", " 7g.80gb , 3g ", "1g.5gb,1g.5gb", "4g.96gb"])
def test_a_preference_the_allowlist_can_satisfy_is_admitted(value):
    response, patched = admit(mig_pod(value), vendors=OFF)
    assert response["allowed"], response
    assert patched["metadata"]["annotations"]["nvidia.com/mig-profile-preference"] == value   # kept as written


@pytest.mark.parametrize("value, message", [
    ("5g.30gb", 'invalid nvidia.com/mig-profile-preference entry "5g.30gb": it does not match any profile in '
                "migProfileAllowlist"),
    ("3g, 6g", 'invalid nvidia.com/mig-profile-preference entry "6g": it does not match any profile in '
               "migProfileAllowlist"),
    ("3g.20GB", 'invalid nvidia.com/mig-profile-preference entry "3g.20GB": it does not match any profile in '
                "migProfileAllowlist"),
    (" , ", 'invalid nvidia.com/mig-profile-preference value " , ": expected a comma-separated list of MIG '
            'profiles such as "4g.20gb" or "4g"'),
    ("", 'invalid nvidia.com/mig-profile-preference value "": expected a comma-separated list of MIG '
         'profiles such as "4g.20gb" or "4g"'),
])
def test_a_preference_nothing_can_satisfy_is_denied(value, message):
    response, _ = admit(mig_pod(value), vendors=OFF)
    assert (response["allowed"], response["status"]) == (False, {"code": 403, "reason": "Forbidden",
                                                                 "message": message})


def test_without_an_allowlist_every_preference_is_denied():
    config = DeviceConfig.default()
    config.sections["nvidia"]["migProfileAllowlist"] = []
    response, _ = admit(mig_pod("3g"), vendors=build_vendors(config))
    assert response["status"]["message"].startswith('invalid nvidia.com/mig-profile-preference entry "3g"')
    # No preference, no question.
    assert admit(make_pod(container(limits={"nvidia.com/gpu": "1"})), vendors=build_vendors(config))[0]["allowed"]
