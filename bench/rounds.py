"""What one measured round of /filter reports beyond the client's latencies: the server's own.

Several phases (filter, write-delay, backlog, the mixed clusters) measure /filter in rounds and
report the round with the median p99; each also reads the scheduler's request histogram before
and after a round, so that a tail the client saw can be told from one the server itself took.
"""
from __future__ import annotations

FILTER_SUM = 'hami_extender_request_duration_seconds_sum{verb="filter"}'
FILTER_COUNT = 'hami_extender_request_duration_seconds_count{verb="filter"}'
FILTER_UNDER_5MS = 'hami_extender_request_duration_seconds_bucket{le="0.005",verb="filter"}'


def server_over_5ms(before: dict, after: dict) -> float:
    """Share of the filters the server itself took more than 5 ms over (from its histogram): a
    tail seen by the client but not here comes from outside the request handler (the other
    processes on the same cores, the loop busy with other work before the request is read)."""
    count = after.get(FILTER_COUNT, 0) - before.get(FILTER_COUNT, 0)
    under = after.get(FILTER_UNDER_5MS, 0) - before.get(FILTER_UNDER_5MS, 0)
    return 100 * (count - under) / count if count else float("nan")


def server_mean_ms(before: dict, after: dict) -> float:
    count = after.get(FILTER_COUNT, 0) - before.get(FILTER_COUNT, 0)
    total = after.get(FILTER_SUM, 0) - before.get(FILTER_SUM, 0)
    return 1000 * total / count if count else float("nan")


def median_round(rounds: list[dict]) -> dict:
    """The round with the median p99, and every round's p99."""
    ordered = sorted(rounds, key=lambda r: r["p99"])
    return {**ordered[len(ordered) // 2], "p99_rounds": [r["p99"] for r in ordered]}
