"""hami-py: a HAMi-compatible Kubernetes scheduler extender for sharing GPUs between pods."""
__version__ = "0.1.0"
