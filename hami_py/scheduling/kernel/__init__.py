"""The fit kernel's contract: one query's input and output arrays (``fit_query``), and the rules it
computes in plain Python (``reference`` and ``reference_fit``, with the fragmentation-aware score
in ``frag``), which hypothesis holds the Cython kernel to."""
