# Settings shared by the kind scripts; every one can be overridden from the environment
# (e.g. `make kind-deploy IMAGE=hami-py:test`).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KIND_CLUSTER="${KIND_CLUSTER:-hami-py}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.32.0}"
IMAGE="${IMAGE:-hami-py:dev}"
KUBECTL="${KUBECTL:-kubectl} --context kind-${KIND_CLUSTER}"
# The Python that runs hami_py.fakeapi.families (the checkout's virtualenv when there is one).
KIND_PYTHON="${KIND_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$KIND_PYTHON" ] || KIND_PYTHON=python3
FAKE_DEVICE="${FAKE_DEVICE:-nvidia}"
families() {  # python -m hami_py.fakeapi.families ..., from the checkout
  (cd "$ROOT" && "$KIND_PYTHON" -m hami_py.fakeapi.families "$@")
}
