"""hami-scheduler benchmarks: the real server, the in-repo API server, kube-scheduler's load.

Run with ``python -m bench`` (``make bench``) or ``python -m bench --quick`` (``make bench-quick``);
docs/BENCHMARKS.md says what is measured and how, and holds the latest full run's numbers.
"""
