"""The fake registrations of the non-NVIDIA families (hami_py.fakeapi.families), checked against
the scheduler's own family modules, and the simulator, the kind demo's patches and the mixed
example built on them.

Nothing here decides what a family's registration means but its module.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.base import NodeView
from hami_py.devices.registry import EVERY_FAMILY as SWITCHES, build_vendors
from hami_py.fakeapi.families import BY_KEY, find_device_model

ROOT = Path(__file__).resolve().parent.parent

# key -> (family module, vendor key, devices, MiB a device, registered type)
EXPECTED = {
    "ascend910b3": ("ascend", "Ascend910B3", 8, 65536, "Ascend910B3"),
    "ascend910b4": ("ascend", "Ascend910B4", 8, 32768, "Ascend910B4"),
    "ascend310p": ("ascend", "Ascend310P", 8, 21527, "Ascend310P"),
    "mlu370": ("cambricon", "MLU", 8, 49152, "MLU"),
    "z100": ("hygon", "DCU", 8, 32768, "Z100"),
    "kunlun": ("kunlun", "kunlun", 8, 98304, "kunlun"),
    "kunlun-vxpu": ("kunlun", "XPU", 8, 98304, "XPU"),
    "gcu": ("enflame", "GCU", 8, 100, "GCU"),
    "mthreads": ("mthreads", "Mthreads", 8, 49152, "Mthreads"),
    "biren": ("biren", "Biren", 8, 32768, "Biren"),
    "vastai": ("vastai", "Vastai", 8, 16384, "Vastai"),
    "vastai-die": ("vastai", "Vastai", 8, 8192, "Vastai"),
}


def family_vendors(module: str) -> dict:
    """The module's vendors by key (every family module builds at least one with the switches on)."""
    vendors = importlib.import_module(f"hami_py.devices.{module}").build_family(DeviceConfig.default(), SWITCHES)
    assert vendors, f"hami_py.devices.{module} builds no vendor"
    return {v.vendor_key: v for v in vendors}


def decoded(key: str, node_name: str = "node-a", **kwargs):
    module, vendor_key, *_ = EXPECTED[key]
    vendors = family_vendors(module)
    assert vendor_key in vendors, f"{module} builds {sorted(vendors)}, not {vendor_key}"
    node = BY_KEY[key].node(node_name, **kwargs)
    return vendors, vendors[vendor_key].parse_node_devices(NodeView.from_node(node)), node


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_builder_decodes_to_the_expected_devices(key):
    _, vendor_key, count, devmem, dev_type = EXPECTED[key]
    vendors, devices, node = decoded(key)
    assert len(devices) == count
    assert {d.devmem for d in devices} == {devmem}
    assert {d.type for d in devices} == {dev_type}
    assert [d.index for d in devices] == list(range(count))
    assert all(d.health for d in devices)
    assert len({d.id for d in devices}) == count
    # No other vendor of the family claims these devices.
    for other_key, other in vendors.items():
        if other_key != vendor_key:
            assert other.parse_node_devices(NodeView.from_node(node)) == []


@pytest.mark.parametrize("key", ["ascend910b3", "ascend910b4"])
def test_ascend_910_registers_network_ids(key):
    _, devices, _ = decoded(key)
    assert [d.custom.get("NetworkID") for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_ascend_310p_has_no_network_id():
    _, devices, _ = decoded("ascend310p")
    assert all("NetworkID" not in d.custom for d in devices)


@pytest.mark.parametrize("key", ["ascend910b3", "z100", "kunlun-vxpu"])
def test_unhealthy_devices_are_registered_unhealthy(key):
    _, devices, _ = decoded(key, unhealthy={2})
    assert [d.health for d in devices] == [i != 2 for i in range(8)]


def test_model_lookup_by_name_and_family():
    assert find_device_model("Ascend910B3").key == "ascend910b3"
    assert find_device_model("910b3").key == "ascend910b3"
    assert find_device_model("MLU370").key == "mlu370"
    assert find_device_model("P800").key == "kunlun"
    assert find_device_model("P800", "kunlun-vxpu").key == "kunlun-vxpu"
    assert find_device_model("H200") is not None and find_device_model("H200").family == "nvidia"
    assert find_device_model("nope") is None


# -- the kind demo's patches ------------------------------------------------------------------------

@pytest.mark.parametrize("fake_device", ["ascend910b3", "ascend910b4", "ascend310p", "mlu370", "kunlun",
                                         "kunlun-vxpu", "z100", "gcu", "mthreads", "biren", "vastai", "vastai-die"])
def test_kind_patch_decodes(fake_device):
    """What hack/kind/fake-gpu-nodes.sh applies for FAKE_DEVICE=<family>, decoded by the family."""
    module, vendor_key, count, devmem, _ = EXPECTED[fake_device]
    vendors = family_vendors(module)

    def patch(which: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "hami_py.fakeapi.families", "--family", fake_device,
                              "--node", "kind-worker", "--patch", which],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    meta, status = patch("metadata"), patch("status")
    node = {"metadata": {"name": "kind-worker", **meta["metadata"]}, "status": status["status"]}
    devices = vendors[vendor_key].parse_node_devices(NodeView.from_node(node))
    assert len(devices) == count and {d.devmem for d in devices} == {devmem}


@pytest.mark.parametrize("fake_device", ["ascend910b3", "mlu370", "kunlun", "kunlun-vxpu", "z100", "gcu",
                                         "mthreads", "biren", "vastai", "vastai-die"])
def test_kind_demo_pods_ask_for_the_family(fake_device):
    """The demo pods of each FAKE_DEVICE parse as requests of that family's vendor."""
    from hami_py.devices.registry import build_vendors
    from hami_py.scheduling.decision.requests import parse_pod_requests
    module, vendor_key, *_ = EXPECTED[fake_device]
    family_vendors(module)
    vendors = build_vendors(DeviceConfig.default(), SWITCHES)
    out = subprocess.run([sys.executable, "-m", "hami_py.fakeapi.families", "--family", fake_device,
                          "--demo-pods", "hami-demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines
    for line in lines:
        name, text = line.split("\t")
        pod = json.loads(text)
        pod["metadata"].setdefault("annotations", {})
        assert pod["metadata"]["name"] == name and pod["metadata"]["namespace"] == "hami-demo"
        request = parse_pod_requests(pod, vendors, {k: i for i, k in enumerate(vendors)})
        assert request is not None
        assert {key for per_container in request.per_container for key in per_container} == {vendor_key}


def test_kind_scripts_take_the_family_from_fake_device():
    env = (ROOT / "hack/kind/env.sh").read_text()
    assert "hami_py.fakeapi.families" in env and 'FAKE_DEVICE="${FAKE_DEVICE:-nvidia}"' in env
    assert "families --family" in (ROOT / "hack/kind/fake-gpu-nodes.sh").read_text()
    assert "--demo-pods" in (ROOT / "hack/kind/demo.sh").read_text()
    assert "export FAKE_DEVICE" in (ROOT / "Makefile").read_text()
    for line in subprocess.run([sys.executable, "-m", "hami_py.fakeapi.families", "--list"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.splitlines():
        assert line.split()[0] in BY_KEY


# -- the simulator -----------------------------------------------------------------------------------

def need_families(*modules: str) -> None:
    for module in modules:
        family_vendors(module)


def simulate_json(capsys, *args: str) -> dict:
    from hami_py.simulate.cli import main
    code = main([*args, "--output", "json", "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_mixed_example_places_every_family(capsys):
    """``hami-scheduler simulate`` on examples/mixed places NVIDIA, Ascend and Kunlun pods."""
    need_families("ascend", "kunlun")
    report = simulate_json(capsys, "--cluster", str(ROOT / "examples/mixed/cluster.yaml"),
                           "--workload", str(ROOT / "examples/mixed/workload.yaml"))
    summary = report["summary"]
    assert summary["pending"] == 0 and summary["placed"] == summary["pods"]
    by_vendor = summary["devicesByVendor"]
    assert set(by_vendor) == {"NVIDIA", "Ascend910B3", "kunlun"}
    assert all(row["inUse"] > 0 for row in by_vendor.values())
    got = {}
    for pod in report["pods"]:
        vendors = {d["vendor"] for d in pod["devices"]}
        assert len(vendors) == 1, pod
        got.setdefault(pod["template"], set()).update(vendors)
        assert pod["node"].startswith({"NVIDIA": "h100", "Ascend910B3": "npu", "kunlun": "xpu"}[vendors.pop()])
    assert got == {"llm-serve": {"NVIDIA"}, "trainer": {"NVIDIA"}, "npu-infer": {"Ascend910B3"},
                   "npu-train": {"Ascend910B3"}, "xpu-train": {"kunlun"}}


def test_mixed_table_names_devices_by_family(capsys):
    need_families("ascend", "kunlun")
    from hami_py.simulate.cli import main
    assert main(["--cluster", str(ROOT / "examples/mixed/cluster.yaml"), "--workload",
                 str(ROOT / "examples/mixed/workload.yaml"), "--no-progress"]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    for vendor in ("NVIDIA", "Ascend910B3", "kunlun"):
        assert any(line.startswith(vendor + " ") for line in lines), vendor
    assert "8 Ascend910B3" in table and "8 kunlun" in table and "DEVICE MEMORY" in table
    assert not any(line.startswith("GPUs ") for line in lines)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("family,model,module,vendor,request_lines", [
    ("", "MLU370", "cambricon", "MLU", "device: MLU\n    gpumem: 12Gi\n    gpucores: 25"),
    ("", "Z100", "hygon", "DCU", "device: z100\n    gpumem: 8Gi"),
    ("kunlun-vxpu", "P800", "kunlun", "XPU", "device: XPU\n    gpumem: 24Gi"),
    ("", "S60", "enflame", "GCU", "device: gcu"),
    ("", "Ascend310P", "ascend", "Ascend310P", "device: Ascend310P\n    gpumem: 3Gi"),
    ("", "S4000", "mthreads", "Mthreads", "device: Mthreads\n    gpumem: 16Gi\n    gpucores: 4"),
    ("", "BR104", "biren", "Biren", "device: biren"),
    ("vastai-die", "VA1", "vastai", "Vastai", "device: Vastai\n    gpus: 2"),
])
def test_each_family_simulates(tmp_path, capsys, family, model, module, vendor, request_lines):
    need_families(module)
    cluster = write(tmp_path, "cluster.yaml", "nodes:\n  - name: box\n    count: 2\n    gpus: 4\n"
                    f"    model: {model}\n" + (f"    family: {family}\n" if family else ""))
    workload = write(tmp_path, "workload.yaml", f"pods:\n  - name: job\n    replicas: 3\n    {request_lines}\n")
    report = simulate_json(capsys, "--cluster", cluster, "--workload", workload)
    assert report["summary"]["placed"] == 3, report["pods"]
    assert set(report["summary"]["devicesByVendor"]) == {vendor}
    assert {d["vendor"] for p in report["pods"] for d in p["devices"]} == {vendor}


@pytest.mark.parametrize("group,message", [
    ("model: P800\n    family: tenstorrent", 'unknown family "tenstorrent"'),
    ("model: P800\n    memory: 48Gi", '"memory" does not apply to P800 nodes'),
    ("model: Ascend910B3\n    numaNodes: 2", '"numaNodes" does not apply to Ascend910B3 nodes'),
    ("model: H200\n    family: ascend", 'unknown model "H200" in family ascend'),
])
def test_cluster_family_errors(tmp_path, capsys, group, message):
    from hami_py.simulate.cli import main
    cluster = write(tmp_path, "cluster.yaml", f"nodes:\n  - name: box\n    gpus: 8\n    {group}\n")
    workload = write(tmp_path, "workload.yaml", "pods:\n  - name: job\n")
    assert main(["--cluster", cluster, "--workload", workload, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("entry,message", [
    ("device: kunlun\n    gpumem: 8Gi", "kunlun devices are given whole: no memory request"),
    ("device: amd-mi300", '"amd-mi300" is none of the scheduler\'s device vendors'),
    ("device: Ascend910B3\n    gpuType: A100", '"gpuType" is NVIDIA\'s'),
    ("device: MLU\n    gpumem: 1000", "MLU memory is asked in units of 256 MiB"),
])
def test_workload_device_errors(tmp_path, capsys, entry, message):
    need_families("ascend", "kunlun", "cambricon")
    from hami_py.simulate.cli import main
    cluster = write(tmp_path, "cluster.yaml", "nodes:\n  - name: box\n    gpus: 8\n    model: H200\n")
    workload = write(tmp_path, "workload.yaml", f"pods:\n  - name: job\n    {entry}\n")
    assert main(["--cluster", cluster, "--workload", workload, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_all_families_example_places_a_pod_of_every_family(capsys):
    """One ``hami-scheduler simulate`` run over examples/all-families: a cluster with every
    family the scheduler has, and a workload asking for each; every pod is placed, on a device of
    the family it asked for, and every family module of the registry has pods placed."""
    from hami_py.devices.registry import _families
    report = simulate_json(capsys, "--cluster", str(ROOT / "examples/all-families/cluster.yaml"),
                           "--workload", str(ROOT / "examples/all-families/workload.yaml"))
    vendors = build_vendors(DeviceConfig.default(), SWITCHES)
    summary = report["summary"]
    assert summary["pending"] == 0 and summary["placed"] == summary["pods"], [
        p for p in report["pods"] if not p.get("node")]
    placed_families = set()
    for pod in report["pods"]:
        keys = {d["vendor"] for d in pod["devices"]}
        assert len(keys) == 1, pod
        placed_families.add(vendors[keys.pop()].__class__.__module__.split(".")[2])
    # Remote GPUs are off in the chart's config (the simulator's): tests/test_family_remotegpu.py.
    every_family = {build.__module__.split(".")[2] for build in _families()} - {"remotegpu"}
    assert len(every_family) == 13
    assert placed_families == every_family, f"no pod placed for {sorted(every_family - placed_families)}"
