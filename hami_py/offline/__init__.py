"""What the offline tools (``simulate``, ``defrag``) share, below both of them.

Both read a cluster the same way and report devices the same way, and neither should reach into
the other for it: ``source`` (YAML with line numbers, input errors), ``cluster`` (the cluster
file, custom or plain Kubernetes YAML), ``palette`` (the reports' colours, glyphs and CSS) and
``charts`` (the pages' inline SVG bars and lines, and the layout that holds at 900 px).
The flags' one-line errors are ``hami_py/cliargs.py``, which the scheduler's own command shares.
"""
