"""``nvidia.com/mig-profile-preference``: the MIG profiles a pod would rather have (HAMi #3014).

A comma-separated list in order of preference; each entry, trimmed, is a profile name
(``3g.20gb``) or a slice key (``3g``, the part before the first ``.``, matching that size on every
model). Empty entries and repeats are dropped. The webhook refuses a value with no entry, or with
an entry that matches no profile of the config's ``migProfileAllowlist`` (a typo is caught when
the pod is created, not by a pod that never gets the profile it asked for).

At /filter the preferred profiles are tried first on each GPU, in the order listed (an entry
matching several profiles, a slice key, takes them smallest first), then the others smallest
first; a profile without the memory asked is never tried. The kernel reads the order as a rank
per profile of the cache's partition table (``preference_ranks``, through
``DeviceVendor.partition_ranks``), so it plans a container's instances with it like any other
order. A preference only reorders: a pod the preferred profiles cannot hold still gets the
others, and a pod without the annotation is placed exactly as before.
"""
from __future__ import annotations

from array import array

from hami_py.devices.codec import go_quote
from hami_py.devices.nvidia.config import MigProfileAllowlistEntry

MIG_PROFILE_PREFERENCE_ANNOTATION = "nvidia.com/mig-profile-preference"


def slice_key(profile: str) -> str:
    """``3g`` of ``3g.20gb``; a name without a '.' (or starting with one) is its own key."""
    head, dot, _ = profile.partition(".")
    return head if dot and head else profile


def matches(profile: str, entry: str) -> bool:
    return profile == entry or slice_key(profile) == entry


def parse_preference(raw: str) -> list[str]:
    """The entries in the order listed: trimmed, without empty ones and repeats."""
    preferred: list[str] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if entry and entry not in preferred:
            preferred.append(entry)
    return preferred


def preference_refusal(annotations: dict[str, str], allowlist: list[MigProfileAllowlistEntry]) -> str | None:
    """Why the pod's preference is refused (upstream's words), or None (none set, or valid)."""
    raw = annotations.get(MIG_PROFILE_PREFERENCE_ANNOTATION)
    if raw is None:
        return None
    preferred = parse_preference(raw)
    if not preferred:
        return (f"invalid {MIG_PROFILE_PREFERENCE_ANNOTATION} value {go_quote(raw)}: expected a comma-separated "
                'list of MIG profiles such as "4g.20gb" or "4g"')
    for entry in preferred:
        if not any(matches(profile, entry) for allowed in allowlist for profile in allowed.profiles):
            return (f"invalid {MIG_PROFILE_PREFERENCE_ANNOTATION} entry {go_quote(entry)}: it does not match any "
                    "profile in migProfileAllowlist")
    return None


def preference_ranks(annotations: dict[str, str], profile_names: list[str]) -> array | None:
    """Per name of ``profile_names``: the position (from 1) of the first preference entry it
    matches, 0 when none does; None when the pod states no preference (nothing to reorder)."""
    raw = annotations.get(MIG_PROFILE_PREFERENCE_ANNOTATION)
    if raw is None:
        return None
    preferred = parse_preference(raw)
    if not preferred:
        return None
    ranks = array("i", bytes(4 * len(profile_names)))
    for p, name in enumerate(profile_names):
        for rank, entry in enumerate(preferred, 1):
            if matches(name, entry):
                ranks[p] = rank
                break
    return ranks
