# hami-py developer entry points. Every target sets up (or refreshes) the local virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench bench-quick lint setup clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py cython_core/fit_kernel.pyx
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m hami_py demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

lint: $(STAMP)
	$(PY) -m compileall -q hami_py tests

clean:
	rm -rf $(VENV) build *.egg-info hami_py/_kernel*.so cython_core/*.c
