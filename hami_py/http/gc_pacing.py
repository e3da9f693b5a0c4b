"""Young-generation garbage collection between requests rather than in the middle of one.

CPython's cyclic collector runs when enough container objects have been allocated, wherever
that happens to be: every ~700 allocations a young collection, every tenth of those a middle one.
A /filter allocates a hundred-odd containers (the decoded pod, the decision), so the collector
runs inside one request in a few, and the middle collection, a millisecond or so once the watch
streams have left their objects in its generation, is most of the slowest /filter answers.

So once an answer is on its way, and the young generation is close to its threshold, the
collection the next allocations would have started is run there, with the same choice of
generation CPython would make. The oldest generation is left to CPython: whether a full collection
is due depends on counts it does not expose, and leaving it keeps its cost rare and its rule
unchanged (``collect_young`` says how). Nothing is collected more often than CPython would;
only earlier, and off the path.
"""
from __future__ import annotations

import gc

# How close to the young threshold the count must be (as a fraction of it) for the collection to
# be run now: close enough that it would come within the next request or two anyway.
EARLY = 0.7


def collection_due() -> bool:
    """Whether the young generation is close enough to its threshold to collect after this answer."""
    return gc.isenabled() and gc.get_count()[0] >= EARLY * gc.get_threshold()[0]


def collect_young() -> None:
    """Collect generation 0, or 1 when CPython's next automatic collection would be that one
    (its rule: the oldest generation whose count is over its threshold). When the oldest
    generation is over its threshold too, CPython runs a full collection only if enough objects
    have been promoted since the last one (a count it does not expose), else generation 1: so
    there, one time in ``_FULL_EVERY``, the collection is left to CPython, in whichever request
    it falls, and a full one still comes when it is due; the other times generation 1 is
    collected here."""
    global _waited
    if not gc.isenabled():
        return
    (_, count1, count2), (threshold0, threshold1, threshold2) = gc.get_count(), gc.get_threshold()
    if threshold0 == 0:
        return
    if count1 <= threshold1:
        gc.collect(0)
        return
    if count2 > threshold2:
        _waited += 1
        if _waited % _FULL_EVERY == 0:
            return
    gc.collect(1)


# How often, once a full collection may be due, CPython is left to decide (collect_young).
_FULL_EVERY = 10
_waited = 0
