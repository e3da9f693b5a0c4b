"""Ascend's three vNPU modes, and which pods may share a node and an NPU (HAMi after v2.10).

* ``template`` (hard split): memory is rounded up to a vNPU template; no cores.
* ``hami-core`` (soft split): memory as asked, cores a percentage of the NPU (hami-vnpu-core).
* ``enpu`` (#3110): the soft split of Huawei's ENPU runtime: one NPU per container, memory as
  asked, cores a percentage (the whole NPU's, 100, when the container names none) and a
  scheduling policy shared by every ENPU pod of an NPU.

A node says what it runs in two annotations its device plugin writes, ``"true"`` or anything
else: ``hami-vnpu-core`` (hami-core) and ``hami.io/enpu`` (ENPU). Where one is missing the
config's default mode (``vnpus.hamiVnpuMode``) answers for it. A node may run both soft modes.

A pod names its mode in ``huawei.com/vnpu-mode``: ``hami-core``, ``template``, ``enpu`` (also
``ubs-virt`` and ``vcann-rt``, the ENPU runtime's own names), or nothing (or a value no rule knows,
read as nothing, as upstream reads it).

Node rules (upstream's Fit before it looks at an NPU; ModeNotFit on every NPU of the node):
a hami-core pod needs a node running hami-core; a template pod a node running neither soft mode;
an ENPU pod a node running ENPU; any other pod is refused by a node running ENPU alone (it must
say ``enpu``). An ENPU pod whose policy is not one of the three is refused everywhere.

NPU rules (the modes of the pods already charged to it, kept with their charges: ``pod_marks``):
an ENPU pod never shares an NPU (a DIE) with a hami-core pod, nor with a mode-less pod on a node
running hami-core; no other pod shares one with an ENPU pod; ENPU pods on one NPU have one
policy, and an ENPU pod there whose recorded policy is missing or unknown shares with none.

A pod naming no mode resolves to one per node (HAMi #3107, ``effective_mode``): hami-core on a
node running hami-core (memory as asked), template elsewhere (memory rounded to a template, at
fit time: charger.py). The decision writes the answer for the chosen node into
``hami.io/effective-vnpu-mode``.

Policies (``normalize_policy``): ``1``/``fixed``/``fixed-share``/``fixed_share`` → fixed-share,
``2``/``elastic`` → elastic, ``3``/``best-effort``/``best_effort``/``besteffort`` → best-effort, in
any case and padding. A pod's comes from, first non-blank: its annotation
``huawei.com/enpu-policy``, its annotation ``huawei.com/scheduler.softShareDev.policy``, its label
of that name, the config's ``vnpus.enpuPolicy``, else elastic. The webhook writes the result into
``huawei.com/enpu-policy``, so a later change of the config's default moves no admitted pod.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from hami_py.reasons import MODE_NOT_FIT

# Pod annotations
VNPU_MODE_ANNOTATION = "huawei.com/vnpu-mode"
ENPU_POLICY_ANNOTATION = "huawei.com/enpu-policy"
SOFT_SHARE_POLICY_KEY = "huawei.com/scheduler.softShareDev.policy"   # annotation, then label
# Written by the decision: the mode the pod resolves to on the chosen node (template, hami-core, enpu).
EFFECTIVE_MODE_ANNOTATION = "hami.io/effective-vnpu-mode"

VNPU_MODE_TEMPLATE = "template"
VNPU_MODE_HAMI_CORE = "hami-core"
VNPU_MODE_ENPU = "enpu"
ENPU_MODES = frozenset((VNPU_MODE_ENPU, "ubs-virt", "vcann-rt"))

# Node annotations the device plugin writes ("true" or anything else).
NODE_HAMI_CORE_ANNOTATION = "hami-vnpu-core"
NODE_ENPU_ANNOTATION = "hami.io/enpu"

POLICY_FIXED_SHARE = "fixed-share"
POLICY_ELASTIC = "elastic"
POLICY_BEST_EFFORT = "best-effort"
_POLICIES = {
    "1": POLICY_FIXED_SHARE, "fixed": POLICY_FIXED_SHARE, "fixed-share": POLICY_FIXED_SHARE,
    "fixed_share": POLICY_FIXED_SHARE,
    "2": POLICY_ELASTIC, "elastic": POLICY_ELASTIC,
    "3": POLICY_BEST_EFFORT, "best-effort": POLICY_BEST_EFFORT, "best_effort": POLICY_BEST_EFFORT,
    "besteffort": POLICY_BEST_EFFORT,
}
POLICY_CHOICES = "fixed-share (1), elastic (2) or best-effort (3)"

# An NPU's compute on a soft-split node is a percentage budget: 100, or more when the plugin
# advertises a deliberate oversell (HAMi #2952).
PERCENT_BASE = 100


def config_mode(written: str, legacy_hami_core: bool) -> str | None:
    """The config's default mode from ``hamiVnpuMode`` (and, when it is empty, the deprecated
    ``hamiVnpuCore``); None when ``hamiVnpuMode`` is none of the modes."""
    mode = written.strip().lower()
    if not mode:
        return VNPU_MODE_HAMI_CORE if legacy_hami_core else VNPU_MODE_TEMPLATE
    if mode in ("hamicore", VNPU_MODE_HAMI_CORE):
        return VNPU_MODE_HAMI_CORE
    if mode in (VNPU_MODE_TEMPLATE, VNPU_MODE_ENPU):
        return mode
    return None


def is_enpu(mode: str | None) -> bool:
    return mode in ENPU_MODES


def is_soft(mode: str | None) -> bool:
    """Whether a pod of this mode is soft split (memory as asked, cores allowed)."""
    return mode == VNPU_MODE_HAMI_CORE or mode in ENPU_MODES


def normalize_policy(value: str) -> str | None:
    """The policy ``value`` names (trimmed, any case); "" for a blank one; None for an unknown one."""
    text = value.strip().lower()
    if not text:
        return ""
    return _POLICIES.get(text)


@dataclass(slots=True, frozen=True)
class PolicyChoice:
    """An ENPU pod's policy: the normalised value (None: not a policy), and where it was read."""
    policy: str | None
    source: str
    raw: str


def pod_policy(annotations: Mapping[str, str], labels: Mapping[str, str] | None, default: str) -> PolicyChoice:
    """The ENPU policy of a pod with these annotations and labels (labels are only known at
    admission; the webhook writes the answer into the pod's own annotation)."""
    sources = ((annotations, ENPU_POLICY_ANNOTATION, f"annotation {ENPU_POLICY_ANNOTATION}"),
               (annotations, SOFT_SHARE_POLICY_KEY, f"annotation {SOFT_SHARE_POLICY_KEY}"),
               (labels or {}, SOFT_SHARE_POLICY_KEY, f"label {SOFT_SHARE_POLICY_KEY}"))
    for mapping, key, where in sources:
        raw = mapping.get(key)
        if isinstance(raw, str) and raw.strip():
            return PolicyChoice(normalize_policy(raw), where, raw)
    if default.strip():
        return PolicyChoice(normalize_policy(default), "vnpus.enpuPolicy", default)
    return PolicyChoice(POLICY_ELASTIC, "default", "")


@dataclass(slots=True, frozen=True)
class NodeModes:
    """What a node runs: hami-core, ENPU (either, both, or neither: template)."""
    hami_core: bool
    enpu: bool

    @classmethod
    def of(cls, annotations: Mapping[str, str], default_mode: str) -> "NodeModes":
        core = annotations.get(NODE_HAMI_CORE_ANNOTATION)
        enpu = annotations.get(NODE_ENPU_ANNOTATION)
        return cls(hami_core=default_mode == VNPU_MODE_HAMI_CORE if core is None else core == "true",
                   enpu=default_mode == VNPU_MODE_ENPU if enpu is None else enpu == "true")

    @property
    def soft(self) -> bool:
        return self.hami_core or self.enpu

    def tag(self) -> str:
        """The node's modes as its NPUs carry them (``DeviceInfo.mode``): "" on a template node."""
        return "+".join(m for m, on in ((VNPU_MODE_HAMI_CORE, self.hami_core), (VNPU_MODE_ENPU, self.enpu)) if on)

    @classmethod
    def from_tag(cls, tag: str) -> "NodeModes":
        parts = tag.split("+")
        return cls(hami_core=VNPU_MODE_HAMI_CORE in parts, enpu=VNPU_MODE_ENPU in parts)


def node_refuses(mode: str | None, node: NodeModes) -> bool:
    """Whether a pod of ``mode`` may not use any NPU of ``node`` (upstream's ModeNotFit)."""
    if mode == VNPU_MODE_HAMI_CORE:
        return not node.hami_core
    if mode == VNPU_MODE_TEMPLATE:
        return node.soft
    if mode in ENPU_MODES:
        return not node.enpu
    return node.enpu and not node.hami_core         # a mode-less pod on an ENPU-only node


def effective_mode(mode: str | None, node: NodeModes) -> str:
    """The mode a pod naming ``mode`` runs in on ``node``: its own (ENPU's runtime names as
    ``enpu``), or for a pod naming none (or a value no rule knows) hami-core where the node runs
    it, else template. Where the node refuses the pod (``node_refuses``) the answer is unused."""
    if mode in ENPU_MODES:
        return VNPU_MODE_ENPU
    if mode in (VNPU_MODE_HAMI_CORE, VNPU_MODE_TEMPLATE):
        return mode
    return VNPU_MODE_HAMI_CORE if node.hami_core else VNPU_MODE_TEMPLATE


def npu_refuses(mode: str | None, policy: str | None, node: NodeModes, tenants: Iterable[Mapping[str, str]]) -> int:
    """MODE_NOT_FIT when a pod of ``mode`` (an ENPU one with ``policy``) may not join the pods
    charged to one NPU (``tenants``: their kept marks), else 0."""
    enpu = mode in ENPU_MODES
    for marks in tenants:
        other = marks.get(VNPU_MODE_ANNOTATION, "")
        if enpu:
            if other == VNPU_MODE_HAMI_CORE or (not other and node.hami_core):
                return MODE_NOT_FIT
            if other in ENPU_MODES:
                theirs = normalize_policy(marks.get(ENPU_POLICY_ANNOTATION, ""))
                if not theirs or theirs != policy:
                    return MODE_NOT_FIT
        elif other in ENPU_MODES:
            return MODE_NOT_FIT
    return 0
