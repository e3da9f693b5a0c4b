"""Remote GPUs ("lupine") in the offline tools: the cluster file describes servers and GPU-less
client nodes, ``hami-scheduler simulate`` places each remote-GPU pod on a client with one whole
server (and its reports show the server's cards used), ``hami-scheduler defrag`` plans over a dump
holding remote-GPU pods (moving one frees a whole server), and both turn the family on when the
cluster has servers and the device config names no remote-GPU resources.
"""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from hami_py.config import DeviceConfig
from hami_py.defrag import cli as defrag_cli
from hami_py.devices.registry import EVERY_FAMILY, build_vendors
from hami_py.offline.cluster import load_cluster
from hami_py.offline.remote_gpus import with_remote_gpus
from hami_py.offline.source import InputError, load_documents
from hami_py.simulate import cli as simulate_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
COUNT = "nvidia.com/remote-gpu"
SERVER_LABEL = "hami.io/lupine-server"
ALLOCATED = "hami.io/remote-gpu-devices-allocated"
ENDPOINT = "hami.io/lupine-endpoint"

CLUSTER = """\
nodes:
  - name: cpu
    count: 2
    gpus: 0
  - name: lupine
    family: remotegpu
    model: A100-40GB
    gpus: 2
"""


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _load(path: str, config: DeviceConfig | None = None):
    documents = load_documents(path)        # as the CLIs: parsed once, for the decision and the loader
    config, note = with_remote_gpus(documents, config or DeviceConfig.default())
    return load_cluster(path, vendors=build_vendors(config, EVERY_FAMILY), documents=documents), config, note


# -- the cluster file ------------------------------------------------------------------------------

def test_servers_and_clients_in_the_simulator_form(tmp_path):
    cluster, config, note = _load(_write(tmp_path, "c.yaml", CLUSTER))
    assert cluster.node_names == ["cpu-0", "cpu-1", "lupine"]
    assert cluster.devices["cpu-0"] == [] and cluster.devices["cpu-1"] == []
    cards = cluster.devices["lupine"]
    assert [(d.type, d.devmem, d.count, d.custom["model"]) for d in cards] == \
        [("RemoteGPU", 40960, 1, "NVIDIA A100-SXM4-40GB")] * 2
    server = cluster.nodes[2]
    assert SERVER_LABEL in server["metadata"]["labels"]
    # the endpoint is the server's InternalIP: a benchmarking address no host answers on
    assert cards[0].custom["endpoint"].startswith("198.1") and cards[0].custom["endpoint"].endswith(":14833")
    assert config.sections["remotegpu"]["resourceCountName"] == COUNT
    assert note and COUNT in note


def test_the_section_is_turned_on_only_for_a_cluster_with_servers(tmp_path):
    default = DeviceConfig.default()
    plain = _write(tmp_path, "plain.yaml", "nodes:\n  - {name: g, gpus: 2, model: A100-40GB}\n")
    assert with_remote_gpus(load_documents(plain), default) == (default, None)
    assert with_remote_gpus(None, default) == (default, None)
    # a config naming its own resources is kept as given (only the servers' metrics are not read)
    own = DeviceConfig.default()
    own.sections["remotegpu"] = {"resourceCountName": "example.com/rgpu", "defaultPort": 9000}
    config, note = with_remote_gpus(load_documents(_write(tmp_path, "c.yaml", CLUSTER)), own)
    assert note is None
    assert config.sections["remotegpu"] == {"resourceCountName": "example.com/rgpu", "defaultPort": 9000,
                                            "readServerMetrics": False}
    vendor = build_vendors(config, EVERY_FAMILY)["RemoteGPU"]
    assert vendor.resource_names() == ["example.com/rgpu"]
    assert vendor.background(None) == []        # offline, no server is polled


@pytest.mark.parametrize("text,field,problem", [
    ("nodes:\n  - {name: cpu, gpus: 0, model: A100-40GB}\n", "nodes[0].model",
     '"model" does not apply to a node without devices (gpus: 0)'),
    ("nodes:\n  - {name: cpu, gpus: 0}\n  - {name: g, gpus: 1, model: T4}\n", "nodes[0].gpus",
     "a node without devices hosts only pods asking for remote GPUs, and the remote-GPU family is off"),
])
def test_gpu_less_nodes_errors_name_the_field(tmp_path, text, field, problem):
    path = _write(tmp_path, "c.yaml", text)
    with pytest.raises(InputError) as err:
        _load(path)
    assert field in str(err.value) and problem in str(err.value), str(err.value)


def test_servers_without_the_family_are_a_clear_error(tmp_path):
    path = _write(tmp_path, "c.yaml", CLUSTER)
    with pytest.raises(InputError, match="remote-GPU servers need the device config's remotegpu section"):
        load_cluster(path, vendors=build_vendors(DeviceConfig.default(), EVERY_FAMILY))


# -- simulate ----------------------------------------------------------------------------------

def test_simulate_gives_each_remote_pod_one_whole_server_on_a_client_node(capsys):
    args = ["--cluster", str(EXAMPLES / "remote-gpu/cluster.yaml"),
            "--workload", str(EXAMPLES / "remote-gpu/workload.yaml"), "--no-progress", "--output", "json"]
    assert simulate_cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("nvidia.com/remote-gpu" in note for note in report["notes"])
    pods = {p["name"]: p for p in report["pods"]}
    servers = {}
    for name in ("remote-train-0", "remote-train-1"):
        pod = pods[name]
        assert pod["state"] == "running" and pod["node"].startswith("cpu-"), pod
        held = {d["uuid"].split("/")[0] for d in pod["devices"]}
        assert len(held) == 1, pod          # one server, every card of it
        servers[name] = (held.pop(), len(pod["devices"]))
    # the smallest server first, then the next: each given whole though the pod asks one card
    assert servers == {"remote-train-0": ("lupine-small", 2), "remote-train-1": ("lupine-big", 4)}
    assert pods["remote-train-2"]["state"] == "pending"
    assert "ExclusiveDeviceAllocateConflict" in pods["remote-train-2"]["reason"]
    # the servers' cards are used in the report, charged whole
    nodes = {n["name"]: n for n in report["nodes"]}
    for server in ("lupine-small", "lupine-big"):
        assert all(g["slots"]["used"] == 1 and g["memory"]["percent"] == 100.0 for g in nodes[server]["gpus"])
    assert report["summary"]["devicesByVendor"]["RemoteGPU"]["inUse"] == 6
    assert all(p["node"] == "local" for n, p in pods.items() if n.startswith("local-infer"))


def test_simulate_table_names_the_servers_cards(capsys):
    args = ["--cluster", str(EXAMPLES / "remote-gpu/cluster.yaml"),
            "--workload", str(EXAMPLES / "remote-gpu/workload.yaml"), "--no-progress", "--detail"]
    assert simulate_cli.main(args) == 0
    out = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.out.splitlines() if line.startswith("default/remote-train-0")}
    assert "RemoteGPU #0 40960 MiB 100% cores, RemoteGPU #1 40960 MiB 100% cores" in rows["default/remote-train-0"]
    assert "metrics unreadable" not in out.err        # no server is polled offline


# -- defrag --------------------------------------------------------------------------------------

def _card(uuid: str, index: int = 0) -> dict:
    return {"id": uuid, "index": index, "count": 10, "devmem": 40960, "devcore": 100, "type": "NVIDIA-A100",
            "numa": 0, "mode": "remote", "health": True}


def _server(name: str, ip: str, cards: list[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, SERVER_LABEL: ""},
                         "annotations": {"hami.io/node-nvidia-register": orjson.dumps(cards).decode(),
                                         "hami.io/node-handshake": "Reported 2026-01-01 00:00:00"}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}}}


def _client(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def _pod(name: str, cards: int, *, node: str | None = None, allocated: str = "", endpoint: str = "") -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
           "spec": {"schedulerName": "hami-scheduler",
                    "containers": [{"name": "main", "image": "pytorch:2", "resources": {"limits": {COUNT: str(cards)}}}]},
           "status": {"phase": "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"rs-{name}",
                                               "uid": f"rs-uid-{name}", "controller": True}]
        pod["metadata"]["annotations"] = {"hami.io/vgpu-node": node, "hami.io/bind-phase": "success",
                                          ALLOCATED: allocated, "hami.io/remote-gpu-devices-to-allocate": allocated,
                                          ENDPOINT: endpoint}
    return pod


def _dump(tmp_path: Path) -> str:
    """gpu-a (two cards) serves p1, which asks one card (gpu-b and gpu-c were taken when it came);
    q, pending, asks two cards: only gpu-a has two."""
    items = [_server("gpu-a", "10.0.0.2", [_card("GPU-A0"), _card("GPU-A1", 1)]),
             _server("gpu-b", "10.0.0.3", [_card("GPU-B0")]), _server("gpu-c", "10.0.0.4", [_card("GPU-C0")]),
             _client("cpu-0"), _client("cpu-1"),
             _pod("p1", 1, node="cpu-1", allocated="gpu-a/GPU-A0,RemoteGPU,40960,100:gpu-a/GPU-A1,RemoteGPU,40960,100:;",
                  endpoint="10.0.0.2:14833"),
             _pod("q", 2)]
    return _write(tmp_path, "dump.json", orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}).decode())


def test_a_dump_keeps_client_nodes_and_the_servers_addresses(tmp_path):
    cluster, _, note = _load(_dump(tmp_path))
    assert note is not None
    assert set(cluster.node_names) == {"gpu-a", "gpu-b", "gpu-c", "cpu-0", "cpu-1"}
    assert [d.custom["endpoint"] for d in cluster.devices["gpu-b"]] == ["10.0.0.3:14833"]
    assert any("kept 2 node(s) without devices" in n for n in cluster.notes)
    assert [p["metadata"]["name"] for p in cluster.existing_pods] == ["p1"]


def test_defrag_moves_a_remote_pod_to_free_the_server_a_pending_pod_needs(tmp_path, capsys):
    assert defrag_cli.main(["--cluster", _dump(tmp_path), "--output", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["satisfied"] and [m["pod"] for m in plan["moves"]] == ["default/p1"]
    assert [(p["pod"], p["after"]) for p in plan["placements"]] == [("default/q", ["default/p1"])]


def test_defrag_free_counts_the_remote_pods_charged_on_a_server(tmp_path, capsys):
    """gpu-a's cards are charged to p1, which runs on cpu-1: freeing them takes p1's move."""
    assert defrag_cli.main(["--cluster", _dump(tmp_path), "--free", "2", "--output", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["satisfied"], plan
    assert [m["pod"] for m in plan["moves"]] == ["default/p1"]
    assert sorted(d["id"] for d in plan["freedDevices"]) == ["gpu-a/GPU-A0", "gpu-a/GPU-A1"]


async def test_defrag_of_a_live_cluster_turns_the_family_on_for_its_servers(api, tmp_path, capsys):
    """``defrag --kubeconfig``: the dump's objects served by the in-repo API server, the chart's
    default device config (no remotegpu section). The servers listed turn the family on as for
    the dump (and say so), so the same plan, and nothing is written without --execute."""
    import asyncio

    from hami_py.fakeapi import write_kubeconfig

    items = orjson.loads(Path(_dump(tmp_path)).read_text())["items"]
    for item in items:
        api.create("nodes" if item["kind"] == "Node" else "pods", item)
    nodes = [i["metadata"]["name"] for i in items if i["kind"] == "Node"]
    versions = {n: api.get("nodes", n)["metadata"]["resourceVersion"] for n in nodes}
    kubeconfig = str(write_kubeconfig(str(tmp_path / "kubeconfig"), api.url))
    # main() runs its own event loop: in a thread, while this one serves the API.
    code = await asyncio.to_thread(defrag_cli.main, ["--kubeconfig", kubeconfig, "--output", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = json.loads(out.out)
    assert plan["satisfied"] and [m["pod"] for m in plan["moves"]] == ["default/p1"]
    assert [(p["pod"], p["after"]) for p in plan["placements"]] == [("default/q", ["default/p1"])]
    code = await asyncio.to_thread(defrag_cli.main, ["--kubeconfig", kubeconfig, "--output", "table"])
    out = capsys.readouterr()
    assert code == 0 and f"using {COUNT} and {COUNT}-memory" in out.out, out.out
    assert {n: api.get("nodes", n)["metadata"]["resourceVersion"] for n in nodes} == versions
    assert api.get("pods", "q", "default")["spec"].get("nodeName") is None


def test_a_live_clusters_objects_decide_as_a_dumps():
    from hami_py.offline.remote_gpus import with_remote_gpus_listed
    default = DeviceConfig.default()
    client = _client("cpu-0")
    assert with_remote_gpus_listed([client], default) == (default, None)
    config, note = with_remote_gpus_listed([client, _server("gpu-a", "10.0.0.2", [_card("GPU-A0")])], default)
    assert note and config.sections["remotegpu"] == {"resourceCountName": COUNT, "resourceMemoryName": f"{COUNT}-memory",
                                                     "readServerMetrics": False}
    # a config naming its own resources is kept; its servers are still not polled
    own = DeviceConfig.default()
    own.sections["remotegpu"] = {"resourceCountName": "example.com/rgpu"}
    config, note = with_remote_gpus_listed([client], own)
    assert note is None and config.sections["remotegpu"] == {"resourceCountName": "example.com/rgpu",
                                                             "readServerMetrics": False}
