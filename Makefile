# make demo: install what is missing, then run the main job on a simulated a100x8 host.
# make test: same install, then the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NATIVE_SRC := csrc/native.c csrc/native.h csrc/build_native.py setup.py pyproject.toml

.PHONY: all deps venv demo test bench clean
all: venv

deps:
	@sh scripts/install-deps

$(VENV)/.installed: $(NATIVE_SRC)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: deps $(VENV)/.installed

demo: venv
	sh scripts/demo

test: venv
	$(PY) -m pytest -q tests

bench: venv
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info libinject/_native*.so libinject/_native.c
