"""Feature-inventory rows of the NVIDIA fit: request defaults, the per-device checks in upstream's
order, and the device ordering, end to end through /filter.

Each test names its inventory row (docs/FEATURES.md) in a docstring line. The node is the
inventory's reference A100 (``GPU-0``: 8192 MiB, 100 cores, split 10) unless a test says otherwise.
"""
from __future__ import annotations

from hami_py.fakeapi.objects import gpu_pod
from hami_py import reasons
from tests.test_inventory_filter import A100_MIB, a100, allocation, place, reference_node, register, used_mem


async def _one_gpu(api, app) -> list[str]:
    return await register(api, app, reference_node())


async def _given(api, app, extender, name: str, **request) -> list:
    """Filter a pod onto n1 (it must fit); its allocation, one device list per container."""
    _, result = await place(api, extender, gpu_pod(name, **request), ["n1"])
    assert result["NodeNames"] == ["n1"], result
    return allocation(api, app, name)


# ---------------------------------------------------------------------------------------------
# what a request resolves to
# ---------------------------------------------------------------------------------------------

async def test_count_only_takes_the_whole_card(api, app, extender):
    """Inventory: req-whole-card-default (without the webhook, so no cores are added)"""
    await _one_gpu(api, app)
    [[device]] = await _given(api, app, extender, "whole")
    assert (device.uuid, device.usedmem, device.usedcores) == ("GPU-0", A100_MIB, 0)


async def test_memory_percentage_resolves_against_the_chosen_card(api, app, extender):
    """Inventory: req-percentage"""
    await _one_gpu(api, app)
    [[device]] = await _given(api, app, extender, "half", gpumem_percentage=50)
    assert device.usedmem == 4096


async def test_cores_above_100_are_refused_not_clamped(api, app, extender):
    """Inventory: fit-core-clamp (deliberate difference: HAMi after v2.10 refuses what v2.10 clamped)"""
    await _one_gpu(api, app)
    _, result = await place(api, extender, gpu_pod("greedy", gpumem=1000, gpucores=150), ["n1"])
    assert result["NodeNames"] is None and result["Error"] == (
        "pod default/greedy: invalid nvidia.com/gpucores value 150 in container main: "
        "must be an integer between 0 and 100")
    assert used_mem(app) == 0


async def test_init_containers_fit_on_their_own_before_the_app(api, app, extender):
    """Inventory: init-fit-sequential

    Init containers run before the app containers, so 6000 MiB for the init container and
    6000 MiB for the app both fit an 8192 MiB card; the card is charged the larger of the two."""
    await _one_gpu(api, app)
    pod = gpu_pod("p", gpumem=6000, init_gpus=1)
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "6000"
    _, result = await place(api, extender, pod, ["n1"])
    assert result["NodeNames"] == ["n1"], result
    assert [[d.uuid for d in c] for c in allocation(api, app, "p")] == [["GPU-0"], ["GPU-0"]]
    assert used_mem(app) == 6000


# ---------------------------------------------------------------------------------------------
# the per-device checks
# ---------------------------------------------------------------------------------------------

async def test_every_split_slot_taken_is_time_slicing_exhausted(api, app, extender):
    """Inventory: usage-slots"""
    await _one_gpu(api, app)
    for i in range(10):
        await _given(api, app, extender, f"p{i}", gpumem=100)
    _, result = await place(api, extender, gpu_pod("p10", gpumem=100), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 CardTimeSlicingExhausted"}


async def test_an_exclusive_request_needs_an_unused_card(api, app, extender):
    """Inventory: fit-exclusive"""
    await _one_gpu(api, app)
    await _given(api, app, extender, "small", gpumem=1000)           # a task that books no cores
    _, result = await place(api, extender, gpu_pod("exclusive", gpumem=1000, gpucores=100), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 ExclusiveDeviceAllocateConflict"}


async def test_a_zero_core_task_cannot_join_a_card_whose_cores_are_all_booked(api, app, extender):
    """Inventory: fit-zero-core-full"""
    await register(api, app, reference_node("n1", a100(devcore=100)))
    await _given(api, app, extender, "booked-a", gpumem=1000, gpucores=60)
    await _given(api, app, extender, "booked-b", gpumem=1000, gpucores=40)
    _, result = await place(api, extender, gpu_pod("zero", gpumem=1000, gpucores=0), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 CardComputeUnitsExhausted"}


async def test_free_cores_are_checked(api, app, extender):
    """Inventory: fit-insufficient-core"""
    await _one_gpu(api, app)
    await _given(api, app, extender, "eighty", gpumem=1000, gpucores=80)
    _, result = await place(api, extender, gpu_pod("thirty", gpumem=1000, gpucores=30), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientCore"}


async def test_any_model_name_registered_as_nvidia_is_a_candidate(api, app, extender):
    """Inventory: fit-type-substring (deliberate difference, docs/COMPATIBILITY.md "Fit and score")

    Upstream picks candidate devices by a case-insensitive substring of the vendor key in the
    model name, so a device registered as ``V100`` is no NVIDIA candidate (NodeInsufficientDevice).
    We go by the registration the device came in: the NVIDIA one."""
    await register(api, app, reference_node("plain", a100(type="V100")),
                   reference_node("prefixed", a100(type="nvidia-x")))
    for node in ("plain", "prefixed"):
        _, result = await place(api, extender, gpu_pod(f"on-{node}", gpumem=1000), [node])
        assert result["NodeNames"] == [node], result


# ---------------------------------------------------------------------------------------------
# device ordering
# ---------------------------------------------------------------------------------------------

async def test_policy_chain_breaks_exact_ties_by_the_higher_index(api, app, extender):
    """Inventory: gpu-policy-chain (ties go by registration position, normally the index;
    docs/COMPATIBILITY.md "Fit and score")"""
    await register(api, app, reference_node("n1", a100(0), a100(1)))
    [[device]] = await _given(api, app, extender, "p", gpumem=1000,
                              annotations={"hami.io/gpu-scheduler-policy": "binpack,numa"})
    assert device.uuid == "GPU-1"


async def test_invalid_scoring_weights_fail_with_upstreams_message(api, app, extender):
    """Inventory: score-weights-invalid

    Upstream's Error is ``calcScore failed invalid hami.io/device-scoring-weights annotation
    "slot=1,core=1": expected slot, core, and memory weights for pod p`` (Go's %q quoting)."""
    await _one_gpu(api, app)
    _, result = await place(api, extender, gpu_pod("p", gpumem=1000, annotations={
        "hami.io/device-scoring-weights": "slot=1,core=1"}), ["n1"])
    assert result["Error"].startswith('calcScore failed invalid hami.io/device-scoring-weights annotation '
                                      '"slot=1,core=1": expected slot, core, and memory weights'), result
    assert used_mem(app) == 0


def test_reasons_are_sorted_as_whole_strings_and_joined_with_a_comma():
    """Inventory: fit-reason-format

    Upstream sorts the ``<count>/<total> <Reason>`` strings themselves, so the count decides
    first, and as text ("10/12" before "2/12")."""
    assert reasons.gen_reason({reasons.CARD_TYPE_MISMATCH: 1, reasons.CARD_INSUFFICIENT_MEMORY: 2}, 3) == \
        "1/3 CardTypeMismatch, 2/3 CardInsufficientMemory"
    assert reasons.gen_reason({reasons.CARD_NOT_HEALTH: 2, reasons.CARD_CORDONED: 10}, 12) == \
        "10/12 CardCordoned, 2/12 CardNotHealth"
    assert reasons.gen_reason({reasons.CARD_NOT_HEALTH: 0, reasons.NUMA_NOT_FIT: 1}, 1) == "1/1 NumaNotFit"
