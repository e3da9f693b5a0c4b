"""Which device families this scheduler manages, built from the device config.

The cache, the filter, the binder and the webhook iterate over the mapping this module builds and
never name a family themselves. Each family module exposes ``build_family(config, switches)``
returning its vendors (none, one, or one per configured chip kind, as Ascend and Iluvatar have)
and ``CONFIG_SECTION``, the top-level section of the device config file it reads
(``hami_py.config.ConfigSection``), which this module hands to ``hami_py.config`` so that the file
reader knows every family's section without importing one. Adding a family is one module plus
one line in ``_family_modules``.

The order is upstream's initialisation order with NVIDIA first: it fixes the vendor ids, the
order of ``managedResources`` and the order in which a multi-family pod's annotations are built.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from hami_py.config import ConfigSection, DeviceConfig, declare_family_sections
from hami_py.devices.base import DeviceVendor
from hami_py.devices.codec import go_quote


@dataclass(slots=True, frozen=True)
class FamilySwitches:
    """The command-line switches upstream gates families with (``--enable-ascend`` ...)."""
    enable_ascend: bool = False
    enable_iluvatar: bool = False


# What a planning tool (simulate, defrag) reads a cluster with: every family upstream gates
# behind a switch is on, so a file of any family can be read.
EVERY_FAMILY = FamilySwitches(enable_ascend=True, enable_iluvatar=True)


def _family_modules() -> list[ModuleType]:
    """The family modules, in order; each has ``build_family`` and ``CONFIG_SECTION``."""
    from hami_py.devices import nvidia
    families = [nvidia]
    # One line per family (each module owns its config section and its switch).
    from hami_py.devices import cambricon; families.append(cambricon)  # noqa: E702
    from hami_py.devices import hygon; families.append(hygon)  # noqa: E702
    from hami_py.devices import iluvatar; families.append(iluvatar)  # noqa: E702
    from hami_py.devices import enflame; families.append(enflame)  # noqa: E702
    from hami_py.devices import mthreads; families.append(mthreads)  # noqa: E702
    from hami_py.devices import metax; families.append(metax)  # noqa: E702
    from hami_py.devices import kunlun; families.append(kunlun)  # noqa: E702
    from hami_py.devices import awsneuron; families.append(awsneuron)  # noqa: E702
    from hami_py.devices import amd; families.append(amd)  # noqa: E702
    from hami_py.devices import vastai; families.append(vastai)  # noqa: E702
    from hami_py.devices import biren; families.append(biren)  # noqa: E702
    from hami_py.devices import ascend; families.append(ascend)  # noqa: E702
    from hami_py.devices import remotegpu; families.append(remotegpu)  # noqa: E702
    return families


def _families() -> list[Callable[[DeviceConfig, FamilySwitches], list[DeviceVendor]]]:
    return [family.build_family for family in _family_modules()]


def config_sections() -> list[ConfigSection]:
    """Every family's section of the device config file, in family order."""
    return [family.CONFIG_SECTION for family in _family_modules()]


# The config file reader learns the families' sections from here (it imports no family).
declare_family_sections(config_sections)


def build_vendors(config: DeviceConfig, switches: FamilySwitches | None = None) -> dict[str, DeviceVendor]:
    """Vendor key -> vendor, for every family the config and the switches enable.

    NVIDIA is always built, even without an ``nvidia`` section (then with empty resource names,
    so it matches no container), as upstream always initialises it.

    Raises ConfigError, naming every problem at once, when the families' values are unusable
    (:func:`config_problems`): upstream's scheduler refuses to start on them too.
    """
    switches = switches or FamilySwitches()
    vendors: dict[str, DeviceVendor] = {}
    for build in _families():
        for vendor in build(config, switches):
            if vendor.vendor_key in vendors:
                raise ValueError(f"device config: two device kinds share the vendor key {vendor.vendor_key!r}")
            vendors[vendor.vendor_key] = vendor
    problems = config_problems(vendors)
    if problems:
        raise config.error(f"invalid device configuration: {'; '.join(problems)}")
    return vendors


def config_problems(vendors: dict[str, DeviceVendor]) -> list[str]:
    """Each family's own problems (``DeviceVendor.config_problems``), then every resource count
    name two backends claim (after the families' defaults): a container asking for it would be
    given devices of both, twice what it asked for."""
    problems = [problem for vendor in vendors.values() for problem in vendor.config_problems()]
    claimed: dict[str, str] = {}
    for key, vendor in vendors.items():
        count = vendor.request_resources()[0]
        if not count:
            continue
        if count in claimed:
            problems.append(f"{claimed[count]} and {key} both claim resource {go_quote(count)}; "
                            "a container requesting it would be allocated devices by both")
        else:
            claimed[count] = key
    return problems


def managed_resource_names(vendors: dict[str, DeviceVendor]) -> list[str]:
    """Every extended resource the vendors manage, each once, in vendor then vendor-given order.

    This is what the kube-scheduler extender config lists as ``managedResources``: only pods
    asking for one of these are sent to us.
    """
    seen: dict[str, None] = {}
    for vendor in vendors.values():
        for name in vendor.resource_names():
            seen.setdefault(name, None)
    return list(seen)
