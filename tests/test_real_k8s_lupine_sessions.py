"""The leader's remote-GPU session stubs against a real kube-apiserver, as hami-scheduler's account.

The real API server validates what the in-repo one takes on trust: the stub's name, labels,
ports and tolerations (a node name too long for a label value included), and it answers a
delete of a pod assigned to a node by marking it terminating (no kubelet confirms it here), which
the reconciler must wait out rather than fight. Run as ``hami-system/hami-scheduler`` with the
grants of manifests/rbac.yaml: the Role's pods create/delete are what these passes use.
"""
from __future__ import annotations

import pytest

from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.lupine_sessions import ENDPOINT_ENV, SESSION_LABEL, reconcile_session_stubs, stub_name
from tests.realk8s import SA_NAMESPACE, unique

pytestmark = pytest.mark.real_k8s

IMAGE = "alpine/socat:1.8"


def _server(name: str, ip: str, port: str = "") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"hami.io/lupine-server": port}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}


async def _stubs(kube) -> dict[str, dict]:
    pods = await kube.list("pods", namespace=SA_NAMESPACE, label_selector=SESSION_LABEL)
    return {p["spec"]["nodeName"]: p for p in pods}


async def test_stubs_are_valid_pods_follow_their_servers_and_wait_out_a_terminating_one(control_plane, real_kube):
    plain = unique("lupine")
    deep = f"{unique('lupine')}.{'a' * 50}.rack-1.example.com"        # too long for a label value
    gone = unique("gone")
    nodes = [_server(plain, "10.0.0.5"), _server(deep, "10.0.0.6", "24000")]
    client = KubeClient(await load_configuration(str(control_plane.sa_kubeconfig)), qps=0)
    try:
        for node in nodes:
            await real_kube.create("nodes", node)
        await real_kube.create("pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": stub_name(gone), "namespace": SA_NAMESPACE, "labels": {SESSION_LABEL: gone}},
            "spec": {"nodeName": gone, "containers": [{"name": "relay", "image": IMAGE}]}})

        # The servers as the scheduler's node watch knows them (tests/test_lupine_sessions.py).
        servers = {plain: "10.0.0.5:14833", deep: "10.0.0.6:24000"}

        async def reconcile():
            return await reconcile_session_stubs(client=client, namespace=SA_NAMESPACE, image=IMAGE, servers=servers)

        done = await reconcile()
        assert sorted(done.created) == sorted([stub_name(plain), stub_name(deep)]) and not done.failed, done
        assert done.deleted == [stub_name(gone)]
        stubs = await _stubs(real_kube)
        relay = stubs[deep]["spec"]["containers"][0]
        assert relay["env"] == [{"name": ENDPOINT_ENV, "value": "10.0.0.6:24000"}]
        assert relay["ports"][0]["containerPort"] == 24000
        assert len(stubs[deep]["metadata"]["labels"][SESSION_LABEL]) <= 63
        assert stubs[gone]["metadata"].get("deletionTimestamp")      # assigned: waits for a kubelet
        uids = {n: p["metadata"]["uid"] for n, p in stubs.items()}

        again = await reconcile()
        assert (again.created, again.deleted, again.failed) == ([], [], []), again
        assert {n: p["metadata"]["uid"] for n, p in (await _stubs(real_kube)).items()} == uids

        await real_kube.patch("nodes", plain, {"metadata": {"labels": {"hami.io/lupine-server": None}}})
        del servers[plain]
        dropped = await reconcile()
        assert dropped.deleted == [stub_name(plain)] and not dropped.created, dropped
        # Terminating now (no kubelet here): neither deleted again nor replaced under its name.
        assert (await _stubs(real_kube))[plain]["metadata"].get("deletionTimestamp")
        assert (await reconcile()).deleted == []
    finally:
        await client.close()
        for name in (plain, deep, gone):
            await real_kube.delete("pods", stub_name(name), namespace=SA_NAMESPACE)
        for node in nodes:
            await real_kube.delete("nodes", node["metadata"]["name"], grace=None)
