"""Which pod annotations only this scheduler and the device plugins may write, and who they are.

Device plugins hand out devices from a pod's decision annotations, so a decision written by anyone
else would be served outside the books and outside its namespace's quota. The webhook
(scheduling/admission/rules.py) refuses a pod created with any of these keys, and an update that changes
one unless a ServiceAccount makes it on a pod of this scheduler. The keys come from the device
registry (each family's allocation and decision keys), never from a list of vendors here.
"""
from __future__ import annotations

import functools
from typing import Mapping

from hami_py.cache.pod_ledger import VGPU_NODE_ANNOTATION
from hami_py.cache.records import BIND_PHASE_ANNOTATION
from hami_py.devices.base import DeviceVendor
from hami_py.scheduling.verbs.bind import BIND_TIME_ANNOTATION
from hami_py.scheduling.decision.filter import VGPU_TIME_ANNOTATION
from hami_py.scheduling.verbs.stale import decision_keys

# The username the API server reports for a ServiceAccount's token: system:serviceaccount:<ns>:<name>.
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# The decision's keys every family shares: the Binding writes the node, the times and
# bind-phase "allocating"; the device plugin answers in bind-phase (its own writes pass the
# UPDATE rule as a ServiceAccount's).
GENERIC_OWNED_ANNOTATIONS = (VGPU_NODE_ANNOTATION, VGPU_TIME_ANNOTATION, BIND_PHASE_ANNOTATION, BIND_TIME_ANNOTATION)


def scheduler_owned_annotations(vendors: Mapping[str, DeviceVendor]) -> frozenset[str]:
    """Every pod annotation only a scheduler (or, once bound, a device plugin) may write: the
    generic decision keys and every family's allocation and decision keys.

    A family's ``pod_marks`` are left out, even if a family listed one among its decision keys:
    they are kept with a pod's charge because users set them (a card's QoS policy, an app
    class) and the family's choice reads them back, so refusing them would refuse ordinary pods.
    """
    return _owned_of(tuple(vendors.values()))


@functools.lru_cache(maxsize=16)
def _owned_of(vendors: tuple[DeviceVendor, ...]) -> frozenset[str]:
    # Once per set of vendors (the app's is fixed at start): gathering the keys of every family
    # costs some 80 µs, and every pod created in the cluster asks. The decision's keys are the
    # ones a stale decision is cleared of (scheduling/verbs/stale.py), plus what the Binding adds.
    keys = {*decision_keys(dict(enumerate(vendors))), *GENERIC_OWNED_ANNOTATIONS}
    return frozenset(keys - {k for vendor in vendors for k in vendor.pod_marks})


def is_service_account(user: str) -> bool:
    """Whether ``user`` is a ServiceAccount's username (``system:serviceaccount:<ns>:<name>``)."""
    namespace, _, name = user[len(SERVICE_ACCOUNT_PREFIX):].partition(":") \
        if user.startswith(SERVICE_ACCOUNT_PREFIX) else ("", "", "")
    return bool(namespace) and bool(name) and ":" not in name


def owned_phrase(keys: list[str]) -> str:
    # One key in upstream's words; several named together rather than one at a time.
    if len(keys) == 1:
        return f"annotation {keys[0]} is written by the scheduler and"
    return f"annotations {', '.join(keys)} are written by the scheduler and"
