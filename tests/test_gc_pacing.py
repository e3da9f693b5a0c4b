"""Young garbage collections run after an answer, as CPython would have run them anyway.

``http/gc_pacing.collect_young`` must choose the generation CPython's next automatic collection
would: the young one, or the middle one once more young collections than its threshold have run.
Collecting more often, or an older generation than CPython would, costs every later request.
"""
from __future__ import annotations

import gc

import pytest

from hami_py.http import gc_pacing


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def _collections() -> list[int]:
    return [s["collections"] for s in gc.get_stats()]


def test_the_young_generation_is_collected_while_the_middle_one_is_not_due(thresholds):
    gc.set_threshold(100_000, 3, 100)
    gc.collect()                        # every count back to 0
    before = _collections()
    gc_pacing.collect_young()
    after = _collections()
    assert after[0] == before[0] + 1 and after[1] == before[1] and after[2] == before[2]


def test_the_middle_generation_is_collected_once_more_young_ones_than_its_threshold_ran(thresholds):
    gc.set_threshold(100_000, 3, 100)
    gc.collect()
    for _ in range(3):
        gc.collect(0)                   # count 3: not over the threshold yet, as CPython reads it
    before = _collections()
    gc_pacing.collect_young()
    assert _collections()[1] == before[1]
    gc.collect(0)                       # count 4: over it
    before = _collections()
    gc_pacing.collect_young()
    after = _collections()
    assert after[1] == before[1] + 1 and after[2] == before[2]


def test_nothing_is_collected_while_the_collector_is_off(thresholds):
    gc.disable()
    try:
        before = _collections()
        gc_pacing.collect_young()
        assert _collections() == before
        assert not gc_pacing.collection_due()
    finally:
        gc.enable()
