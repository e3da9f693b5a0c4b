"""The bind invariant under random sequences of calls, checked against a model after every step.

kube-scheduler's usual order is filter, then bind, once. The invariant has to hold for every
order: binds that fail and are retried as they are, retries after another pod took the capacity,
filters after a rollback, a scheduler restart between filter and bind, callers that leave while
their filter queues behind the pod's bind, nodes deleted between filter and bind. The machine
keeps its own model of each pod (what the scheduler told it) and requires the scheduler's
answers to follow from it: a pod whose decision is live binds; one whose decision was rolled
back, lost to a restart, or never made is refused. After every step the books are recounted from
the API server's objects, without the scheduler's help (a live decision, which /filter keeps in
the cache and the Binding writes, from the cache's record of a pod that exists unbound): bound
pods never hold more of a device than it has, the cache charges exactly the decisions that are
live or bound, a bound pod carries its decision and an unbound one none.
"""
from __future__ import annotations

import asyncio
import os

import aiohttp
import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from hami_py.embedded import wait_for
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from tests.conftest import assert_books_balance
from tests.reliability_helpers import LoopCluster, books_mismatch, explain_mismatch, finish_allocation, oversubscribed

GPU = {"type": "NVIDIA A10", "devmem": 24000, "devcore": 100}
REQUESTS = st.builds(dict, gpus=st.sampled_from((1, 1, 2)), gpumem=st.sampled_from((4000, 10000, 16000, 24000)),
                     gpucores=st.sampled_from((0, 30, 60)))
# Binds that fail for certain, before anything lands.
BIND_FAULTS = st.sampled_from([
    ("POST", r"/binding$", {"status": 500}),
    ("POST", r"/binding$", {"status": 409}),
    ("PATCH", r"/nodes/[^/]+$", {"status": 500}),        # the node lock's compare-and-set
])
# The model's states of a pod. (A decision is never carried over a restart: /filter writes
# nothing, so the pod of a decision not bound yet carries none.)
NEW, LIVE, ROLLED_BACK, BOUND = "new", "live", "rolled back", "bound"
CHARGED = (LIVE, BOUND)


class BindMachine(RuleBasedStateMachine):
    steps = 0   # operations run by every instance, for the count the test asserts

    def __init__(self):
        super().__init__()
        self.cluster = LoopCluster(device_plugin=False).__enter__()
        self.api = self.cluster.api
        self.pods: dict[str, tuple[str, str | None]] = {}   # name -> (state, node)
        self.serial = 0

    @property
    def app(self):
        return self.cluster.app

    def run(self, coro):
        return self.cluster.run(coro)

    def teardown(self):
        self.cluster.__exit__(None, None, None)

    @initialize(gpus=st.lists(st.integers(1, 2), min_size=2, max_size=3), split=st.integers(2, 4))
    def nodes(self, gpus, split):
        self.node_names = [f"n{i}" for i in range(len(gpus))]
        self.node_objects = {}
        for name, count in zip(self.node_names, gpus):
            self.node_objects[name] = gpu_node(name, devices=registration(name, gpus=count, split=split, model=GPU))
            self.api.create("nodes", self.node_objects[name])
        self.run(wait_for(lambda: all(n in self.app.cache.node_index_of for n in self.node_names), what="nodes"))

    # -- helpers ----------------------------------------------------------------------------

    def _in(self, *states: str) -> list[str]:
        return sorted(n for n, (state, _) in self.pods.items() if state in states)

    def _pick(self, pick: int, *states: str) -> str | None:
        names = self._in(*states)
        return names[pick % len(names)] if names else None

    def _stored(self, name: str) -> dict:
        return self.api.get("pods", name, namespace="default")

    async def _filter(self, name: str, candidates: list[str]) -> None:
        result = await self.cluster.extender.filter(self._stored(name), candidates)
        assert not result["Error"], result
        if result["NodeNames"]:
            self.pods[name] = (LIVE, result["NodeNames"][0])
        else:
            self.pods[name] = (NEW, None)   # fits nowhere: any earlier decision is void and cleared

    async def _bind(self, name: str, node: str) -> dict:
        return await self.cluster.extender.bind(self._stored(name), node)

    def _refused(self, name: str, node: str) -> str:
        return f"pod default/{name} has no device reservation on node {node} (filter it again)"

    # -- rules ------------------------------------------------------------------------------

    @rule(request=REQUESTS, picks=st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True))
    def create_and_filter(self, request, picks):
        self.serial += 1
        name = f"p{self.serial}"
        self.api.create("pods", gpu_pod(name, **request))
        self.pods[name] = (NEW, None)
        candidates = list(dict.fromkeys(self.node_names[p % len(self.node_names)] for p in picks))
        self.run(self._filter(name, candidates))

    @precondition(lambda self: self._in(LIVE))
    @rule(pick=st.integers(0, 1 << 16))
    def bind_live(self, pick):
        name = self._pick(pick, LIVE)
        node = self.pods[name][1]
        assert self.run(self._bind(name, node)) == {"Error": ""}, name
        finish_allocation(self.api, name, node)   # the device plugin's part
        self.pods[name] = (BOUND, node)

    @precondition(lambda self: self._in(LIVE))
    @rule(pick=st.integers(0, 1 << 16), fault=BIND_FAULTS)
    def bind_fails(self, pick, fault):
        name = self._pick(pick, LIVE)
        node = self.pods[name][1]
        method, path, kw = fault
        self.api.faults.add(method=method, path=path, times=5, **kw)
        try:
            assert self.run(self._bind(name, node))["Error"], name
        finally:
            self.api.faults.clear()
        self.pods[name] = (ROLLED_BACK, node)

    @precondition(lambda self: self._in(ROLLED_BACK, NEW, LIVE))
    @rule(pick=st.integers(0, 1 << 16), other=st.integers(0, 2))
    def bind_without_a_live_reservation(self, pick, other):
        """A bind retried as it is after a rollback or a restart, of a pod never placed, or of a
        live pod onto another node than its own: refused, nothing changes."""
        name = self._pick(pick, ROLLED_BACK, NEW, LIVE)
        state, node = self.pods[name]
        chosen = node if state == LIVE else None
        if chosen:
            node = next((n for n in self.node_names if n != node), None)
        node = node or self.node_names[other % len(self.node_names)]
        # A live pod's bind names another node than the one our /filter chose (HAMi v2.11's check).
        refused = (f"pod default/{name} was scheduled to node {chosen}, bind request names node {node}"
                   if chosen else self._refused(name, node))
        assert self.run(self._bind(name, node)) == {"Error": refused}
        assert not self._stored(name)["spec"].get("nodeName")

    @precondition(lambda self: self._in(ROLLED_BACK, NEW, LIVE))
    @rule(pick=st.integers(0, 1 << 16), picks=st.lists(st.integers(0, 2), max_size=3, unique=True))
    def filter_again(self, pick, picks):
        name = self._pick(pick, ROLLED_BACK, NEW, LIVE)
        self.run(self._filter(name, list(dict.fromkeys(self.node_names[p % len(self.node_names)] for p in picks))))

    @precondition(lambda self: self._in(LIVE))
    @rule()
    def restart_between_filter_and_bind(self):
        self.run(self.cluster.restart_scheduler())
        for name, (state, node) in self.pods.items():
            if state == LIVE:
                # The reservation went with the process and the pod carries nothing of it: the
                # new scheduler charges nothing and refuses the bind until it filters again.
                self.pods[name] = (ROLLED_BACK, node)

    @precondition(lambda self: self._in(LIVE))
    @rule(pick=st.integers(0, 1 << 16))
    def filter_during_the_pods_bind(self, pick):
        """A filter of the pod arrives while its bind's node lock write is on the wire: it does not
        queue behind the bind (kube-scheduler's serial cycle would wait with it) but answers at
        once that the bind is running, changes nothing, and the bind completes."""
        name = self._pick(pick, LIVE)
        node = self.pods[name][1]
        pod = self._stored(name)
        body = orjson.dumps({"Pod": pod, "NodeNames": self.node_names, "Nodes": None})

        async def scenario():
            hung = self.api.faults.add(method="PATCH", path=f"/nodes/{node}$", hang=True, times=1)
            bind = asyncio.create_task(self._bind(name, node))
            try:
                await wait_for(lambda: hung.hits == 1, what="the bind's node lock on the wire")
                async with aiohttp.ClientSession() as session:
                    async with session.post(f"{self.app.url}/filter", data=body,
                                            headers={"Content-Type": "application/json"}) as response:
                        answer = orjson.loads(await response.read())
                assert "its bind is still running" in answer["Error"] and not answer["NodeNames"], answer
                assert not bind.done(), "the filter waited for the pod's bind"
            finally:
                self.api.faults.clear()
            assert (await bind) == {"Error": ""}, name
        self.run(scenario())
        finish_allocation(self.api, name, node)
        self.pods[name] = (BOUND, node)

    @precondition(lambda self: self._in(LIVE))
    @rule(pick=st.integers(0, 1 << 16))
    def node_deleted_between_filter_and_bind(self, pick):
        name = self._pick(pick, LIVE)
        node = self.pods[name][1]
        self.api.delete("nodes", node)
        self.run(wait_for(lambda: node not in self.app.cache.nodes, what=f"{node} gone"))
        assert self.run(self._bind(name, node)) == {"Error": f"failed to get node {node}"}
        self.pods[name] = (ROLLED_BACK, node)
        self.api.create("nodes", self.node_objects[node])
        self.run(wait_for(lambda: node in self.app.cache.node_index_of, what=f"{node} back"))

    @precondition(lambda self: self.pods)
    @rule(pick=st.integers(0, 1 << 16), how=st.sampled_from(("delete", "succeed")))
    def pod_goes_away(self, pick, how):
        name = self._pick(pick, *{s for s, _ in self.pods.values()})
        if how == "delete":
            self.api.delete("pods", name, namespace="default")
        else:
            self.api.patch("pods", name, {"status": {"phase": "Succeeded"}}, namespace="default")
        del self.pods[name]

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def books_follow_the_model(self):
        if getattr(self, "node_names", None) is None:
            return
        type(self).steps += 1
        charged = set(self._in(*CHARGED))

        async def agree():
            try:
                await wait_for(lambda: not books_mismatch(self.api, self.app, only=charged), timeout=15,
                               what="the books to match the model")
            except TimeoutError:
                raise AssertionError("\n".join(books_mismatch(self.api, self.app, only=charged))
                                     + "\n" + explain_mismatch(self.api, self.app)) from None
        self.run(agree())
        over = oversubscribed(self.api, self.app, bound_only=True)
        assert not over, over
        for pod in self.api.list("pods"):
            node = pod["spec"].get("nodeName")
            decided = (pod["metadata"].get("annotations") or {}).get("hami.io/vgpu-node")
            # Bound: with its decision (the same write). Unbound: none (/filter writes nothing).
            assert decided == node, (pod["metadata"]["name"], node, decided)
        assert_books_balance(self.app)


OPERATIONS = int(os.environ.get("HAMI_BIND_OPERATIONS", "10000"))


def test_bind_invariant_holds_for_random_sequences_of_calls():
    BindMachine.steps = 0
    config = settings(max_examples=max(OPERATIONS // 40, 1), stateful_step_count=60, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    while BindMachine.steps < OPERATIONS:
        run_state_machine_as_test(BindMachine, settings=config)
    assert BindMachine.steps >= OPERATIONS
