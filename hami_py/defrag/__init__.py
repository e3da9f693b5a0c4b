"""``hami-scheduler defrag``: make room for pending device pods (or free whole devices) by moving
the fewest pods, planned with the scheduler's own fit code.

Modules: ``plan`` (the plan's records and its JSON), ``planner`` (the search), ``world`` (a
cluster dump or a live cluster loaded into the scheduler's books), ``report`` (table and HTML),
``execute`` (``--execute``: evictions, holds, events) and ``cli``.
"""
