"""Node locks whose holder makes no progress: a node to avoid rather than wait on.

HAMi's device plugin takes a bound pod's devices and releases the node lock within about a hundred
milliseconds of the bind. A lock still held long after that by a pod whose allocation is not
finished (bind-phase still ``allocating``: the plugin hangs, or is gone without its handshake
having expired yet) stops every bind onto the node until it expires (``--node-lock-timeout``, 5
minutes). Waiting for it is what a bind does for a lock in progress (``--node-lock-wait``); for a
stuck one it only holds kube-scheduler's bind and the pod's next filter up. So /filter prefers any
node that fits without one, a bind onto one fails at once naming the holder, and the metrics show
them (``hami_node_lock_stuck``).

Read from the books only (the node watch's lock value, the pod watch's bind-phase): no request.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from hami_py.cache.records import NodeEntry, parse_lock

DEFAULT_STUCK_AFTER_S = 30.0     # a lock held this long by an unfinished allocation is stuck


@dataclass(frozen=True, slots=True)
class StuckLock:
    node: str
    holder: str          # namespace/name of the pod holding it
    held_s: float        # how long it has been held

    def event_message(self) -> str:
        """The node's Event: the same text each time, so repeats raise one Event's count."""
        return (f"node lock held by pod {self.holder}, whose allocation makes no progress (bind-phase still "
                f"allocating): binds onto this node fail and filters pass it over until it is released")

    def describe(self) -> str:
        return (f"node {self.node} is locked by pod {self.holder}, whose allocation has made no progress "
                f"for {self.held_s:.0f}s (bind-phase still allocating): node lock stuck")


def stuck_lock(entry: NodeEntry, *, allocating: Callable[[str, str, str], bool], after_s: float,
               now: datetime | None = None) -> StuckLock | None:
    """The node's lock if it is stuck: held longer than ``after_s`` by a pod the books show
    charged to the node with its allocation unfinished (``allocating(namespace, name, node)``).
    A lock of a pod the books do not know (another scheduler's) is never judged stuck here."""
    value = entry.lock_value
    if not value or after_s <= 0:
        return None
    try:
        stamp, namespace, name = parse_lock(value)
    except ValueError:
        return None
    if not namespace or not name:
        return None
    held = ((now or datetime.now(timezone.utc)) - stamp).total_seconds()
    if held <= after_s or not allocating(namespace, name, entry.name):
        return None
    return StuckLock(entry.name, f"{namespace}/{name}", held)


def stuck_locks(entries: Iterable[NodeEntry], **kwargs) -> list[StuckLock]:
    return [s for e in entries if e.lock_value and (s := stuck_lock(e, **kwargs)) is not None]
