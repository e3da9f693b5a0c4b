"""Issue 23's rows where a family's answer must be upstream's, in every state of the books.

Each case places its first pods, then a probe must get upstream's answer (node or exact reason)
while they are reserved, once they are bound, once the device plugin has answered, and after a
restart (tests/books_model.py).
"""
from __future__ import annotations


from hami_py.fakeapi.families import BY_KEY
from tests.books_model import World, books_pod
from tests.test_family_ascend import npu_node
from tests.test_one_set_of_books import _drs_node


def _pod(name: str, limits: dict, annotations: dict | None = None) -> dict:
    return books_pod(name, [{"name": "main", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}],
                     annotations=annotations)


def _answers_in_every_state(world: World, first: list[dict], probe: dict):
    uids = [world.create(p)["metadata"]["uid"] for p in first]
    for uid in uids:
        assert world.filter(uid), f"{uid} does not fit"
    answers = {"reserved": world.probe(probe)}
    for uid in uids:
        world.bind(uid)
    answers["bound"] = world.probe(probe)
    for uid in uids:
        world.allocated(uid)
    answers["allocated"] = world.probe(probe)
    world.restart()
    answers["after a restart"] = world.probe(probe)
    return answers


def _assert_all(answers: dict, expected) -> None:
    for state, answer in answers.items():
        assert answer == expected, f"{state}: {answer}, upstream answers {expected}"


def test_metax_gpu_node_with_every_card_taken_is_refused_in_upstreams_words():
    world = World([BY_KEY["metax-gpu"].node("m1", devices=2)])
    one = {"metax-tech.com/gpu": 1}
    answers = _answers_in_every_state(world, [_pod("a", one), _pod("b", one)], _pod("probe", one))
    _assert_all(answers, (None, {"m1": "2/2 CardTimeSlicingExhausted"}))


def test_enflame_drs_card_too_full_for_a_partition_is_refused_for_its_slices():
    # One card of 6 slices and 40 GB: a 3-slice partition (20 GB) leaves no room for a 6-slice one.
    # HAMi after v2.10 (#2877) checks the partition's slices before its memory (v2.10 said memory).
    world = World([_drs_node("e1", 1)])
    answers = _answers_in_every_state(
        world, [_pod("a", {"enflame.com/drs-gcu": 3})], _pod("probe", {"enflame.com/drs-gcu": 6}))
    _assert_all(answers, (None, {"e1": "1/1 CardTimeSlicingExhausted"}))


def test_kunlun_vxpu_that_fits_nowhere_on_the_node_is_numa_not_fit_as_upstream():
    world = World([BY_KEY["kunlun-vxpu"].node("x1", devices=1)])
    answers = _answers_in_every_state(
        world, [_pod("a", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576})],
        _pod("probe", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 49152}))
    _assert_all(answers, (None, {"x1": "1/1 NumaNotFit"}))


def test_ascend_hami_core_pod_counts_an_npus_cores_as_100_whatever_devcore_says():
    # The plugin registers devcore 20 (the chip's AI cores); a hami-core pod asks percent.
    node = npu_node("a1", {"Ascend910B3": 1}, hami_core=True)
    text = node["metadata"]["annotations"]["hami.io/node-register-Ascend910B3"]
    node["metadata"]["annotations"]["hami.io/node-register-Ascend910B3"] = text.replace(
        '"devcore":100', '"devcore":20')
    assert '"devcore":20' in node["metadata"]["annotations"]["hami.io/node-register-Ascend910B3"]
    world = World([node])
    soft = {"huawei.com/vnpu-mode": "hami-core"}
    thirty = {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 8192, "huawei.com/Ascend910B3-core": 30}
    answers = _answers_in_every_state(world, [_pod("a", thirty, soft)], _pod("probe", thirty, soft))
    _assert_all(answers, ("a1", {}))
    # 30 + 30 + 30 of 100: a fourth 30 % share no longer fits, as upstream (100 - 90 < 30).
    world = World([node])
    answers = _answers_in_every_state(world, [_pod(n, thirty, soft) for n in "abc"], _pod("probe", thirty, soft))
    _assert_all(answers, (None, {"a1": "1/1 CardInsufficientCore"}))


def test_metax_sgpu_card_of_a_fixed_share_task_refuses_a_best_effort_share_in_upstreams_words():
    world = World([BY_KEY["metax-sgpu"].node("s1", devices=1)])
    share = {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 8, "metax-tech.com/vcore": 30}
    answers = _answers_in_every_state(
        world, [_pod("a", share, {"metax-tech.com/sgpu-qos-policy": "fixed-share"})],
        _pod("probe", share, {"metax-tech.com/sgpu-qos-policy": "best-effort"}))
    _assert_all(answers, (None, {"s1": "1/1 CardQosPolicyMismatch"}))


def test_kunlun_node_with_every_whole_xpu_taken_is_numa_not_fit_as_upstream():
    world = World([BY_KEY["kunlun"].node("k1", devices=8)])
    answers = _answers_in_every_state(world, [_pod("a", {"kunlunxin.com/xpu": 8})],
                                      _pod("probe", {"kunlunxin.com/xpu": 1}))
    _assert_all(answers, (None, {"k1": "1/8 NumaNotFit"}))
