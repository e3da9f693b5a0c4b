"""A /filter's node list, decoded and mapped once however often kube-scheduler repeats it.

kube-scheduler sends the same feasible list for most pods. Two shortcuts rely on that, and both
must give exactly what doing the work again gives:

* ``http.node_names.NodeNamesDecoder`` does not decode a repeated NodeNames tail again: whatever
  the body (the key nested in the pod, other key orders, whitespace, garbage), it decodes to what
  ``orjson.loads`` gives, or fails as it does;
* ``cache.candidates.CandidateLists`` hands back the node indexes of a list seen before until the
  device table's node indexes change: after any mix of registrations, removals and repeated
  lists, each mapping equals a fresh one from the table.
"""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from hami_py.cache.candidates import SHORTEST_REMEMBERED
from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node
from hami_py.http.node_names import NodeNamesDecoder

VENDORS = build_vendors(DeviceConfig.default())
LISTS = [[f"node-{i:04d}" for i in range(n)] for n in (64, 65, 200)]


def _body(pod: dict, names, *, order: str = "PNL", space: str = "") -> bytes:
    parts = {"P": b'"Pod":' + orjson.dumps(pod), "N": b'"Nodes":null', "L": b'"NodeNames":' + orjson.dumps(names)}
    return b"{" + (b"," + space.encode()).join(parts[k] for k in order) + space.encode() + b"}" + space.encode()


def test_a_repeated_list_is_decoded_once_and_each_answer_gets_its_own_list():
    decoder = NodeNamesDecoder()
    first = decoder.loads(_body({"metadata": {"name": "a"}}, LISTS[2]))
    second = decoder.loads(_body({"metadata": {"name": "b"}}, LISTS[2]))
    assert second == {"Pod": {"metadata": {"name": "b"}}, "Nodes": None, "NodeNames": LISTS[2]}
    second["NodeNames"].clear()          # one request's list is its own
    third = decoder.loads(_body({"metadata": {"name": "c"}}, LISTS[2]))
    assert third["NodeNames"] == LISTS[2] and first["NodeNames"] == LISTS[2]


def test_a_node_names_key_inside_the_pod_is_not_the_requests():
    decoder = NodeNamesDecoder()
    decoder.loads(_body({"x": 1}, LISTS[0]))
    # The same tail bytes, but here the list belongs to a key nested in the pod.
    nested = b'{"Pod":{"spec":{},"NodeNames":' + orjson.dumps(LISTS[0]) + b"}}"
    assert decoder.loads(nested) == orjson.loads(nested)
    assert "NodeNames" not in decoder.loads(nested)


def test_a_longer_key_ending_in_the_same_bytes_is_not_the_requests():
    decoder = NodeNamesDecoder()
    decoder.loads(_body({"x": 1}, LISTS[0]))
    # `"x\"NodeNames":` is one key whose quote is escaped; its document decodes with NodeNames
    # null even when cut before the list, so only the member's opening quote tells them apart.
    body = b'{"NodeNames":null,"x\\"NodeNames":' + orjson.dumps(LISTS[0]) + b"}"
    assert decoder.loads(body) == orjson.loads(body) == {"NodeNames": None, 'x"NodeNames': LISTS[0]}


pods = st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=5)},
    optional={"labels": st.dictionaries(st.sampled_from(["NodeNames", "a", "b"]), st.text(max_size=5), max_size=2)})})
bodies = st.one_of(
    st.builds(_body, pods, st.sampled_from(LISTS), order=st.sampled_from(["PNL", "NPL", "LPN", "PLN"]),
              space=st.sampled_from(["", " ", "\n"])),
    st.builds(lambda pod, names: b'{"Pod":' + orjson.dumps({**pod, "NodeNames": names}) + b"}", pods,
              st.sampled_from(LISTS)),
    st.builds(lambda body, cut: body[:cut], st.builds(_body, pods, st.sampled_from(LISTS)), st.integers(1, 2000)),
    st.builds(lambda body: body + b"}", st.builds(_body, pods, st.sampled_from(LISTS))),
    # The repeated tail behind a broken or unbalanced pod: nothing before it may be trusted.
    st.builds(lambda pod, names: b'{"Pod":' + pod + b',"NodeNames":' + orjson.dumps(names) + b"}",
              st.sampled_from([b'{"x":1}}', b'{"x":1', b"[1,2", b'{"a":{"b":1}', b'{"x":1},"y":']),
              st.sampled_from(LISTS)),
)


@settings(max_examples=300, deadline=None)
@given(sequence=st.lists(bodies, min_size=1, max_size=8))
def test_every_body_decodes_as_orjson_decodes_it(sequence):
    decoder = NodeNamesDecoder()
    for body in sequence:
        try:
            expected = orjson.loads(body)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                decoder.loads(body)
            continue
        assert decoder.loads(body) == expected


def _node(name: str, gpus: int) -> dict:
    return gpu_node(name, gpus=gpus)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.integers(0, 7), st.integers(0, 2)),     # 0 GPUs: no devices, no index
    st.tuples(st.just("remove"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("map"), st.integers(0, 2), st.just(0))), min_size=1, max_size=25))
def test_remembered_lists_follow_the_device_tables_node_indexes(steps):
    cache = UsageCache(VENDORS)
    # Long enough to be remembered (CandidateLists.SHORTEST_REMEMBERED): the nodes, and names the
    # table never knows.
    absent = [f"absent-{k}" for k in range(SHORTEST_REMEMBERED)]
    lists = [[f"n{i}" for i in range(8)] + absent, [f"n{i}" for i in (7, 3, 5, 0)] + absent,
             absent + [f"n{i}" for i in range(0, 8, 2)]]
    for op, a, b in steps:
        if op == "upsert":
            cache.upsert_node(_node(f"n{a}", b))
        elif op == "remove":
            cache.remove_node(f"n{a}")
        else:
            names = list(lists[a])         # a fresh list each time, as a request decodes one
            cache.candidates.known(names)  # as a /filter checks its list first: indices() then answers by identity
            mapped = cache.candidates.indices(names)
            assert list(mapped) == [cache.node_index_of.get(n, -1) for n in names]


def test_a_short_list_is_mapped_afresh_and_pushes_no_feasible_list_out():
    cache = UsageCache(VENDORS)
    for i in range(3):
        cache.upsert_node(_node(f"n{i}", 1))
    feasible = [f"n{i}" for i in range(3)] + [f"absent-{k}" for k in range(SHORTEST_REMEMBERED)]
    cache.candidates.indices(list(feasible))
    for i in range(10):
        assert list(cache.candidates.indices([f"n{i % 3}"])) == [cache.node_index_of[f"n{i % 3}"]]
    assert cache.candidates.known(list(feasible))

