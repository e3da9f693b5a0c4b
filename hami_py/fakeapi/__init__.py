"""A fake kube-apiserver served over loopback HTTP, so tests and benchmarks exercise real clients."""
from hami_py.fakeapi.server import ApiError, Fault, FakeApiServer, FaultSet, write_kubeconfig

__all__ = ["ApiError", "Fault", "FakeApiServer", "FaultSet", "write_kubeconfig"]
