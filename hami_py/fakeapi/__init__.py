"""A fake kube-apiserver served over loopback HTTP, so tests and benchmarks exercise real clients."""
from hami_py.fakeapi.errors import ApiError
from hami_py.fakeapi.faults import Fault, FaultSet
from hami_py.fakeapi.server import FakeApiServer, write_kubeconfig

__all__ = ["ApiError", "Fault", "FakeApiServer", "FaultSet", "write_kubeconfig"]
