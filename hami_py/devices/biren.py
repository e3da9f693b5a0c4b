"""Biren GPUs, shared by slots through HAMi's Biren device plugin.

The plugin registers its GPUs as a JSON list in ``hami.io/node-biren-register`` and answers the
``hami.io/node-handshake-biren`` handshake; the kubelet's allocatable ``birentech.com/gpu`` is the
liveness fallback. A container asks only for a count (``birentech.com/gpu``): each GPU it gets
takes one of the device's ``count`` slots, and nothing else: memory and cores are neither
checked nor charged (upstream charges 0 MiB and 0 cores; the registered devcore is forced to 100,
as upstream does for its node score). Pods pick GPUs by id with ``birentech.com/use-gpuuuid`` /
``birentech.com/nouse-gpuuuid`` (upstream defines ``birentech.com/use-biren``/``nouse-biren``
but never reads them). The decision writes ``hami.io/Biren-devices-to-allocate`` and
``hami.io/Biren-devices-allocated`` (upstream's capitalisation), and the bind takes HAMi's node
lock.

Deliberate difference from upstream (docs/devices/biren.md): a malformed count refuses the pod
with a RequestError naming container, resource and value (upstream drops the request).
"""
from __future__ import annotations

from hami_py.config import ConfigSection, DeviceConfig
from hami_py.devices.template import CountOnlyConfig, SlotsOnly, TemplateSpec, TemplateVendor

VENDOR_KEY = "Biren"
SECTION = "biren"

REGISTER_ANNOTATION = "hami.io/node-biren-register"
HANDSHAKE_ANNOTATION = "hami.io/node-handshake-biren"
TO_ALLOCATE_ANNOTATION = "hami.io/Biren-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/Biren-devices-allocated"
USE_UUID_ANNOTATION = "birentech.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "birentech.com/nouse-gpuuuid"


BirenConfig = CountOnlyConfig     # the ``biren`` section: resourceCountName alone
CONFIG_SECTION = ConfigSection(SECTION, BirenConfig.KEYS)


class BirenVendor(SlotsOnly, TemplateVendor):
    """Upstream's ``Biren`` vendor: slots only."""

    def __init__(self, config: BirenConfig):
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


def build_family(config: DeviceConfig, switches) -> list[BirenVendor]:
    """Always built, as upstream always initialises it."""
    return [BirenVendor(BirenConfig.from_section(config.section(SECTION)))]
