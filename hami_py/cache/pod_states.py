"""A charged pod's life as one named state, and the only transitions between states.

A pod's charge in the books used to carry four booleans (reserved, decided, bound, allocated) plus
the meaning of a missing resourceVersion: 32 combinations, of which seven are real. Each of them
is a state here, with what the rest of the scheduler may ask of it (may a /bind use it? is the pod
bound? has the watch shown it?), so no reader combines flags. Only the pod ledger
(``cache/pod_ledger.py``) moves a record from one state to another, through ``advance``; a move
that is not in ``TRANSITIONS`` raises ``ImpossibleTransition`` instead of leaving the books in a
combination no rule was written for. kube-scheduler's own cache works the same way (an assumed
pod becomes an added pod when the informer confirms it).

Before a pod has a record, and after it has one no more, the ledger keeps two marks of its own
(not states of a record): ``released`` (a decision we rolled back that the pod object may still
carry: events repeating exactly it do not charge it again) and ``deleted`` (a UID the watch showed
deleted: a stale /filter of it is refused). docs/ARCHITECTURE.md has the table.
"""
from __future__ import annotations

import enum


class ImpossibleTransition(RuntimeError):
    """A record was asked to move between two states that no event connects."""


class PodState(enum.Enum):
    """Where one pod's charge is in its life (its value is the name the docs and logs use)."""

    # This process's /filter placed the pod: charged in the books only, nothing on the pod object
    # (the decision travels with the Binding). A /bind onto its node may use it.
    RESERVED = "reserved"
    # Room kept for a pod while the pods in its way leave (device preemption, the defragmenter):
    # charged next to the victims, never used by a /bind; the pod's next /filter decides anew.
    HELD = "held"
    # This process's /bind created the Binding (with the decision); the watch has not shown the
    # bound pod yet.
    BOUND_UNSEEN = "bound-unseen"
    # A reservation of ours whose unbound pod object, as the watch shows it, carries this very
    # decision (left there by an earlier round): still ours to bind.
    SHOWN = "shown"
    # Charged from an unbound pod object's annotations that this process did not decide (another
    # scheduler, a former leader, a restart's relist). Counted, never bound by us.
    REBUILT = "rebuilt"
    # The watch shows the pod bound with this decision; its device plugin is still allocating.
    BOUND = "bound"
    # Bound, and the device plugin is done with it (hami.io/bind-phase success or failed).
    ALLOCATED = "allocated"

    @property
    def bindable(self) -> bool:
        """A /bind may use this charge (a decision of this process's own /filter, unbound)."""
        return self in _BINDABLE

    @property
    def bound(self) -> bool:
        """The pod is bound (by our Binding, or as the watch shows it)."""
        return self in _BOUND

    @property
    def seen(self) -> bool:
        """The charge is one the API server's pod object shows (not only our own books')."""
        return self in _SEEN

    @property
    def shown_bound(self) -> bool:
        """The API server's pod object shows the pod bound with this charge (a pod that may be
        evicted or moved; not a decision still in flight)."""
        return self is PodState.BOUND or self is PodState.ALLOCATED

    @property
    def allocating(self) -> bool:
        """Bound, and its device plugin not done with it: what a node lock guards."""
        return self is PodState.BOUND_UNSEEN or self is PodState.BOUND


_BINDABLE = frozenset((PodState.RESERVED, PodState.SHOWN))
_BOUND = frozenset((PodState.BOUND_UNSEEN, PodState.BOUND, PodState.ALLOCATED))
_SEEN = frozenset((PodState.SHOWN, PodState.REBUILT, PodState.BOUND, PodState.ALLOCATED))

S = PodState
# The states a record may enter the books in, and why.
ENTRIES: dict[PodState, str] = {
    S.RESERVED: "this process's /filter places the pod (at /bind in --filter-mode=all)",
    S.HELD: "a hold is charged for a pod whose victims are leaving (the defragmenter's plan)",
    S.REBUILT: "the watch or a relist shows an unbound pod carrying a decision",
    S.BOUND: "the watch or a relist shows a bound pod carrying a decision, its device plugin allocating",
    S.ALLOCATED: "the watch or a relist shows a bound pod carrying a decision, its device plugin done",
}
# Every move between two states, and the event that causes it. A pod object's later events that
# change nothing of its state (a new resourceVersion) are not moves.
TRANSITIONS: dict[tuple[PodState, PodState], str] = {
    (S.RESERVED, S.HELD): "preemption or the defragmenter keeps the decision's room as a hold",
    (S.RESERVED, S.BOUND_UNSEEN): "our /bind created the Binding",
    (S.SHOWN, S.BOUND_UNSEEN): "our /bind created the Binding",
    (S.RESERVED, S.SHOWN): "the watch shows the unbound pod carrying this very decision",
    (S.RESERVED, S.BOUND): "the watch shows the pod bound with this decision (a Binding whose answer was lost)",
    (S.RESERVED, S.ALLOCATED): "the watch shows the pod bound with this decision, its device plugin done",
    (S.HELD, S.REBUILT): "the watch shows the unbound pod carrying this very decision",
    (S.HELD, S.BOUND): "the watch shows the pod bound with this decision",
    (S.HELD, S.ALLOCATED): "the watch shows the pod bound with this decision, its device plugin done",
    (S.BOUND_UNSEEN, S.BOUND): "the watch shows our Binding",
    (S.BOUND_UNSEEN, S.ALLOCATED): "the watch shows our Binding, the device plugin already done",
    (S.SHOWN, S.BOUND): "the watch shows the pod bound with this decision",
    (S.SHOWN, S.ALLOCATED): "the watch shows the pod bound with this decision, its device plugin done",
    (S.REBUILT, S.BOUND): "the watch shows the pod bound with this decision",
    (S.REBUILT, S.ALLOCATED): "the watch shows the pod bound with this decision, its device plugin done",
    (S.BOUND, S.ALLOCATED): "the device plugin sets hami.io/bind-phase to success or failed",
    (S.ALLOCATED, S.BOUND): "hami.io/bind-phase no longer says the device plugin is done",
}
# How a record leaves the books (it is not a state: the record is gone).
EXITS: dict[str, str] = {
    "release": "a decision rolled back (failed bind, the pod filtered again, a hold given back, end of "
               "leadership): uncharged, and marked released",
    "remove": "the pod deleted or terminated, its object carrying no decision any more, a relist without "
              "it, or a trial of preemption or the defragmenter taking it out for a moment",
}
del S


def advance(current: PodState, to: PodState) -> PodState:
    """``to``, if a record in ``current`` may move there; raises ImpossibleTransition otherwise.
    Staying in a state is always allowed."""
    if current is not to and (current, to) not in TRANSITIONS:
        raise ImpossibleTransition(f"a pod's charge cannot go from {current.value} to {to.value}")
    return to


def observed(current: PodState | None, *, bound: bool, allocated: bool) -> PodState:
    """The state a pod object shown by the watch (with this charge's decision) puts a record in:
    ``current`` is the record's state (None: a new record). Bound never goes back to unbound; an
    unbound object leaves our own decision ours (SHOWN) and anything else REBUILT."""
    if bound or (current is not None and current.bound):
        return PodState.ALLOCATED if allocated else PodState.BOUND
    if current is PodState.RESERVED or current is PodState.SHOWN:
        return PodState.SHOWN
    return PodState.REBUILT
