"""``hami-scheduler simulate``: what fits where, answered by the real scheduler without a cluster.

Capacity planners ask the same questions every week (how many of these pods fit, which policy
packs them better, how much memory ends up stranded). The simulator answers them by starting the
production scheduler against the embedded API server, creating the nodes of a cluster file and
the pods of a workload file there, and sending every pod through /filter and /bind as
kube-scheduler would. There is no second implementation of the placement rules.

Modules: ``source`` (YAML with line numbers, input errors), ``cluster`` and ``workload`` (the two
input files, custom or plain Kubernetes YAML), ``runner`` (one scenario on an embedded
cluster), ``results`` (the figures), ``report_text`` / ``report_json`` / ``report_html`` and
``cli``.
"""
