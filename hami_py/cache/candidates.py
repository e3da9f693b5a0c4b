"""Candidate node names to node indexes, with the last few lists remembered.

Every /filter names its candidate nodes, thousands of them at a time, and the kernel wants their
node indexes. Mapping a list costs a string hash and a dict probe per name: about 0.15 µs each on
a small machine, so 0.15 ms at 1 000 nodes and close to a millisecond at 5 000, more than the
rest of the decision outside the kernel. But kube-scheduler sends the same feasible list for most
pods (every node that passed its own filters), and comparing a list with one seen before costs a
length check and one short ``memcmp`` per name. So the lists mapped since the table's node
indexes last changed are remembered, and an equal list gets the same index array back.

The arrays handed out are shared: callers read them (the kernel takes them read-only) and copy
before changing one.
"""
from __future__ import annotations

from array import array
from itertools import repeat

# kube-scheduler's lists differ by the pod's own node constraints (selectors, affinities, taints):
# a handful of distinct lists covers a steady workload, and each entry is the size of one list.
REMEMBERED_LISTS = 4
# Shorter lists (a bind's refit on its node, a preemption's or a hold's few nodes) are mapped
# afresh, at no cost worth saving, and never push a feasible list out.
SHORTEST_REMEMBERED = 64


class CandidateLists:
    """``indices(names)``: the node index of each name (-1 for a node without devices), as an
    ``array("i")``; the same array for an equal list while the indexes stay unchanged."""

    __slots__ = ("index_of", "_lists", "_vouched")

    def __init__(self, index_of: dict[str, int]):
        self.index_of = index_of              # the device table's: name → node index
        self._lists: list[tuple[list[str], array]] = []   # most recently used first
        # The list ``known`` last found, and its indexes: a request checks its list once, then
        # asks for its indexes, and the second look is by identity (the object is held here, so
        # its id cannot be reused; only that request has it, and nobody changes it meanwhile).
        self._vouched: tuple[list, array] | None = None

    def forget(self) -> None:
        """The table's node indexes changed: every remembered mapping is void."""
        self._lists.clear()
        self._vouched = None

    def known(self, names: list) -> bool:
        """Whether ``names`` equals a remembered list: every element then is a node name (str),
        since only lists of names are remembered and no other JSON value equals a str."""
        found = self._find(names)
        if found is None:
            return False
        self._vouched = (names, found)
        return True

    def indices(self, names: list[str]) -> array:
        vouched = self._vouched
        if vouched is not None and vouched[0] is names:
            self._vouched = None
            return vouched[1]
        found = self._find(names)
        if found is not None:
            return found
        idx = array("i", list(map(self.index_of.get, names, repeat(-1))))
        if len(names) < SHORTEST_REMEMBERED:
            return idx
        # A copy: the caller's list may be changed after the call, the remembered one never is.
        self._lists.insert(0, (list(names), idx))
        del self._lists[REMEMBERED_LISTS:]
        return idx

    def _find(self, names: list) -> array | None:
        lists = self._lists
        for k, (seen, idx) in enumerate(lists):
            if seen is names or (len(seen) == len(names) and seen == names):
                if k:
                    lists.insert(0, lists.pop(k))
                return idx
        return None
