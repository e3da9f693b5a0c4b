"""The scheduler's steps, in rooms that point one way (docs/ARCHITECTURE.md draws them).

* ``admission/``  the webhook's rules: which pods are ours, what they may ask for, which
                  annotations only the scheduler writes;
* ``verbs/``      the extender verbs around a decision: /filter's service, /bind, /prioritize,
                  /preempt, /refit, the pod locks, stale decisions cleared;
* ``eviction/``   making room by evicting pods: device preemption's victims and evictions, and
                  the holds that keep the room (preemption's and the defragmenter's);
* ``gangs/``      (beside eviction/) a gang's members reserved all together or not at all, and
                  each member's /filter answered with its planned node;
* ``decision/``   one pod's decision: its request rows, its policies, ``Filterer.decide``;
* ``kernel/``     the kernel's contract: its query arrays and its plain-Python reference.

Each imports only from the rooms listed after it (tests/test_rooms.py keeps it so).
"""
