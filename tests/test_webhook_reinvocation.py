"""The webhook's mutation is idempotent (HAMi #2936): ``reinvocationPolicy: IfNeeded``.

With IfNeeded the API server shows hami-py the pod again when a later webhook changed it, already
mutated by hami-py's first pass. A second pass must then change nothing: a review of the patched
pod answers no patch at all. Every family's demo pods (the table the kind demo and the simulator
use) and NVIDIA's and Ascend's environment defaults (priority, core policy, ``overwriteEnv``,
the runtime class) go through twice here; the first pass must have changed something, or the
case would show nothing.
"""
from __future__ import annotations

import copy

import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.fakeapi.families import MODELS, demo_pods
from tests.test_webhook import admit, container, make_pod


def _vendors():
    """Every family, with each environment default NVIDIA and Ascend have turned on."""
    config = DeviceConfig.default()
    config.sections["nvidia"].update(overwriteEnv=True, gpuCorePolicy="force", runtimeClassName="nvidia")
    for chip in config.sections["vnpus"]["configs"]:
        chip["overwriteEnv"] = True
    return build_vendors(config, FamilySwitches(enable_ascend=True, enable_iluvatar=True))


VENDORS = _vendors()


def _pods() -> list[tuple[str, dict]]:
    cases = []
    for model in MODELS:
        for pod in demo_pods(model, "team-a"):
            cases.append((f"{model.key}/{pod['metadata']['name']}", pod))
    cases += [
        ("nvidia-priority", make_pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}))),
        ("nvidia-memory-only", make_pod(container(limits={"nvidia.com/gpumem": "3000"}))),
        ("nvidia-whole-by-percentage", make_pod(container(limits={"nvidia.com/gpumem-percentage": "100"}))),
        ("no-device-beside-a-gpu", make_pod(container("sidecar"), container(limits={"nvidia.com/gpu": "1"}))),
        ("no-device-with-env", make_pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))),
        ("init-and-app", make_pod(container(limits={"nvidia.com/gpu": "2"}),
                                  init=[container("setup", limits={"nvidia.com/gpumem": "1000"})])),
    ]
    return cases


PODS = _pods()


@pytest.mark.parametrize("pod", [p for _, p in PODS], ids=[name for name, _ in PODS])
def test_a_second_pass_over_a_mutated_pod_patches_nothing(pod):
    first, mutated = admit(copy.deepcopy(pod), vendors=VENDORS)
    assert first["allowed"], first
    assert "patch" in first, "the first pass changed nothing: this case shows nothing"
    second, again = admit(copy.deepcopy(mutated), vendors=VENDORS)
    assert second["allowed"], second
    assert "patch" not in second and "patchType" not in second, second
    assert again == mutated


def test_every_family_is_passed_over_twice():
    families = {model.family for model in MODELS if model.demo_limits}
    assert {"ascend", "mthreads", "cambricon", "hygon", "iluvatar", "metax-sgpu"} <= families, families
    assert any("nvidia.com/gpu" in c["spec"]["containers"][-1]["resources"].get("limits", {}) for _, c in PODS)


def test_a_super_pod_910c_vnpu_is_admitted_again_as_it_was():
    """Its count of 1 was raised to one module (2 NPUs): the second pass reads 2 NPUs with a
    vNPU's memory, one module still, not "several devices"."""
    from hami_py.fakeapi.family_nodes import ascend_config
    config = DeviceConfig.default()
    chip = next(c for c in config.sections["vnpus"]["configs"] if c["commonWord"] == "Ascend910C")
    chip["superPod"] = True
    vendors = build_vendors(config, FamilySwitches(enable_ascend=True))
    memory = ascend_config("Ascend910C")["resourceMemoryName"]
    pod = make_pod(container(limits={"huawei.com/Ascend910C": "1", memory: "16384"}))
    first, mutated = admit(pod, vendors=vendors)
    assert first["allowed"] and mutated["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend910C"] == "2"
    second, _ = admit(mutated, vendors=vendors)
    assert second["allowed"] and "patch" not in second, second
    # Two modules with a vNPU's memory each are still refused.
    refused, _ = admit(make_pod(container(limits={"huawei.com/Ascend910C": "4", memory: "16384"})), vendors=vendors)
    assert refused["status"]["message"] == "vNPU not supported for multiple devices"


def test_a_variable_set_from_elsewhere_is_still_hidden_once():
    """Idempotent is not "never twice": a container whose own variable says otherwise (all GPUs,
    or a value from a source) gets the clearing one appended, once, and kept on the next pass."""
    for env in ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]):
        _, mutated = admit(make_pod(container(env=copy.deepcopy(env))), vendors=VENDORS)
        variables = [v for v in mutated["spec"]["containers"][0]["env"] if v["name"] == "NVIDIA_VISIBLE_DEVICES"]
        assert variables == [*env, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
        second, _ = admit(mutated, vendors=VENDORS)
        assert "patch" not in second
