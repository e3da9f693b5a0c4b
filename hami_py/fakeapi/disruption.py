"""The in-repo API server's ``pods/eviction`` subresource and its PodDisruptionBudgets (policy/v1).

What the real API server does, in the parts a scheduler relies on:

* ``POST /api/v1/namespaces/<ns>/pods/<name>/eviction`` with a ``policy/v1`` ``Eviction`` whose
  ``metadata.name`` is the pod's (else 400); ``deleteOptions.preconditions.uid`` is honoured (409);
  a pod that does not exist is a 404;
* a pod that is Pending, Succeeded or Failed, or already terminating, is deleted without consulting
  any budget (it disrupts nothing that is running);
* more than one budget selecting the pod is a 500, as upstream refuses to choose;
* one budget: its ``desiredHealthy`` from ``minAvailable`` (a number, or a percentage of the
  matching pods rounded up) or ``maxUnavailable`` (the matching pods less that number, or less that
  percentage rounded up); ``currentHealthy``: its matching pods that are Running and Ready and not
  being deleted. A pod that is not Ready is let go while the budget is met (the default
  ``IfHealthyBudget``). ``disruptionsAllowed = currentHealthy - desiredHealthy``; at 0 or less the eviction
  is refused with 429 ``Cannot evict pod as it would violate the pod's disruption budget.`` and the
  cause naming the budget. Here the budget's status is computed on each eviction from the pods it
  selects, where the real one is written by kube-controller-manager's disruption controller; a
  budget's own ``status.disruptionsAllowed``, when set, caps it (tests set 0 to freeze it);
* an eviction allowed deletes the pod and answers 201 with a ``Status`` of ``Success``; a bound pod
  with ``spec.terminationGracePeriodSeconds`` > 0 only gets its ``deletionTimestamp`` (it is
  terminating, and still counted by the scheduler) until a test plays its kubelet and deletes it;
  a pod already terminating is allowed again and left as it is.
"""
from __future__ import annotations

import math
from typing import Any

_IGNORING = ("Succeeded", "Failed", "Pending")   # the phases whose eviction ignores every budget


def selector_matches(selector: Any, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against labels; an empty selector selects
    everything in policy/v1, a missing one nothing."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _healthy(pod: dict) -> bool:
    return (not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") == "Running" and _ready(pod))


def budget_status(pdb: dict, pods: list[dict]) -> dict:
    """What the disruption controller would write: expected, current and desired healthy, and
    the disruptions allowed."""
    spec = pdb.get("spec") or {}
    matching = [p for p in pods if selector_matches(spec.get("selector"), (p.get("metadata") or {}).get("labels") or {})]
    expected = len(matching)
    healthy = sum(1 for p in matching if _healthy(p))
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = 0
    allowed = max(0, healthy - desired)
    frozen = (pdb.get("status") or {}).get("disruptionsAllowed")
    if isinstance(frozen, int):
        allowed = min(allowed, frozen)
    return {"expectedPods": expected, "currentHealthy": healthy, "desiredHealthy": desired,
            "disruptionsAllowed": allowed}


def eviction_refusal(pod: dict, budgets: list[dict], pods: list[dict]) -> tuple[int, str, dict | None] | None:
    """Why the eviction of ``pod`` is refused, as (HTTP status, message, details), or None."""
    if (pod.get("status") or {}).get("phase") in _IGNORING or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    matching = [b for b in budgets if selector_matches((b.get("spec") or {}).get("selector"), labels)]
    if not matching:
        return None
    if len(matching) > 1:
        return 500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", None
    pdb = matching[0]
    status = budget_status(pdb, pods)
    if status["disruptionsAllowed"] > 0:
        return None
    if not _ready(pod) and status["currentHealthy"] >= status["desiredHealthy"] > 0:
        return None   # an unhealthy pod takes nothing from a budget that is met (IfHealthyBudget)
    name = (pdb.get("metadata") or {}).get("name", "")
    cause = {"type": "DisruptionBudget", "message": f"The disruption budget {name} needs "
             f"{status['desiredHealthy']} healthy pods and has {status['currentHealthy']} currently"}
    return 429, "Cannot evict pod as it would violate the pod's disruption budget.", {"causes": [cause]}
