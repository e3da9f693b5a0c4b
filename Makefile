# hami-py developer entry points. Every target sets up (or refreshes) the local virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The kernel's sources: every file of cython_core/ but the C that Cython generates from them.
KERNEL_SOURCES := $(filter-out %.c,$(wildcard cython_core/*))

.PHONY: run test bench bench-quick lint setup clean

# Container image and a kind cluster to try it on (need docker and kind; see README "Deploy").
IMAGE        ?= hami-py:dev
KIND_CLUSTER ?= hami-py
export IMAGE KIND_CLUSTER
.PHONY: image kind-up kind-deploy kind-demo kind-demo-preemption kind-down

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py pyproject.toml $(KERNEL_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m hami_py simulate --cluster examples/realistic/cluster.yaml --workload examples/realistic/workload.yaml

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

lint: $(STAMP)
	$(PY) -m compileall -q hami_py tests

image:
	docker build -t $(IMAGE) .

kind-up:
	hack/kind/up.sh

kind-deploy: image
	hack/kind/deploy.sh

# FAKE_DEVICE: the device family the demo fakes on the workers (nvidia, ascend910b3, mlu370,
# kunlun, ...: python -m hami_py.fakeapi.families --list).
FAKE_DEVICE ?= nvidia
kind-demo: export FAKE_DEVICE := $(FAKE_DEVICE)
kind-demo:
	hack/kind/demo.sh

# A low-priority batch pod fills a worker's GPUs, a high-priority pod preempts it
# (make kind-deploy KIND_MANIFESTS=overlays/kube-scheduler-in-the-loop first, or it turns
# --device-preemption on itself).
kind-demo-preemption:
	hack/kind/preemption-demo.sh

kind-down:
	kind delete cluster --name $(KIND_CLUSTER)

clean:
	rm -rf $(VENV) build *.egg-info hami_py/_kernel*.so cython_core/*.c
