"""bench/realk8s.py keeps working: a small run of the filter+bind throughput row (kube-scheduler's
pattern) against the session's real kube-apiserver, with hami-scheduler as a process of its own
running as its ServiceAccount. Its figures mean little here; that every pod is bound does."""
from __future__ import annotations

import pytest

from bench.realk8s import measure
from bench.seed import BENCH_NAMESPACE, NAMESPACES, ClusterShape, build_nodes

pytestmark = pytest.mark.real_k8s


async def test_a_small_real_bench_binds_every_pod(control_plane, real_kube, tmp_path):
    shape = ClusterShape(nodes=40, pods=80)
    try:
        result = await measure(control_plane, shape, schedule_pods=30, workdir=tmp_path, say=lambda _: None)
        row = result.row
        assert result.seeded["pods"] == 80
        assert row["attempted"] == 30 and row["filter"]["n"] == 30 and row["bind"]["n"] == 30, row
        assert row["bound"] == row["allocated"] >= 20 and row["pods_per_s"] > 0, row
        # As in `make bench`, a bind that still meets the lock of the pod before it on that node
        # after --node-lock-wait is not retried but counted: the only failure there may be.
        assert all(text.endswith("node lock contention") for text in row["errors"]), row["errors"]
        assert sum(row["errors"].values()) == 30 - row["bound"], row
    finally:
        for namespace in (*NAMESPACES, BENCH_NAMESPACE):
            for pod in await real_kube.list("pods", namespace=namespace):
                await real_kube.delete("pods", pod["metadata"]["name"], namespace=namespace)
        for node in build_nodes(shape):
            await real_kube.delete("nodes", node["metadata"]["name"], grace=None)
