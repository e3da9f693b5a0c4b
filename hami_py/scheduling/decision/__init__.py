"""One pod's decision: its request as flat rows, its node and device policies, and
``Filterer.decide``, which reads free capacity, runs the kernel and reserves in one synchronous
stretch."""
