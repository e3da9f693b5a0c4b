"""Scheduling policies: which node wins, which device is tried first, how devices are weighed.

Defaults come from ``--node-scheduler-policy`` and ``--gpu-scheduler-policy``; a pod may override
each with ``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy``, and reweigh the
device score with ``hami.io/device-scoring-weights`` (``slot=1,core=1,memory=3``).

Policy values are trimmed, each token of a comma list too (HAMi #2854: ``" binpack "`` is
binpack). A pod's policy annotation that names an unknown policy is ignored, with a warning, and
the configured policy used (HAMi #2769): the pod is scheduled, not refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import structlog

from hami_py.devices.codec import go_quote
from hami_py.kernel_codes import (
    CHAIN_BASE, KEY_BINPACK, KEY_FRAG, KEY_NUMA, KEY_SPREAD, ORDER_CHAIN, ORDER_MUTEX, POLICY_BINPACK, POLICY_FRAG,
    POLICY_SPREAD,
)

NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
WEIGHTS_ANNOTATION = "hami.io/device-scoring-weights"
# A pod without any of these is scheduled with the configured policies alone.
POLICY_ANNOTATIONS = frozenset((NODE_POLICY_ANNOTATION, GPU_POLICY_ANNOTATION, WEIGHTS_ANNOTATION))

BINPACK = "binpack"
SPREAD = "spread"
# Keeps whole devices whole and strands as little memory as it can (docs/FRAGMENTATION.md): a
# node policy, and a GPU policy token that chains like the others ("numa,fragmentation-aware").
FRAGMENTATION_AWARE = "fragmentation-aware"
NODE_POLICIES = (BINPACK, SPREAD, FRAGMENTATION_AWARE)

log = structlog.get_logger(__name__)


class PolicyError(ValueError):
    """A policy annotation the pod cannot be scheduled with."""


@dataclass(slots=True, frozen=True)
class Policies:
    node: int
    gpu: int            # the kernel's device ordering (single policy or a chain of sort keys)
    numa_bind: bool
    mutex: bool         # "mutex" token: only devices nobody uses yet
    topology: bool      # "topology-aware" token: best-connected set by NVLink pair scores
    weights: tuple[float, float, float]
    node_name: str
    gpu_name: str


def node_policy_code(name: str) -> int:
    # Upstream sorts "spread" descending and anything else ascending, so only spread spreads.
    if name == FRAGMENTATION_AWARE:
        return POLICY_FRAG
    return POLICY_SPREAD if name == SPREAD else POLICY_BINPACK


_CHAIN_KEYS = {"binpack": KEY_BINPACK, "spread": KEY_SPREAD, "numa": KEY_NUMA, FRAGMENTATION_AWARE: KEY_FRAG}


def gpu_policy_code(name: str, *, numa_bind: bool = False) -> int:
    """The device ordering for a GPU policy string, as upstream's comparator reads it.

    A comma list (or plain ``numa`` or ``fragmentation-aware``) is a chain of sort keys among
    binpack, spread, numa and fragmentation-aware, in order, duplicates and other tokens
    (``mutex``, ``topology-aware``) ignored, ``spread`` when empty, and ``numa`` moved first when
    the pod asks for NUMA binding. ``mutex`` alone orders
    idle devices first. ``binpack`` tries the most-used device first; anything else the least-used.
    """
    if "," in name or name in ("numa", FRAGMENTATION_AWARE):
        keys: list[int] = []
        for token in name.split(","):
            key = _CHAIN_KEYS.get(token.strip())
            if key is not None and key not in keys:
                keys.append(key)
        if not keys:
            keys = [KEY_SPREAD]
        if numa_bind and keys[0] != KEY_NUMA:
            keys = [KEY_NUMA] + [k for k in keys if k != KEY_NUMA]
        return ORDER_CHAIN + sum(k * CHAIN_BASE ** i for i, k in enumerate(keys[:3]))
    if name == "mutex":
        return ORDER_MUTEX
    return POLICY_BINPACK if name == BINPACK else POLICY_SPREAD


# Every token a GPU policy string may hold (one, or a comma chain of binpack/spread/numa/
# fragmentation-aware).
GPU_POLICY_TOKENS = frozenset({"binpack", "spread", "numa", "mutex", "topology-aware", FRAGMENTATION_AWARE})


def policy_tokens(name: str) -> set[str]:
    return {t.strip() for t in name.split(",")}


def normal_gpu_policy(name: str) -> str:
    """A GPU policy with every comma token trimmed (``" binpack , numa "`` → ``binpack,numa``)."""
    return ",".join(t.strip() for t in name.split(","))


def known_gpu_policy(name: str) -> bool:
    """Every token of the (trimmed) GPU policy is one the scheduler knows."""
    return all(t in GPU_POLICY_TOKENS for t in name.split(","))


def _annotated(annotations: dict[str, str], key: str, default: str, normal, known, pod: str) -> str:
    """The pod's policy annotation, trimmed, or ``default`` when it is absent, blank or names a
    policy the scheduler does not know (then with a warning: HAMi #2769 uses the configured
    policy rather than refusing the pod)."""
    raw = annotations.get(key)
    if raw is None:
        return default
    value = normal(raw)
    if not value:
        return default
    if not known(value):
        log.warning("unknown scheduling policy in pod annotation ignored", pod=pod, annotation=key, value=raw,
                    using=default)
        return default
    return value


def scoring_weights(annotations: dict[str, str]) -> tuple[float, float, float]:
    raw = annotations.get(WEIGHTS_ANNOTATION)
    if raw is None:
        return (1.0, 1.0, 1.0)

    def fail(why: str) -> PolicyError:
        return PolicyError(f"invalid {WEIGHTS_ANNOTATION} annotation {go_quote(raw)}: {why}")

    entries = [e.strip() for e in raw.split(",")]
    if len(entries) != 3:
        raise fail("expected slot, core, and memory weights")
    values: dict[str, int] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            raise fail("expected key=value entries")
        key, value = key.strip(), value.strip()
        if key in values:
            raise fail(f'duplicate "{key}" weight')
        try:
            number = int(value, 10)
        except ValueError:
            raise fail(f'"{key}" weight must be an integer') from None
        if number < 0:
            raise fail(f'"{key}" weight must not be negative')
        if key not in ("slot", "core", "memory"):
            raise fail(f'unknown weight "{key}"')
        values[key] = number
    if not any(values.values()):
        raise fail("at least one weight must be positive")
    return (float(values["slot"]), float(values["core"]), float(values["memory"]))


def pod_policies(annotations: dict[str, str], *, default_node: str, default_gpu: str,
                 numa_bind: bool = False, pod: str = "") -> Policies:
    """The pod's policies; ``numa_bind`` says whether one of its device families asks for all
    its devices on one NUMA node (each family reads its own annotation). ``pod`` names it in
    the warning about an unknown policy annotation."""
    default_node, default_gpu = default_node.strip(), normal_gpu_policy(default_gpu)
    node_name = _annotated(annotations, NODE_POLICY_ANNOTATION, default_node, str.strip,
                           NODE_POLICIES.__contains__, pod)
    gpu_name = _annotated(annotations, GPU_POLICY_ANNOTATION, default_gpu, normal_gpu_policy, known_gpu_policy,
                          pod)
    return Policies(
        node=node_policy_code(node_name),
        gpu=gpu_policy_code(gpu_name, numa_bind=numa_bind),
        numa_bind=numa_bind,
        mutex="mutex" in policy_tokens(gpu_name),
        topology="topology-aware" in policy_tokens(gpu_name),
        weights=scoring_weights(annotations),
        node_name=node_name,
        gpu_name=gpu_name,
    )
