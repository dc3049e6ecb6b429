PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_RAW ?= demo-raw
DEMO_OUT ?= demo-out

.PHONY: install test test-faults test-gpu lint demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch; an unpinned torch would pull the CUDA build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

# Everything but GPU tests and the slow fault scenarios (Redis away for 30 s, visibility timeout).
test: install
	$(PY) -m pytest -q -m "not gpu and not slow" tests

# The whole fault-injection suite.
test-faults: install
	$(PY) -m pytest -q -m "not gpu" tests/faults

test-gpu: install
	$(PY) -m pytest -q -m gpu tests

lint: install
	$(VENV)/bin/ruff check tasks worker_config scripts tests bench
	$(VENV)/bin/ruff format --check tasks worker_config scripts tests bench
	$(VENV)/bin/mypy tasks worker_config

demo: install
	$(PY) scripts/make_sample_dataset.py $(DEMO_RAW) --videos 8
	$(PY) scripts/run_local.py $(DEMO_RAW) --out $(DEMO_OUT) --force

clean:
	rm -rf $(DEMO_RAW) $(DEMO_OUT) .pytest_cache
