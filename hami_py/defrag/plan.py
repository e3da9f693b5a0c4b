"""What a defragmentation plan says: which pods move, from where to where, and for whom.

The planner (``planner.py``) fills these; the reports, ``--execute`` and the simulator read them.
``Plan.as_json`` is the machine-readable output (``defrag --output json``), whose keys are part
of the interface: ``satisfied``, ``moves`` (``pod``, ``node``, ``to``), ``makesRoomFor`` and
``reason``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Move:
    """One pod evicted, and where this scheduler would place its replacement."""
    namespace: str
    name: str
    uid: str
    node: str                      # where it runs now
    to: str | None                 # where its replacement is expected
    priority: int = 0
    running_s: float = 0.0         # how long it has run: what moving it loses

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    def as_json(self) -> dict:
        return {"pod": self.pod, "uid": self.uid, "node": self.node, "to": self.to,
                "priority": self.priority, "runningSeconds": round(self.running_s, 3)}


@dataclass(slots=True)
class Placement:
    """A pod the plan makes room for, and the node it is expected on once the moves are made."""
    namespace: str
    name: str
    uid: str
    node: str | None
    victims: list[str] = field(default_factory=list)   # uids of the moves that free its room

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(slots=True)
class Plan:
    goal: str                                   # in words: "room for 3 pending pods", "4 whole A100"
    satisfied: bool
    moves: list[Move] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    reason: str = ""                            # why not satisfied (or what was left out)
    exact: bool = True                          # False when a search bound was hit
    trials: int = 0                             # fits tried
    # Added by the planner for the reports: the devices freed (--free: node, id, type), and per
    # node the books' device_usage before the plan and with it applied (victims gone, the pods
    # made room for and the replacements charged).
    freed: list[dict] = field(default_factory=list)
    devices_before: dict[str, list[dict]] = field(default_factory=dict)
    devices_after: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def makes_room_for(self) -> list[str]:
        return [p.pod for p in self.placements]

    def as_json(self) -> dict:
        return {"goal": self.goal, "satisfied": self.satisfied,
                "moves": [m.as_json() for m in self.moves],
                "makesRoomFor": self.makes_room_for,
                "placements": [{"pod": p.pod, "uid": p.uid, "node": p.node,
                                "after": [m.pod for m in self.moves if m.uid in p.victims]}
                               for p in self.placements],
                "freedDevices": list(self.freed),
                "reason": self.reason, "exact": self.exact, "trials": self.trials}
