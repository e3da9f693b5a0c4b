"""Which pod annotations only this scheduler and the device plugins may write, and who they are.

Device plugins hand out devices from a pod's decision annotations, so a decision written by anyone
else would be served outside the books and outside its namespace's quota; the defragmenter's
``hami.io/defrag-hold`` keeps freed devices for one pod, away from every other. The webhook
(scheduling/admission/rules.py) refuses a pod created with any of these keys, and an update that
changes one unless the API server says its author may write Nodes (a SubjectAccessReview,
hami_py/k8s/accessreview.py) and the pod is this scheduler's; manifests/admission-policy.yaml
holds the same rule in the API server itself, the scheduler up or down. The keys come from the
device registry (each family's allocation and decision keys), never from a list of vendors here.
"""
from __future__ import annotations

import functools
from typing import Mapping

from hami_py.cache.pod_ledger import VGPU_NODE_ANNOTATION
from hami_py.cache.records import BIND_PHASE_ANNOTATION
from hami_py.devices.base import DeviceVendor
from hami_py.scheduling.verbs.bind import BIND_TIME_ANNOTATION
from hami_py.scheduling.decision.filter import VGPU_TIME_ANNOTATION
from hami_py.scheduling.eviction.defrag_holds import HOLD_ANNOTATION
from hami_py.scheduling.verbs.stale import decision_keys

# The decision's keys every family shares: the Binding writes the node, the times and
# bind-phase "allocating"; the device plugin answers in bind-phase.
GENERIC_OWNED_ANNOTATIONS = (VGPU_NODE_ANNOTATION, VGPU_TIME_ANNOTATION, BIND_PHASE_ANNOTATION, BIND_TIME_ANNOTATION)
# Owned, and no decision: the defragmenter's hold (written by `hami-scheduler defrag --execute`,
# whose operator therefore needs the right to write Nodes; the scheduler only reads it).
OWNED_BESIDE_DECISIONS = (HOLD_ANNOTATION,)


def scheduler_owned_annotations(vendors: Mapping[str, DeviceVendor]) -> frozenset[str]:
    """Every pod annotation only HAMi's components may write: the decision's keys
    (``decision_annotations``) and the defragmenter's hold."""
    return _owned_of(tuple(vendors.values())) | _BESIDE


def decision_annotations(vendors: Mapping[str, DeviceVendor]) -> frozenset[str]:
    """The keys of a decision, which only a scheduler (or, once bound, a device plugin) writes:
    the generic ones and every family's allocation and decision keys. What a replacement pod
    or a pending pod's copy is cleared of (the defragmenter's planner).

    A family's ``pod_marks`` are left out, even if a family listed one among its decision keys:
    they are kept with a pod's charge because users set them (a card's QoS policy, an app
    class) and the family's choice reads them back, so refusing them would refuse ordinary pods.
    """
    return _owned_of(tuple(vendors.values()))


_BESIDE = frozenset(OWNED_BESIDE_DECISIONS)


@functools.lru_cache(maxsize=16)
def _owned_of(vendors: tuple[DeviceVendor, ...]) -> frozenset[str]:
    # Once per set of vendors (the app's is fixed at start): gathering the keys of every family
    # costs some 80 µs, and every pod created in the cluster asks. The decision's keys are the
    # ones a stale decision is cleared of (scheduling/verbs/stale.py), plus what the Binding adds.
    keys = {*decision_keys(dict(enumerate(vendors))), *GENERIC_OWNED_ANNOTATIONS}
    return frozenset(keys - {k for vendor in vendors for k in vendor.pod_marks})


def owned_phrase(keys: list[str]) -> str:
    # One key in upstream's words; several named together rather than one at a time.
    if len(keys) == 1:
        return f"annotation {keys[0]} is written by the scheduler and"
    return f"annotations {', '.join(keys)} are written by the scheduler and"
