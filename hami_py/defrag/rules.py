"""Which running pods the defragmenter may move, and the PodDisruptionBudgets that limit it.

A pod may be moved only if all of these hold (issue 25):

* a controller will recreate it: an owner reference with ``controller: true`` of any kind but
  ``DaemonSet`` (ReplicaSet, StatefulSet, Job, ReplicationController, or a custom controller).
  A DaemonSet's pod would come back on the same node, so moving it frees nothing; a bare pod
  would not come back at all;
* its priority is not above the limit: the priority of the pod the room is made for, or for
  ``--free`` the ``--max-priority`` flag (default 0: only pods of no or negative priority);
* no PodDisruptionBudget selecting it has no disruption left. Each planned eviction consumes one
  of ``status.disruptionsAllowed`` of every budget selecting it, as the Eviction API would;
* it does not carry the opt-out annotation ``hami.io/defrag: "false"``;
* it is no gang's member (scheduler-plugins' PodGroup, Kueue's pod group): moving one member
  alone would leave its gang partly placed (hami_py/scheduling/gangs/).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hami_py.scheduling.gangs.membership import gang_of

# A pod carrying this annotation with the value "false" is never moved by the defragmenter.
OPT_OUT_ANNOTATION = "hami.io/defrag"
OPT_OUT_VALUE = "false"
NEVER_MOVED_CONTROLLERS = frozenset({"DaemonSet"})


def controller_of(pod: dict) -> dict | None:
    """The owner reference with ``controller: true``, or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


@dataclass(slots=True)
class Budget:
    """A PodDisruptionBudget as far as eviction cares: its namespace, selector and the disruptions
    it still allows (``status.disruptionsAllowed``)."""
    namespace: str
    name: str
    allowed: int
    match_labels: dict[str, str] | None = None     # None with no expressions: a null selector (selects nothing)
    expressions: list[dict] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: dict) -> bool:
        meta = pod.get("metadata") or {}
        if (meta.get("namespace") or "default") != self.namespace:
            return False
        if self.match_labels is None and not self.expressions:
            return False
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in (self.match_labels or {}).items()):
            return False
        return all(_matches(expr, labels) for expr in self.expressions)


def _matches(expr: dict, labels: dict) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False    # an unknown operator selects nothing (the API server would have refused it)


def budget_from_object(obj: dict) -> Budget:
    """A policy/v1 PodDisruptionBudget object. An empty selector selects every pod of its
    namespace, a missing one none (policy/v1's rule)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector = spec.get("selector")
    allowed = status.get("disruptionsAllowed")
    budget = Budget(namespace=meta.get("namespace") or "default", name=meta.get("name") or "",
                    allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0)
    if isinstance(selector, dict):
        budget.match_labels = {str(k): str(v) for k, v in (selector.get("matchLabels") or {}).items()}
        budget.expressions = [e for e in selector.get("matchExpressions") or [] if isinstance(e, dict)]
    return budget


class BudgetBook:
    """Disruptions left per budget while a plan is built: each planned eviction consumes one."""

    def __init__(self, budgets: list[Budget]):
        self.budgets = budgets
        self.left = {b.key: b.allowed for b in budgets}
        # pod uid -> the budgets selecting it: a search asks for the same pods in many sets.
        self._selecting: dict[str, list[Budget]] = {}

    def selecting(self, pod: dict) -> list[Budget]:
        uid = (pod.get("metadata") or {}).get("uid")
        found = self._selecting.get(uid) if uid else None
        if found is None:
            found = [b for b in self.budgets if b.selects(pod)]
            if uid:
                self._selecting[uid] = found
        return found

    def blocked_by(self, pod: dict) -> Budget | None:
        """A budget selecting the pod with no disruption left, or None."""
        return next((b for b in self.selecting(pod) if self.left[b.key] <= 0), None)

    def allows(self, pods: list[dict]) -> bool:
        """Whether evicting all of ``pods`` stays within every budget."""
        need: dict[str, int] = {}
        for pod in pods:
            for b in self.selecting(pod):
                need[b.key] = need.get(b.key, 0) + 1
        return all(self.left[k] >= n for k, n in need.items())

    def consume(self, pods: list[dict]) -> None:
        for pod in pods:
            for b in self.selecting(pod):
                self.left[b.key] -= 1


def why_not_movable(pod: dict, *, priority: int, priority_limit: int, budgets: BudgetBook) -> str | None:
    """Why the pod may not be moved, in words, or None when it may."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if str(annotations.get(OPT_OUT_ANNOTATION, "")).strip().lower() == OPT_OUT_VALUE:
        return f'it carries {OPT_OUT_ANNOTATION}: "{OPT_OUT_VALUE}"'
    gang = gang_of(pod)
    if gang is not None:
        # Moving one member alone would leave its gang partly placed (scheduling/gangs/).
        return f"it belongs to gang {gang.namespace}/{gang.name}"
    controller = controller_of(pod)
    if controller is None:
        return "no controller would recreate it"
    if controller.get("kind") in NEVER_MOVED_CONTROLLERS:
        return f"it belongs to {controller.get('kind')} {controller.get('name')}"
    if priority > priority_limit:
        return f"its priority {priority} is above {priority_limit}"
    blocked = budgets.blocked_by(pod)
    if blocked is not None:
        return f"PodDisruptionBudget {blocked.key} allows no more disruptions"
    return None
