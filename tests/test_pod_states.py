"""A pod's charge moves through named states (hami_py/cache/pod_states.py), only as the table says.

The walk of every state a cluster's events reach is driven through the pod ledger itself (the
informer's handler, ``Filterer.decide``, the bind's and the holds' marks), and each state is checked
for what the rest of the scheduler asks of it: may a /bind use it, is the pod bound. A move the
table does not have is an error, not a quiet combination of flags.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from hami_py.cache.pod_states import ENTRIES, TRANSITIONS, ImpossibleTransition, PodState, advance
from hami_py.fakeapi.objects import gpu_node
from tests.books_model import World, books_pod

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"


def _world() -> World:
    return World([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)])


def _pod(name: str) -> dict:
    return books_pod(name, [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                       "nvidia.com/gpumem": "4000"}}}])


def _reserved(world: World, name: str) -> tuple[str, str]:
    pod = world.create(_pod(name))
    uid = pod["metadata"]["uid"]
    node = world.filter(uid)
    assert node is not None
    return uid, node


def test_a_pod_goes_reserved_bound_unseen_bound_allocated():
    world = _world()
    uid, node = _reserved(world, "p")
    record = world.cache.pods[uid]
    assert record.state is PodState.RESERVED and world.cache.live_reservation(uid, node) is record
    world.cache.mark_bound(record)
    assert record.state is PodState.BOUND_UNSEEN and record.state.allocating
    world.decisions.pop(uid)
    pod = world.objects[uid]
    pod["metadata"]["annotations"].update(record.annotations)
    pod["spec"]["nodeName"] = node
    world._event("MODIFIED", world._stamp(pod))
    assert world.cache.pods[uid] is record and record.state is PodState.BOUND and record.state.shown_bound
    world.allocated(uid)
    assert record.state is PodState.ALLOCATED and not record.state.allocating
    # The device plugin's answer withdrawn: allocating again (still bound).
    del world.objects[uid]["metadata"]["annotations"]["hami.io/bind-phase"]
    world._event("MODIFIED", world._stamp(world.objects[uid]))
    assert record.state is PodState.BOUND


def test_a_repeated_mark_bound_after_the_watch_showed_the_binding_changes_nothing():
    world = _world()
    uid, _ = _reserved(world, "p")
    world.bind(uid)
    record = world.cache.pods[uid]
    assert record.state is PodState.BOUND
    world.cache.mark_bound(record)        # the Binding's event beat the Binding's answer
    assert record.state is PodState.BOUND


def test_an_unbound_object_showing_our_own_decision_stays_ours_to_bind():
    world = _world()
    uid, node = _reserved(world, "p")
    record = world.cache.pods[uid]
    pod = world.objects[uid]
    pod["metadata"]["annotations"].update(record.annotations)     # left there by an earlier round
    world._event("MODIFIED", world._stamp(pod))
    assert record.state is PodState.SHOWN and record.state.seen and record.state.bindable
    assert world.cache.live_reservation(uid, node) is record
    world.cache.mark_bound(record)
    assert record.state is PodState.BOUND_UNSEEN


def test_a_decision_rebuilt_from_an_unbound_object_is_counted_but_never_bound():
    world = _world()
    uid, node = _reserved(world, "p")
    pod = world.objects[uid]
    pod["metadata"]["annotations"].update(world.decisions[uid])
    world.restart()          # a new process reads the decision from the object: not its own
    record = world.cache.pods[uid]
    assert record.state is PodState.REBUILT and record.entries
    assert world.cache.live_reservation(uid, node) is None
    with pytest.raises(ImpossibleTransition, match="rebuilt to bound-unseen"):
        world.cache.mark_bound(record)


def test_a_hold_is_charged_and_never_bound():
    world = _world()
    uid, node = _reserved(world, "p")
    record = world.cache.pods[uid]
    world.cache.mark_held(record)
    assert record.state is PodState.HELD and uid in world.cache.pods
    assert world.cache.live_reservation(uid, node) is None
    with pytest.raises(ImpossibleTransition, match="held to bound-unseen"):
        world.cache.mark_bound(record)


def test_a_bound_pod_cannot_become_a_hold_or_a_reservation_again():
    world = _world()
    uid, _ = _reserved(world, "p")
    world.bind(uid)
    record = world.cache.pods[uid]
    with pytest.raises(ImpossibleTransition, match="bound to held"):
        world.cache.mark_held(record)
    for state in (PodState.RESERVED, PodState.SHOWN, PodState.REBUILT, PodState.HELD):
        with pytest.raises(ImpossibleTransition):
            advance(PodState.BOUND, state)
    # An older unbound copy of the pod (a late event) does not unbind it either.
    older = copy.deepcopy(world.objects[uid])
    older["spec"].pop("nodeName")
    older["metadata"]["resourceVersion"] = str(int(older["metadata"]["resourceVersion"]) + 100)
    world._event("MODIFIED", older)
    assert record.state is PodState.BOUND


def test_every_move_the_table_allows_is_one_advance_allows_and_no_other():
    for current in PodState:
        for to in PodState:
            if current is to or (current, to) in TRANSITIONS:
                assert advance(current, to) is to
            else:
                with pytest.raises(ImpossibleTransition):
                    advance(current, to)


def test_the_architecture_doc_lists_every_state_and_transition():
    text = DOCS.read_text()
    section = text[text.index("## A pod's life"):]
    section = section[:section.index("\n## ", 4)]
    for state in PodState:
        assert re.search(rf"`{re.escape(state.value)}`", section), f"state {state.value} missing from the doc"
    for (current, to) in TRANSITIONS:
        assert f"`{current.value}` → `{to.value}`" in section, f"{current.value} → {to.value} missing from the doc"
    for state in ENTRIES:
        assert f"→ `{state.value}`" in section, f"entry into {state.value} missing from the doc"
