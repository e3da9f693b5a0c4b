"""``hami-scheduler defrag``: make room for pending device pods (or free whole devices) by moving
the fewest pods, planned with the scheduler's own fit code.

Modules: ``plan`` (the plan's records and its JSON), ``search`` (the books, the movable pods and
one trial), ``planner`` (the goals: making room, and through ``freeing`` freeing whole devices),
``world`` (a cluster dump or a live cluster loaded into the scheduler's books), ``report`` (table
and HTML), ``execute`` (``--execute``: evictions, holds, events) and ``cli``. What it shares with
``simulate`` (the cluster file, the YAML reader, the report palette) is hami_py/offline/; the
simulator runs this package's planner, and nothing here imports the simulator.
"""
