"""Enflame whole GCUs end to end with the kernel's FLAG_EXCLUSIVE rule (upstream's reason)."""
from __future__ import annotations

from tests.conftest import assert_books_balance, place, register_nodes
from tests.test_family_enflame import enflame_node, gcu_pod


async def test_a_busy_gcu_refuses_with_upstreams_exclusive_reason(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", gcus="1"))
    _, result = await place(api, extender, gcu_pod("first", {"enflame.com/gcu": "1"}), names)
    assert result["NodeNames"] == ["e1"], result
    _, result = await place(api, extender, gcu_pod("second", {"enflame.com/gcu": "1"}), names)
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"e1": "1/1 ExclusiveDeviceAllocateConflict"}
    assert_books_balance(app)
