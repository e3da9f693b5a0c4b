"""Vastai (Vastaitech) accelerators: whole cards or dies, by slots, through HAMi's Vastai plugin.

The plugin registers its devices as a JSON list in ``hami.io/node-va-register`` and answers the
``hami.io/node-handshake-va`` handshake; the kubelet's allocatable ``vastaitech.com/va`` is the
liveness fallback. Each device may carry ``custominfo``: ``DeviceStrategy`` (``"die"`` when the
plugin registers every die of a card as its own device) and ``AIC`` (the card a die sits on). A
container asks only for a count (``vastaitech.com/va``); each device it gets takes a slot, and
memory and cores are neither checked nor charged (devcore is forced to 100, as upstream).

Die mode (the node's first Vastai device has ``DeviceStrategy: die``), in :func:`choose_dies`:
every fitting die is collected; one die asked: the first in the policy's order; several: the
dies are grouped by card (AIC), the fullest groups first, and taken in that order, so a
container's dies sit on as few cards as possible. Under the ``mutex`` GPU policy a card is
exclusive: an idle die whose card has a die in use is refused. Outside die mode the generic
first fit applies. The node score adds, per container, the largest share of its devices on one
card (upstream's AIC concentration, hami-scheduling.md §9.2).

The decision writes ``hami.io/Vastai-devices-to-allocate`` and ``hami.io/Vastai-devices-allocated``
(upstream's capitalisation); the bind takes HAMi's node lock. Pods pick devices by id with
``vastaitech.com/use-gpuuuid`` / ``vastaitech.com/nouse-gpuuuid``.

Deliberate differences (docs/devices/vastai.md): a malformed count refuses the pod naming
container, resource and value; dies of equally full cards are taken in the policy's order (Go's
map order is random); a multi-die request that the AIC grouping cannot fill (dies without an
AIC) is refused, where upstream returns fewer dies than asked.
"""
from __future__ import annotations

from hami_py.config import ConfigSection, DeviceConfig
from hami_py.devices.base import FLAG_CHOOSE, DeviceInfo
from hami_py.devices.template import CountOnlyConfig, SlotsOnly, TemplateSpec, TemplateVendor
from hami_py.reasons import ALLOCATED_CARDS_INSUFFICIENT_REQUEST, EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT

VENDOR_KEY = "Vastai"
SECTION = "vastai"

REGISTER_ANNOTATION = "hami.io/node-va-register"
HANDSHAKE_ANNOTATION = "hami.io/node-handshake-va"
TO_ALLOCATE_ANNOTATION = "hami.io/Vastai-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/Vastai-devices-allocated"
USE_UUID_ANNOTATION = "vastaitech.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "vastaitech.com/nouse-gpuuuid"

STRATEGY_KEY = "DeviceStrategy"
DIE_STRATEGY = "die"
AIC_KEY = "AIC"


VastaiConfig = CountOnlyConfig     # the ``vastai`` section: resourceCountName alone
CONFIG_SECTION = ConfigSection(SECTION, VastaiConfig.KEYS)


def aic_of(device: DeviceInfo) -> str | None:
    """The card (AIC) a die sits on, when its custom info names one as a string."""
    value = device.custom.get(AIC_KEY) if device.custom else None
    return value if type(value) is str else None


def is_die_mode(device: DeviceInfo) -> bool:
    return bool(device.custom) and device.custom.get(STRATEGY_KEY) == DIE_STRATEGY


def choose_dies(aics: list[str | None], nums: int) -> list[int] | None:
    """Upstream's die-mode choice among the fitting dies, given each one's card in the policy's
    order: their offsets into ``aics``, or None when the grouping cannot give ``nums``.

    Exactly ``nums`` fit: all of them. One asked: the first. Otherwise group by card (dies
    without one are left out), groups by size descending, ties in order of first appearance,
    and take the groups' dies in order until ``nums``."""
    if len(aics) == nums:
        return list(range(nums))
    if len(aics) < nums:
        return None
    if nums == 1:
        return [0]
    groups: dict[str, list[int]] = {}
    for i, aic in enumerate(aics):
        if aic is not None:
            groups.setdefault(aic, []).append(i)
    chosen: list[int] = []
    for members in sorted(groups.values(), key=len, reverse=True):   # stable: ties keep their order
        for i in members:
            chosen.append(i)
            if len(chosen) == nums:
                return chosen
    return None


def container_score(devices: list[DeviceInfo]) -> float | None:
    """Upstream's ScoreNode term of one container's devices: the largest number on one card over
    the number counted; None when the whole node scores 0 (a device without custom info, with a
    strategy other than ``die``, or without an AIC)."""
    counts: dict[str, int] = {}
    for device in devices:
        info = device.custom
        if not info:
            return None
        strategy = info.get(STRATEGY_KEY)
        if type(strategy) is str and strategy != DIE_STRATEGY:
            return None
        if AIC_KEY not in info:
            return None
        aic = info[AIC_KEY]
        if type(aic) is str:
            counts[aic] = counts.get(aic, 0) + 1
    total = sum(counts.values())
    return max(counts.values()) / total if total else 0.0


def vastai_chooser(cache, vendor_id: int, mutex: bool, init_rows: list[bool] = ()):
    """The FLAG_CHOOSE callable for one filter. Per node it remembers the dies the pod's app
    containers got there (under ``mutex`` they occupy their cards for the later app containers,
    as upstream's cumulative usage copy has them; each init container starts from the node as it
    was, ``init_rows`` telling which rows are init containers') and the AIC score so far (over
    all the pod's containers), so the deltas of a pod's rows add up to upstream's node score."""
    app_picks: dict[int, list[int]] = {}      # node index -> positions given to app containers
    calls: dict[int, int] = {}                # node index -> rows chosen so far
    score_on: dict[int, float | None] = {}    # node index -> score so far (None: the node scores 0)
    used, vendor = cache.used, cache.vendor

    def choose(node_index: int, positions: list[int], nums: int):
        row = calls.get(node_index, 0)
        calls[node_index] = row + 1
        is_init = row < len(init_rows) and bool(init_rows[row])
        devices = cache.devices_at(node_index)
        offset = cache.node_offset[node_index]
        mine = [k for k in range(len(devices)) if vendor[offset + k] == vendor_id]
        # An init container sees what the app rows (its native sidecars, which come first) took.
        earlier = list(app_picks.get(node_index, ())) if is_init else app_picks.setdefault(node_index, [])
        if mine and is_die_mode(devices[mine[0]]):
            if mutex:
                taken = set(earlier)
                occupied = {aic_of(devices[k]) for k in mine if used[offset + k] > 0 or k in taken}
                occupied.discard(None)
                positions = [p for p in positions if aic_of(devices[p]) not in occupied]
                if len(positions) < nums:
                    return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
            offsets = choose_dies([aic_of(devices[p]) for p in positions], nums)
            if offsets is None:
                return ALLOCATED_CARDS_INSUFFICIENT_REQUEST
            chosen = [positions[i] for i in offsets]
        else:
            chosen = positions[:nums]
        if not is_init:
            app_picks[node_index].extend(chosen)
        before = score_on.get(node_index, 0.0)
        term = container_score([devices[p] for p in chosen])
        after = None if before is None or term is None else before + term
        score_on[node_index] = after
        return chosen, (after or 0.0) - (before or 0.0)

    return choose


class VastaiVendor(SlotsOnly, TemplateVendor):
    """Upstream's ``Vastai`` vendor."""

    kernel_flags = FLAG_CHOOSE

    def __init__(self, config: VastaiConfig):
        self.config = config
        super().__init__(TemplateSpec(
            vendor_key=VENDOR_KEY,
            count_resource=config.resource_count_name,
            register_annotation=REGISTER_ANNOTATION,
            handshake_annotation=HANDSHAKE_ANNOTATION,
            to_allocate_annotation=TO_ALLOCATE_ANNOTATION,
            allocated_annotation=ALLOCATED_ANNOTATION,
            use_uuid=(USE_UUID_ANNOTATION,),
            nouse_uuid=(NOUSE_UUID_ANNOTATION,),
        ))

    def chooser(self, cache, ask):
        """Under the ``mutex`` GPU policy (the pod's, else the scheduler's) a card is exclusive."""
        mutex = "mutex" in {t.strip() for t in ask.gpu_policy.split(",")}
        return vastai_chooser(cache, cache.vendor_ids[VENDOR_KEY], mutex, ask.init_rows)


def build_family(config: DeviceConfig, switches) -> list[VastaiVendor]:
    """Always built, as upstream always initialises it."""
    return [VastaiVendor(VastaiConfig.from_section(config.section(SECTION)))]
