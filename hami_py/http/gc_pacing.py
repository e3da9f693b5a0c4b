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
unchanged. Nothing is collected more often than CPython would; only earlier, and off the path.
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
    """Collect generation 0, or 1 when CPython's next automatic collection would have been that
    one; nothing when it would be a full collection (or the collector is off)."""
    if not gc.isenabled():
        return
    (_, count1, count2), (threshold0, threshold1, threshold2) = gc.get_count(), gc.get_threshold()
    if threshold0 == 0:
        return
    if count1 + 1 > threshold1:
        if count2 + 1 > threshold2:
            return        # a full collection may be due: CPython decides, by rules it keeps to itself
        gc.collect(1)
    else:
        gc.collect(0)
