"""Kunlun placement end to end: needs the kernel's FLAG_EXCLUSIVE / FLAG_EQUAL_SHARE / FLAG_CHOOSE."""
from __future__ import annotations

import orjson

from hami_py.devices.codec import decode_pod_devices
from tests.conftest import decision_annotations, assert_books_balance, place, register_nodes, wait_until
from tests.test_family_kunlun import XPU_CARDS, kunlun_node, xpu_pod


def _annotations(api, app, name):
    return decision_annotations(api, app, name)


async def test_whole_xpu_pod_is_filtered_bound_and_annotated_as_upstream(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"))
    pod, result = await place(api, extender, xpu_pod("train", {"kunlunxin.com/xpu": "4"}), names)
    assert result["NodeNames"] == ["k1"], result
    ann = _annotations(api, app, "train")
    assert ann["hami.io/kunlun-allocated"] == "".join(f"k1-kunlun-{i},kunlun,98304,100:" for i in range(4)) + ";"
    assert ann["BAIDU_COM_DEVICE_IDX"] == "0,1,2,3"
    assert "hami.io/xpu-devices-to-allocate" not in ann
    bound = await extender.bind(pod, "k1")
    assert bound["Error"] == ""
    await wait_until(lambda: api.get("pods", "train", namespace="default")["spec"].get("nodeName") == "k1", "bound")
    assert_books_balance(app)
    # The left group is taken: two more cards come from the right group, a busy card takes none.
    _, result = await place(api, extender, xpu_pod("pair", {"kunlunxin.com/xpu": "2"}), names)
    assert result["NodeNames"] == ["k1"]
    assert _annotations(api, app, "pair")["BAIDU_COM_DEVICE_IDX"] == "4,5"
    _, result = await place(api, extender, xpu_pod("eight", {"kunlunxin.com/xpu": "8"}), names)
    assert result["NodeNames"] is None
    assert_books_balance(app)


async def test_whole_xpu_uuid_selection_and_topology_refusal(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"))
    _, result = await place(api, extender, xpu_pod("picky", {"kunlunxin.com/xpu": "1"}, annotations={
        "baidu.com/use-gpuuuid": "k1-kunlun-6"}), names)
    assert result["NodeNames"] == ["k1"]
    assert _annotations(api, app, "picky")["BAIDU_COM_DEVICE_IDX"] == "6"
    # Three cards is no topology upstream supports.
    _, result = await place(api, extender, xpu_pod("three", {"kunlunxin.com/xpu": "3"}), names)
    assert result["NodeNames"] is None and "NumaNotFit" in result["FailedNodes"]["k1"]
    assert_books_balance(app)


async def test_vxpu_shares_of_one_size_share_a_card(api, app, extender):
    cards = [dict(c) for c in XPU_CARDS]
    names = await register_nodes(api, app, kunlun_node("v1", xpu_register=orjson.dumps(cards).decode()))
    pod, result = await place(api, extender, xpu_pod("q1", {"kunlunxin.com/vxpu": "1",
                                                            "kunlunxin.com/vxpu-memory": "20000"}), names)
    assert result["NodeNames"] == ["v1"], result
    ann = _annotations(api, app, "q1")
    assert ann["hami.io/xpu-devices-allocated"] == ann["hami.io/xpu-devices-to-allocate"]
    [[dev]] = decode_pod_devices(ann["hami.io/xpu-devices-allocated"])
    assert (dev.type, dev.usedmem, dev.usedcores) == ("XPU", 24576, 25)
    bound = await extender.bind(pod, "v1")
    assert bound["Error"] == ""
    # A half card may not join the quarter's card (equal-size sharing).
    _, result = await place(api, extender, xpu_pod("h1", {"kunlunxin.com/vxpu": "1",
                                                          "kunlunxin.com/vxpu-memory": "49152"}), names)
    assert result["NodeNames"] == ["v1"]
    [[half]] = decode_pod_devices(_annotations(api, app, "h1")["hami.io/xpu-devices-allocated"])
    assert half.uuid != dev.uuid and (half.usedmem, half.usedcores) == (49152, 50)
    assert_books_balance(app)


async def test_two_cards_on_an_empty_board_come_from_one_group(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"))
    _, result = await place(api, extender, xpu_pod("pair", {"kunlunxin.com/xpu": "2"}), names)
    assert result["NodeNames"] == ["k1"], result
    ann = _annotations(api, app, "pair")
    assert ann["BAIDU_COM_DEVICE_IDX"] == "0,1"
    assert ann["hami.io/kunlun-allocated"] == "k1-kunlun-0,kunlun,98304,100:k1-kunlun-1,kunlun,98304,100:;"
    assert_books_balance(app)


async def test_a_card_holding_a_quarter_takes_only_quarters(api, app, extender):
    one = [dict(XPU_CARDS[0])]
    names = await register_nodes(api, app, kunlun_node("v1", xpu_register=orjson.dumps(one).decode()))
    _, result = await place(api, extender, xpu_pod("q1", {"kunlunxin.com/vxpu": "1",
                                                          "kunlunxin.com/vxpu-memory": "24576"}), names)
    assert result["NodeNames"] == ["v1"], result
    _, result = await place(api, extender, xpu_pod("h1", {"kunlunxin.com/vxpu": "1",
                                                          "kunlunxin.com/vxpu-memory": "49152"}), names)
    assert result["NodeNames"] is None and "v1" in result["FailedNodes"], result
    _, result = await place(api, extender, xpu_pod("q2", {"kunlunxin.com/vxpu": "1",
                                                          "kunlunxin.com/vxpu-memory": "24576"}), names)
    assert result["NodeNames"] == ["v1"], result
    assert [d["usedmem"] for d in app.cache.device_usage("v1")] == [49152]
    assert_books_balance(app)
