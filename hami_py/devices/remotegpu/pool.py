"""The remote-GPU fit: one whole lupine server per pod, chosen from the books.

A client pointed at a server sees every GPU of it, and nothing on the wire narrows that down, so
the server is the smallest thing one pod can be given without handing it to another pod too
(HAMi #3004). Hence:

* every healthy card of the chosen server goes to each container asking, charged whole (all of
  its memory, 100 % of its cores); the memory asked is only a filter (a card below it does not
  count towards the request);
* one card in use (charged in the books, or busy per the server's own ``/metrics``) makes the
  whole server taken;
* one server per pod (HAMi #3164/#3166): it must satisfy every container's request, so the
  answer does not depend on the order of the containers;
* the smallest sufficient server (fewest healthy cards) wins, ties by server name; a request
  larger than any one server is not served even when the fleet holds enough cards.

The cards live in the books as devices of their server node (``<server>/<GPU-UUID>``), so
charges, recounts and node removals work as for any device; the pool is read from those nodes'
slices of the device table, never from the candidate node.
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py import reasons as R
from hami_py.devices.base import ContainerDevice, ContainerRequest, PodDevices
from hami_py.devices.remotegpu.busy import BusyCards

NO_SERVER = ("no remote GPU server in the cluster: no node labelled hami.io/lupine-server registers "
             "a GPU in remote mode")
_NODE_SHORT = "NodeInsufficientDevice"


@dataclass(slots=True)
class Server:
    """One server node's cards as the books hold them: (device table slot, device)."""
    name: str
    endpoint: str
    cards: list


def servers_of(cache, vendor_id: int, names) -> list[Server]:
    """The server nodes among ``names`` that the books hold cards of this family for, by name."""
    out = []
    vendor_col, nodes = cache.vendor, cache.nodes
    for name in sorted(names):
        entry = nodes.get(name)
        if entry is None or not entry.length:
            continue
        cards = [(entry.offset + k, dev) for k, dev in enumerate(entry.devices[:entry.length])
                 if vendor_col[entry.offset + k] == vendor_id]
        if cards:
            out.append(Server(name, str((cards[0][1].custom or {}).get("endpoint", "")), cards))
    return out


def choose(cache, servers: list[Server], asks: list[tuple[int, ContainerRequest]], busy: BusyCards,
           vendor_key: str, containers: int) -> tuple[PodDevices | str, bool]:
    """(One device list per container, or why no server serves the pod; whether a card in use
    stood in the way, so that the busy cards are worth reading again)."""
    if not servers:
        return NO_SERVER, False
    used, health, total_mem = cache.used, cache.health, cache.total_mem
    counts: dict[str, int] = {}
    total = 0
    conflict = False
    best: tuple[int, str, list] | None = None
    biggest_ask = max(req.nums for _, req in asks)
    for server in servers:
        total += len(server.cards)
        healthy = []
        taken = False
        for j, dev in server.cards:
            uuid = str((dev.custom or {}).get("uuid", dev.id))
            if not health[j]:
                _count(counts, R.NAMES[R.CARD_NOT_HEALTH])
            elif used[j] > 0 or busy.busy(server.endpoint, uuid):
                _count(counts, R.NAMES[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT])
                taken = True
            else:
                healthy.append(j)
        if taken:
            conflict = True
            continue
        short_of_memory = [j for j in healthy if any(0 < req.memreq > total_mem[j] for _, req in asks)]
        for _ in short_of_memory:
            _count(counts, R.NAMES[R.CARD_INSUFFICIENT_MEMORY])
        if all(sum(1 for j in healthy if not 0 < req.memreq > total_mem[j]) >= req.nums for _, req in asks):
            if best is None or len(healthy) < best[0]:
                best = (len(healthy), server.name, [(j, server) for j in healthy])
        elif len(healthy) < biggest_ask:
            _count(counts, _NODE_SHORT)
    if best is None:
        return (", ".join(sorted(f"{c}/{total} {name}" for name, c in counts.items()))
                or f"{total}/{total} {_NODE_SHORT}"), conflict
    ids = cache.device_ids
    chosen = [ContainerDevice(ids[j], vendor_key, total_mem[j], 100) for j, _ in best[2]]
    allocation: PodDevices = [[] for _ in range(containers)]
    for position, _ in asks:
        allocation[position] = [ContainerDevice(d.uuid, d.type, d.usedmem, d.usedcores) for d in chosen]
    return allocation, conflict


def _count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1
