"""``hami-scheduler simulate``: what fits where, answered by the real scheduler without a cluster.

Capacity planners ask the same questions every week (how many of these pods fit, which policy
packs them better, how much memory ends up stranded). The simulator answers them by starting the
production scheduler against the embedded API server, creating the nodes of a cluster file and
the pods of a workload file there, and sending every pod through /filter and /bind as
kube-scheduler would. There is no second implementation of the placement rules.

Modules: ``workload`` (the workload file, custom or plain Kubernetes YAML; the cluster file and
the YAML reader are hami_py/offline/, shared with ``defrag``), ``runner`` (scenarios, each on an
embedded cluster), ``scenario_run`` (one scenario's arrivals, as kube-scheduler sends them),
``defragment`` (``--defrag-every``: the defragmenter's planner run inside a scenario),
``figures`` and ``results`` (the figures), ``report_text`` / ``report_json`` / ``report_html``
(with ``heatmap`` and ``report_charts``, the page's pictures) and ``cli``. The simulator uses the defragmenter (``hami_py.defrag``); the defragmenter never
uses the simulator.
"""
