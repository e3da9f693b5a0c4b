"""``--filter-mode=all``: kube-scheduler keeps the choice of node; hami-py fits, scores and binds.

In the default mode (``best``, upstream's) ``/filter`` answers exactly one node, the one our node
policy prefers, and reserves its devices there: kube-scheduler's own scores (preferred node
affinity, topology spread, image locality, the user's plugins) never get a say for a device pod.
In ``all`` mode:

* ``/filter`` answers every node where the pod fits (``Filterer.evaluate``: the same single
  kernel call), reserves nothing and writes nothing. Its FilteringSucceed event stays bounded: the
  count and the best ``LISTED_NODE_SCORES`` of them, the node named first being our policy's
  favourite (kube-scheduler may choose another).
* ``/prioritize`` (``prioritizeVerb``) scores the nodes kube-scheduler still considers with the
  same policy (binpack or spread, the pod's policy annotations and scoring weights, the families'
  node-score deltas) on kube-scheduler's extender scale 0..``MAX_EXTENDER_PRIORITY``: the
  fitting nodes min-max over 1..10 (our favourite 10, our least favourite 1, all 10 when they
  tie), a node that no longer fits 0. kube-scheduler multiplies by the extender's ``weight`` and
  by MaxNodeScore/MaxExtenderPriority (10) and adds that to its plugins' 0..100 scores, so the
  weight sets how much our binpack or spread counts against them.
  kube-scheduler calls it in the same scheduling cycle as the filter, with the nodes the filter
  let through: when those are exactly the nodes this pod's last filter answered, less than
  ``LAST_FIT_S`` ago, their scores are that filter's (no second kernel run: at 5 000 nodes that
  is half of the prioritize); otherwise the nodes are fitted again. Either way the bind fits the
  pod afresh, so a score a few milliseconds old decides nothing on its own.
* ``/bind`` on the node kube-scheduler chose fits the pod again on that node alone and reserves it
  there (``Filterer.decide`` on one candidate: synchronous, so two binds racing for the last room
  on a node cannot both get it), then binds exactly as in ``best`` mode (``Binder``: live
  reservation, node lock, Binding carrying the decision, undo on failure). A node that no longer
  fits is an ``Error`` naming the node and the reason: kube-scheduler runs the pod's scheduling
  cycle again.

The bind needs the pod's spec (its requests and annotations), which the bind arguments do not
carry. The pods filtered are remembered (the last ``REMEMBERED_PODS``, by UID; memory only, a
reference to the request's object) so the common bind costs the same two API requests as in
``best`` mode (the node lock and the Binding); a pod not remembered any more (evicted, a restart
between filter and bind) is read from the API server first.

Malformed ``/prioritize`` requests are answered ``[]`` with HTTP 200 (logged and counted by the
HTTP layer): kube-scheduler ignores an extender's prioritize failure ("No score given by this
extender"), and a list with no host gives exactly that, without an error in its log for every pod.

Unlike ``best`` mode, a filter that finds no node does not clear a void decision an older
scheduler left on the pod (scheduling/verbs/stale.py; it is a write, and this mode's filter writes
nothing): the books do not charge it (the filter releases it as ``decide`` does), and the pod's
Binding replaces it once it is placed.
"""
from __future__ import annotations

import re
import time
from bisect import bisect_right
from collections import OrderedDict
from itertools import chain, compress, repeat
from math import inf
from operator import neg, not_
from typing import Any

import orjson

from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.kernel_codes import POLICY_SPREAD
from hami_py.scheduling.verbs.bind import BindError, Binder, BindRequest
from hami_py.scheduling.decision.filter import Evaluation, FilterDecision, Filterer
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.decision.requests import parse_pod_requests

FILTER_MODES = ("best", "all")
MAX_EXTENDER_PRIORITY = 10      # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority
REMEMBERED_PODS = 1024          # pods filtered and not bound yet whose spec a bind reuses
LAST_FIT_S = 1.0                # a /prioritize this soon after the pod's /filter reuses its fit
_STR_ONLY = frozenset((str,))


class HostPriorities:
    """A HostPriorityList: node names and their 0..10 scores, written out as JSON in one pass."""

    __slots__ = ("names", "values")

    def __init__(self, names: list[str], values: list[int]):
        self.names = names
        self.values = values

    def as_list(self) -> list[dict]:
        return [{"Host": name, "Score": value} for name, value in zip(self.names, self.values)]

    def to_json(self) -> bytes:
        """``[{"Host":"n1","Score":10},...]``. Node names are DNS names, which JSON writes as they
        are: the names are encoded once, split, and interleaved with a prepared tail per score,
        at C speed (5 000 dicts took a few ms). Any other name goes through the plain way."""
        names, values = self.names, self.values
        if not names:
            return b"[]"
        if not _PLAIN_NAMES.fullmatch("".join(names)):
            return orjson.dumps(self.as_list())
        parts = orjson.dumps(names)[2:-2].split(b'","')
        tails = list(map(_NEXT.__getitem__, values))
        tails[-1] = _LAST[values[-1]]
        return b'[{"Host":"' + b"".join(chain.from_iterable(zip(parts, tails)))


_PLAIN_NAMES = re.compile(r"[A-Za-z0-9._-]*")
_NEXT = [b'","Score":%d},{"Host":"' % v for v in range(MAX_EXTENDER_PRIORITY + 1)]
_LAST = [b'","Score":%d}]' % v for v in range(MAX_EXTENDER_PRIORITY + 1)]


def host_priorities(node_names: list[str], fit: Evaluation) -> HostPriorities:
    """HostPriorityList for ``node_names`` from one kernel run over them (see the module doc)."""
    return _priorities(node_names, fit.query.out_status.tolist(), fit.query.out_score.tolist(),
                       fit.policies.node == POLICY_SPREAD)


def _priorities(node_names: list[str], status: list[int], scores: list[float], spread: bool) -> HostPriorities:
    """The fitting nodes min-max onto 1..10 by preference (the highest score under binpack, the
    lowest under spread), the others 0. A node's value is 1 + the number of the nine rounding
    thresholds its preference reaches, counted by ``bisect`` for every node at C speed."""
    n = len(node_names)
    preference = list(map(neg, scores)) if spread else scores
    fitting = list(compress(preference, map(not_, status)))
    if not fitting:
        return HostPriorities(node_names, [0] * n)
    lo, hi = min(fitting), max(fitting)
    if hi <= lo:
        values = [MAX_EXTENDER_PRIORITY] * n
    else:
        step = (hi - lo) / (MAX_EXTENDER_PRIORITY - 1)
        thresholds = [-inf] + [lo + (k - 0.5) * step for k in range(1, MAX_EXTENDER_PRIORITY)]
        values = list(map(bisect_right, repeat(thresholds), preference))
    for c in compress(range(n), status):
        values[c] = 0
    return HostPriorities(node_names, values)


class AllNodes:
    """The ``all`` filter mode's three verbs (the service calls them; see the module doc)."""

    def __init__(self, *, cache: UsageCache, vendors: dict[str, DeviceVendor], filterer: Filterer,
                 binder: Binder, client: KubeClient, events=None, remembered: int = REMEMBERED_PODS,
                 serving=lambda: True):
        """``serving()``: whether this replica may decide (its caches synced and it leads)."""
        self.cache = cache
        self.serving = serving
        self.vendors = vendors
        self.filterer = filterer
        self.binder = binder
        self.client = client
        self.events = events
        self.remembered = remembered
        self._pods: OrderedDict[str, dict] = OrderedDict()
        # The last successful filter: (uid, when, the nodes it answered, its Evaluation, their
        # positions in it). kube-scheduler's /prioritize for the same pod follows in the same
        # scheduling cycle, with those very nodes, and reuses the fit instead of running it again.
        self._last: tuple | None = None

    # ---------------------------------------------------------------- /filter
    def filter(self, pod: dict, node_names: list[str], request) -> tuple[list[str] | None, dict[str, str]]:
        """Every node of ``node_names`` where the pod fits (None when none does) and the failing
        nodes' reasons. Synchronous, and called under the pod's lock (service.py) for a pod that
        is neither bound nor deleted. Raises PolicyError for an unusable policy annotation."""
        uid = pod["metadata"]["uid"]
        # A pod filtered again never competes with its own earlier decision (void now, as in
        # Filterer.decide); there is none in this mode unless a bind of it failed half-way.
        self.cache.release_pod(uid)
        fit = self.filterer.evaluate(pod, node_names, request)
        if fit.best < 0:
            self._event(pod, "filter_failed", FilterDecision(None, fit.failed))
            return None, fit.failed
        status = fit.query.out_status
        positions = list(compress(range(len(node_names)), map(not_, status)))   # the fitting ones
        names = list(map(node_names.__getitem__, positions))
        self._last = (uid, time.monotonic(), names, fit, positions)
        fit_count, best = fit.listed()
        self._remember(uid, pod)
        self._event(pod, "filter_succeeded", FilterDecision(node_names[fit.best], fit.failed,
                                                            fit_count=fit_count, best=best))
        return names, fit.failed

    def _remember(self, uid: str, pod: dict) -> None:
        pods = self._pods
        pods[uid] = pod
        pods.move_to_end(uid)
        while len(pods) > self.remembered:
            pods.popitem(last=False)

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)

    # ---------------------------------------------------------------- /prioritize
    def prioritize(self, args: Any, *, synced: bool) -> tuple[HostPriorities, str | None]:
        """(HostPriorityList, None), or (an empty one, why) for a request that cannot be scored."""
        none = HostPriorities([], [])
        if not isinstance(args, dict):
            return none, "extender args must be a JSON object"
        a = {k.lower(): v for k, v in args.items()}
        pod = a.get("pod")
        if not isinstance(pod, dict) or not pod:
            return none, "extender args missing pod" if not pod else "extender args pod must be an object"
        node_names = a.get("nodenames")
        if node_names is None:
            return none, ("extender args have no NodeNames: prioritize scores from the scheduler's own "
                          "node cache (nodeCacheCapable: true)")
        if not isinstance(node_names, list) or not (self.cache.candidates.known(node_names)
                                                     or set(map(type, node_names)) <= _STR_ONLY):
            return none, "extender args NodeNames must be a list of node names"
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        except RequestError as exc:
            return none, f"pod {key}: {exc}"
        if request is None:
            return HostPriorities(node_names, [0] * len(node_names)), None   # not ours: no opinion
        if not synced:
            return none, "scheduler cache is not synced yet"
        last = self._last
        if last is not None and last[0] == meta.get("uid") and time.monotonic() - last[1] < LAST_FIT_S \
                and node_names == last[2]:
            # The nodes this pod's filter answered, moments ago: their scores from that fit.
            fit, positions = last[3], last[4]
            return _priorities(node_names, [0] * len(positions), list(map(fit.query.out_score.__getitem__, positions)),
                               fit.policies.node == POLICY_SPREAD), None
        try:
            fit = self.filterer.evaluate(pod, node_names, request)
        except PolicyError as exc:
            return none, f"pod {key}: {exc}"
        return host_priorities(node_names, fit), None

    # ---------------------------------------------------------------- /bind
    async def reserve_for_bind(self, req: BindRequest) -> None:
        """Fit the pod again on ``req.node`` alone and reserve it there, for the Binder to bind;
        BindError when it no longer fits. Called under the pod's lock. Leaves everything to the
        Binder when there is nothing to fit: a repeated bind (the reservation is there, or the
        pod is bound), or a pod that asks for no device."""
        cache = self.cache
        if req.uid and (cache.live_reservation(req.uid, req.node) is not None or cache.bound_node(req.uid)):
            return
        pod = self._pods.pop(req.uid, None) if req.uid else None
        if not self.serving():
            # A replica that does not lead (or has not synced) must not reserve: the leader may
            # be giving the same room to another pod. The leader's kube-scheduler filters again.
            raise BindError(f"pod {req.namespace}/{req.name}: this scheduler is not serving (not the leader, "
                            f"or its cache is not synced yet); filter it again")
        if pod is None:
            pod = await self._read_pod(req)
            if pod is None:
                return
            req.uid = pod["metadata"].get("uid") or ""
        key = f"{req.namespace}/{req.name}"
        if req.uid in cache.deleted:
            raise BindError(f"pod {key} with uid {req.uid} was deleted")
        try:
            request = parse_pod_requests(pod, self.vendors, cache.vendor_ids)
        except RequestError as exc:
            raise BindError(f"pod {key}: {exc}") from None
        if request is None:
            return
        try:
            decision = self.filterer.decide(pod, [req.node], request)
        except PolicyError as exc:
            raise BindError(f"calcScore failed {exc} for pod {req.name}") from None
        if decision.node is None:
            reason = decision.failed.get(req.node) or "node unregistered"
            message = f"pod {key} no longer fits on node {req.node}: {reason} (filter it again)"
            self.binder.report(pod, req, message)
            raise BindError(message)
        decision.keep_for_bind(pod)

    async def _read_pod(self, req: BindRequest) -> dict | None:
        """The pod from the API server (not remembered); None when it is already bound (the
        Binder answers that case)."""
        try:
            pod = await self.client.get(pod_path(req.namespace, req.name))
        except KubeApiError as exc:
            if exc.not_found:
                raise BindError(f'pod "{req.name}" not found') from None
            raise BindError(f"get pod {req.namespace}/{req.name}: {exc}") from None
        uid = (pod.get("metadata") or {}).get("uid")
        if req.uid and uid not in (None, req.uid):
            raise BindError(f"pod {req.namespace}/{req.name} has uid {uid}, not {req.uid}")
        if (pod.get("spec") or {}).get("nodeName"):
            return None
        return pod

    def _event(self, pod: dict, what: str, detail) -> None:
        if self.events is not None:
            self.events(pod, what, detail)
