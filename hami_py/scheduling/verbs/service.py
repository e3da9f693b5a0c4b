"""The extender verbs as kube-scheduler sees them: ExtenderArgs in, ExtenderFilterResult out.

This is the scheduling layer's front door. It owns the entry semantics of upstream's
``PredicateRoute`` (missing pod, no node list, waiting for the cache, pass-through of pods with no
device request), the pod lock shared by a pod's filters and binds, and the Nodes path. A filter
decides and reserves in the usage cache and writes nothing: the decision reaches the pod with its
Binding (scheduling/verbs/bind.py).
"""
from __future__ import annotations

import asyncio
from typing import Any

import structlog

from hami_py.aio import cancel_and_wait
from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.k8s.client import KubeClient
from hami_py.k8s.nodelock import go_duration
from hami_py.metrics import count_outcome
from hami_py.scheduling.verbs.bind import BindError, Binder, BindRequest
from hami_py.scheduling.verbs.identity import PodIdentity, Refused, require_uid
from hami_py.scheduling.eviction.defrag_holds import DefragHolds
from hami_py.scheduling.decision.filter import FilterDecision, Filterer
from hami_py.scheduling.gangs.planner import Gangs
from hami_py.scheduling.verbs.podlocks import PodBusy, PodLocks
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.verbs.preempt_verb import PreemptArgsError, process_preemption
from hami_py.scheduling.verbs.prioritize import FILTER_MODES, AllNodes, HostPriorities
from hami_py.scheduling.eviction.victims import VictimSearch
from hami_py.scheduling.decision.requests import parse_pod_requests
from hami_py.scheduling.verbs.stale import clear_stale_decision, may_carry_decision

log = structlog.get_logger(__name__)
# How long a /bind may take before its caller is answered (the bind runs on to its end): well
# inside kube-scheduler's httpTimeout (30 s in HAMi's chart and manifests/scheduler-config.yaml).
BIND_ANSWER_S = 25.0
_STR_ONLY = frozenset((str,))   # NodeNames from orjson: exact str, checked at C speed


def filter_result(*, nodes: Any = None, node_names: Any = None, failed: Any = None, error: str = "") -> dict:
    """ExtenderFilterResult with every field present, in upstream's order."""
    return {"Nodes": nodes, "NodeNames": node_names, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": None, "Error": error}


def lower_keys(obj: dict) -> dict:
    """Go's JSON decoder matches field names case-insensitively; so do we."""
    return {k.lower(): v for k, v in obj.items()} if isinstance(obj, dict) else {}


class SchedulerService:
    def __init__(self, *, cache: UsageCache, vendors: dict[str, DeviceVendor], client: KubeClient,
                 binder: Binder, filterer: Filterer, sync_timeout_s: float = 30.0, events=None,
                 preemptor=None, filter_mode: str = "best", bind_answer_s: float = BIND_ANSWER_S,
                 background_client: KubeClient | None = None, metrics=None):
        self.cache = cache
        self.vendors = vendors
        self.client = client
        # Stale-decision cleanups draw on the background bucket: a pod's lock and Binding never
        # wait behind them.
        self.background_client = background_client or client
        self.metrics = metrics   # hami_py.metrics.Metrics: the allocation outcomes (count_outcome)
        self.binder = binder
        self.filterer = filterer
        self.sync_timeout_s = sync_timeout_s
        self.synced = asyncio.Event()
        self.events = events
        self.pod_locks = PodLocks()   # a pod's filters and binds run one at a time
        # Who a request is about: the live pod it names (scheduling/verbs/identity.py).
        self.identity = PodIdentity(cache=cache, client=client)
        self.bind_answer_s = bind_answer_s
        # Binds still running after their answer, and the work filters leave for after theirs.
        self._unanswered: set[asyncio.Future] = set()
        # --device-preemption (scheduling/eviction/preempting.py): None when off.
        self.preemptor = preemptor
        # The defragmenter's holds (scheduling/eviction/defrag_holds.py): always on. The app feeds it the
        # pod watch (observe) and its requeue hook (on_waiting).
        self.defrag_holds = DefragHolds(cache=cache, filterer=filterer, vendors=vendors, metrics=metrics,
                                        enabled=self.synced.is_set)
        # Gangs (scheduling/gangs/): a gang's members reserved all together or not at all. The app
        # feeds it the pod and PodGroup watches and its wake-up hooks. Preemption passes members over.
        self.gangs = Gangs(cache=cache, filterer=filterer, vendors=vendors, metrics=metrics,
                           busy=self.pod_locks.busy)
        if preemptor is not None:
            preemptor.search.spared = self.gangs.book.is_member
        # --filter-mode=all (scheduling/verbs/prioritize.py): every fitting node, /prioritize, refit at bind.
        self.all_nodes = self._all_nodes(filter_mode)

    def _all_nodes(self, filter_mode: str) -> AllNodes | None:
        if filter_mode not in FILTER_MODES:
            raise ValueError(f"filter mode must be one of {', '.join(FILTER_MODES)}, not {filter_mode!r}")
        if filter_mode != "all":
            return None
        return AllNodes(cache=self.cache, vendors=self.vendors, filterer=self.filterer, binder=self.binder,
                        client=self.client, events=self.events, serving=self.synced.is_set)

    # ------------------------------------------------------------------ filter
    async def filter(self, args: Any) -> dict:
        if not isinstance(args, dict):
            return filter_result(error="extender args must be a JSON object")
        a = lower_keys(args)
        pod = a.get("pod")
        if not pod:
            return filter_result(error="extender args missing pod")
        if not isinstance(pod, dict):
            return filter_result(error="extender args pod must be an object")
        node_names = a.get("nodenames")
        nodes = a.get("nodes")
        try:
            request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        except RequestError as exc:
            return filter_result(error=f"pod {_pod_key(pod)}: {exc}")
        if request is None:
            # Not ours: hand back exactly what we were given.
            return filter_result(nodes=nodes, node_names=node_names)
        if node_names is None and nodes is None:
            return filter_result(error="extender args have neither NodeNames nor Nodes")
        if node_names is not None and not self._names_list(node_names):
            return filter_result(error="extender args NodeNames must be a list of node names")
        if node_names is None:
            return self._filter_nodes_path(pod, nodes, request)
        if not await self._wait_synced():
            return filter_result(error="scheduler cache is not synced yet")
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        if not meta.get("name"):
            return filter_result(error=f"pod {_pod_key(pod)}: extender args pod has no metadata.name or metadata.uid")
        # Waiting here (for the sync, leadership) is cancelled with the request when its caller
        # goes away (handler cancellation, set where app.py starts the servers): a caller that
        # gave up gets no reservation, no patch and no event. A filter never waits for the pod's
        # earlier filter or bind: kube-scheduler's scheduling cycle waits for this answer, and
        # every other pod with it.
        try:
            # The reservation is keyed by UID: without one it could never be matched to the
            # pod's watch events, and would leak.
            require_uid("filter", pod_key(pod), uid)
            async with self.pod_locks.try_hold(uid, "filter"):
                # The live pod it names, unassigned, under that UID, as the watch shows it, or
                # nothing is reserved and nothing released; a pod the watch has not shown yet is
                # read after the answer (its bind waits for that under the pod's lock).
                seen = self.identity.for_filter(pod)
                answer = await self._filter_live(pod, node_names, request)
                if not seen and uid in self.cache.pods:    # a reservation or a hold to confirm
                    self._confirm_after_answer(pod, request)
                return answer
        except Refused as refused:
            count_outcome(self.metrics, "filter", request.vendors, refused.reason)
            return filter_result(error=str(refused))
        except PodBusy as busy:
            namespace = meta.get("namespace") or "default"
            return filter_result(error=f"pod {namespace}/{meta['name']}: its {busy.holder} is still running "
                                       f"(kube-scheduler retries the pod)")

    def _names_list(self, node_names: Any) -> bool:
        """Whether NodeNames is a list of names: at once for a list equal to one the cache has
        mapped (kube-scheduler repeats its feasible list), else checked name by name at C speed."""
        return isinstance(node_names, list) and (self.cache.candidates.known(node_names)
                                                 or set(map(type, node_names)) <= _STR_ONLY)

    async def _filter_live(self, pod: dict, node_names: list[str], request) -> dict:
        meta = pod.get("metadata") or {}
        uid, name = meta["uid"], meta["name"]            # both checked by filter()
        namespace = meta.get("namespace") or "default"   # as decide() reserves it
        stale = may_carry_decision(self.cache, pod, uid)   # before decide drops the charge
        try:
            # A gang's member: placed with its gang or not at all (its planned decision, reserved
            # when the gang was planned; under --filter-mode=all too, its planned node alone).
            decision = self.gangs.resume(pod, node_names, request)
            if isinstance(decision, dict):
                count_outcome(self.metrics, "filter", request.vendors, "no_fit")
                return filter_result(failed=decision)
            # Room held for the pod (the defragmenter's, then a preemption's): its victims still
            # leaving is the answer; once they are gone, the decision on its held node.
            if decision is None:
                decision = self.defrag_holds.resume(pod, node_names, request)
            if isinstance(decision, dict):
                return filter_result(failed=decision)
            if decision is None and self.preemptor is not None:
                held = self.preemptor.resume(pod, node_names, request)
                if isinstance(held, dict):
                    return filter_result(failed=held)   # its victims are still leaving
                decision = held
            if decision is None and self.all_nodes is not None:
                return self._filter_all(pod, node_names, request)
            if decision is None:
                decision = self.filterer.decide(pod, node_names, request, defer_listing=True)
        except PolicyError as exc:
            # Upstream's wording: the weights are parsed while scoring.
            message = f"calcScore failed {exc} for pod {name}"
            self._event(pod, "filter_error", message)
            count_outcome(self.metrics, "filter", request.vendors, "internal")
            return filter_result(error=message)
        if decision.node is None:
            self._event(pod, "filter_failed", decision)
            count_outcome(self.metrics, "filter", request.vendors, "no_fit")
            failed = decision.failed
            work = []
            if stale:
                # decide() released the old decision (events still carrying it charge nothing), so
                # a cleanup that fails loses nothing. After the answer, under the pod's lock: no
                # newer decision of ours can be in flight while it runs.
                work.append(clear_stale_decision(client=self.background_client, cache=self.cache,
                                                 vendors=self.vendors, namespace=namespace, name=name, uid=uid))
            return filter_result(failed=self._fits_nowhere(pod, node_names, request, failed, work))
        # Nothing is written here: the reservation keeps the decision's annotations and the bind
        # carries them in its Binding, which the API server applies with spec.nodeName in one
        # write. A filter's latency is then the decision's alone, whatever the API server does,
        # and a decision kube-scheduler never binds leaves nothing on the pod.
        decision.keep_for_bind(pod)
        # The event and the outcome count wait until the answer is on its way: the loop runs
        # them next, before it reads another request.
        asyncio.get_running_loop().call_soon(self._placed, pod, decision, request.vendors)
        return filter_result(node_names=[decision.node])

    def _placed(self, pod: dict, decision: FilterDecision, vendors: set[str]) -> None:
        """What a placed pod's /filter records after its answer: FilteringSucceed, the outcome."""
        self._event(pod, "filter_succeeded", decision)
        count_outcome(self.metrics, "filter", decision.allocation or vendors, "none")

    def _filter_all(self, pod: dict, node_names: list[str], request) -> dict:
        """``--filter-mode=all``: every fitting node, nothing reserved, nothing written; a pod that
        fits nowhere may preempt (--device-preemption) as in best mode. The PolicyError of an
        unusable policy annotation goes to the caller (``_filter_live``), as decide's does."""
        names, failed = self.all_nodes.filter(pod, node_names, request)
        if names is not None:
            return filter_result(node_names=names)
        return filter_result(failed=self._fits_nowhere(pod, node_names, request, failed, []))

    # ------------------------------------------------------------------ prioritize
    def prioritize(self, args: Any) -> tuple[HostPriorities, str | None]:
        """HostPriorityList and None, or an empty one and the reason it cannot be scored."""
        if self.all_nodes is None:
            return HostPriorities([], []), "prioritize is served with --filter-mode=all only"
        return self.all_nodes.prioritize(args, synced=self.synced.is_set())

    def _filter_nodes_path(self, pod: dict, nodes: Any, request) -> dict:
        """``nodeCacheCapable: false``: fit against the node objects in the request, as upstream's
        filter simulation does (each node's inventory decoded from its own annotations, usage zero),
        with no reservation and no pod patch; the chosen node object comes back in ``Nodes``.

        Unlike upstream it does not wait for the live cache, which it never reads."""
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            return filter_result(error="extender args Nodes must be a NodeList with an items list")
        scratch = UsageCache(self.vendors)
        by_name = {}
        for node in items:
            name = (node.get("metadata") or {}).get("name")
            if isinstance(name, str) and name:
                scratch.upsert_node(node)
                by_name[name] = node
        filterer = Filterer(scratch, self.vendors, default_node_policy=self.filterer.default_node_policy,
                            default_gpu_policy=self.filterer.default_gpu_policy)
        try:
            decision = filterer.decide(pod, list(by_name), request, reserve=False, report_failed=True)
        except PolicyError as exc:
            return filter_result(error=str(exc))
        if decision.node is None:
            return filter_result(failed=decision.failed)
        return filter_result(nodes={"metadata": {}, "items": [by_name[decision.node]]}, failed=decision.failed)

    def _fits_nowhere(self, pod: dict, node_names: list[str], request, failed: dict[str, str],
                      work: list) -> dict[str, str]:
        """The FailedNodes of a pod that fits nowhere: with --device-preemption, its preemption
        begun (choice and hold now, evictions after the answer). ``work`` (a stale decision's
        cleanup) and the evictions run after the answer, in that order, under the pod's lock."""
        what = "cleanup"
        if self.preemptor is not None:
            answer, evictions = self.preemptor.begin(pod, node_names, request, failed)
            failed = answer or failed
            if evictions is not None:
                work = [*work, evictions]
                what = "preemption"
        if work:
            meta = pod["metadata"]
            self._follow_up(meta["uid"], _pod_key(pod), what, work)
        return failed

    def _confirm_after_answer(self, pod: dict, request) -> None:
        """The read a filter the watch could not vouch for leaves for after its answer."""
        meta = pod["metadata"]
        refused = lambda r: count_outcome(self.metrics, "filter", request.vendors, r.reason)  # noqa: E731
        self._follow_up(meta["uid"], _pod_key(pod), "confirmation", [self.identity.confirm_filtered(
            client=self.background_client, namespace=meta.get("namespace") or "default", name=meta["name"],
            uid=meta["uid"], on_refused=refused)])

    def _follow_up(self, uid: str, pod_key: str, what: str, work: list) -> None:
        """Work a filter leaves for after its answer (a stale decision's cleanup, a preemption's
        evictions: API calls kube-scheduler's scheduling cycle must not wait for), run in order
        under the pod's lock, claimed now, before this filter lets go of it."""
        async def in_order():
            try:
                for step in work:
                    await step
            finally:
                for step in work:
                    step.close()   # those a cancellation (shutdown) left unstarted: never awaited
        self._keep(self.pod_locks.follow_up(uid, what, in_order()), f"{what} of pod {pod_key}")

    async def _wait_synced(self) -> bool:
        if self.synced.is_set():
            return True
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
            # arrives as the wait ends, and a filter whose caller left would run all the same.
            async with asyncio.timeout(self.sync_timeout_s):
                await self.synced.wait()
            return True
        except TimeoutError:
            return False

    def _event(self, pod: dict, what: str, detail: FilterDecision | str) -> None:
        """``filter_succeeded`` / ``filter_failed`` carry the decision, ``filter_error`` the error
        text. The hook only queues (events.EventRecorder), so it never slows the answer."""
        if self.events is not None:
            self.events(pod, what, detail)

    # ------------------------------------------------------------------ preempt
    async def preempt(self, args: Any) -> tuple[dict, str]:
        """``preemptVerb`` (scheduling/verbs/preempt_verb.py): (ExtenderPreemptionResult, "") or
        (an empty result, the error), which the HTTP layer answers with a 500 as kube-scheduler
        reads extender failures."""
        if not await self._wait_synced():
            return {"NodeNameToMetaVictims": None}, "scheduler cache is not synced yet"
        search = self.preemptor.search if self.preemptor is not None else VictimSearch(
            self.cache, self.filterer, spared=self.gangs.book.is_member)
        try:
            return process_preemption(args, search=search, vendors=self.vendors,
                                      vendor_ids=self.cache.vendor_ids), ""
        except (PreemptArgsError, RequestError, PolicyError) as exc:
            return {"NodeNameToMetaVictims": None}, str(exc)

    # ------------------------------------------------------------------ bind
    async def bind(self, args: Any) -> dict:
        if not isinstance(args, dict):
            return {"Error": "binding args must be a JSON object"}
        a = lower_keys(args)
        req = BindRequest(name=str(a.get("podname") or ""), namespace=str(a.get("podnamespace") or ""),
                          uid=str(a.get("poduid") or ""), node=str(a.get("node") or ""))
        missing = [k for k, v in (("PodName", req.name), ("PodNamespace", req.namespace), ("Node", req.node)) if not v]
        if missing:
            return {"Error": f"binding args missing {', '.join(missing)}"}
        # Under the pod's lock, so no filter of the pod can release the reservation this bind
        # relies on. Waiting for the lock ends with the caller; the bind itself, once begun, runs
        # to its end even if the caller leaves: a lock taken or a Binding posted is never left
        # half undone. The caller is answered within bind_answer_s whatever the bind waits for
        # (the pod's lock, a node lock, a slow API server): kube-scheduler gives up after its
        # httpTimeout, and a bind still running then is reported in the pod's events and holds
        # the pod's lock to its end, so the pod's next /filter answers at once that it runs.
        key = req.uid or self.cache.uid_of(req.namespace, req.name, req.node) or f"{req.namespace}/{req.name}"
        started = asyncio.Event()
        work = asyncio.ensure_future(self._locked_bind(key, req, started))
        try:
            done, _ = await asyncio.wait([work], timeout=self.bind_answer_s)
        except asyncio.CancelledError:
            if not started.is_set():
                work.cancel()            # still waiting for the pod's lock: dropped with its caller
            else:
                self._keep(work, _bind_what(req))   # begun: it runs to its end, logged and reported there
            raise
        if not done:
            if not started.is_set():
                work.cancel()
                return {"Error": f"pod {req.namespace}/{req.name}: another bind of it is still running "
                                 f"after {go_duration(self.bind_answer_s)}"}
            self._keep(work, _bind_what(req))
            return {"Error": f"bind of pod {req.namespace}/{req.name} to node {req.node} is still running after "
                             f"{go_duration(self.bind_answer_s)}; its outcome goes to the pod's events"}
        try:
            work.result()
            return {"Error": ""}
        except BindError as exc:
            log.warning("bind failed", pod=f"{req.namespace}/{req.name}", node=req.node, error=str(exc))
            return {"Error": str(exc)}

    async def _locked_bind(self, key: str, req: BindRequest, started: asyncio.Event) -> None:
        async with self.pod_locks.hold(key, "bind"):
            started.set()
            held = self.cache.live_reservation(req.uid, req.node) if req.uid else None
            try:
                await self._bind(req)
            except BindError as exc:
                # Counted here, whether its caller still waits or not.
                families = [k for k, v in self.vendors.items() if held is not None and held.annotations
                            and v.allocated_annotation in held.annotations]
                rolled_back = held is not None and self.cache.pods.get(held.uid) is not held
                count_outcome(self.metrics, "bind", families, exc.reason, rolled_back=rolled_back)
                raise

    def _keep(self, work: asyncio.Future, what: str) -> None:
        """Work nobody waits for any more (a bind whose caller was answered, a filter's follow-up):
        kept until it ends (close() waits for it), its failure logged (a Binder has reported its
        own on the pod)."""
        self._unanswered.add(work)

        def ended(task: asyncio.Future) -> None:
            self._unanswered.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.warning("failed after its caller was answered", work=what, error=str(task.exception()))

        work.add_done_callback(ended)

    async def settled(self) -> None:
        """Wait until no work is left running after its answer (for tests)."""
        while self._unanswered:
            await asyncio.wait(list(self._unanswered))

    async def close(self) -> None:
        """At shutdown: the binds and follow-ups nobody waits for any more are let finish (a
        bind's lock and Binding, a preemption's evictions are never left half done) for up to a
        bind's answer time, then cancelled (one hung on an API server that never answers must not
        hold the shutdown); then the Binder's own work."""
        self.gangs.close()
        if self._unanswered:
            await asyncio.wait(list(self._unanswered), timeout=self.bind_answer_s)
            for work in list(self._unanswered):
                await cancel_and_wait(work)
        await self.binder.close()

    async def _bind(self, req: BindRequest) -> None:
        # Who and what first: the live pod under the request's UID, not assigned elsewhere, and
        # the node our /filter chose. A refusal binds, reserves and releases nothing.
        try:
            pod = await self.identity.for_bind(req.namespace, req.name, req.uid, req.node)
        except Refused as refused:
            raise BindError(str(refused), reason=refused.reason) from None
        if self.all_nodes is not None:
            await self.all_nodes.reserve_for_bind(req)   # the node kube-scheduler chose, fitted again
        await self.binder.bind(req, pod)



def _bind_what(req: BindRequest) -> str:
    return f"bind of pod {req.namespace}/{req.name} to node {req.node}"


def _pod_key(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

