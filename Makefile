# dpbert: every target creates .venv/ from the lock when it is missing (no resolver runs).
SHELL := /bin/bash
PYTHON_VERSION := 3.10
VENV := .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock-py310.txt
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONHASHSEED := 0

.PHONY: venv browser demo test test-slow test-all bench lock clean

# The project last: a PEP 660 editable install of pyproject.toml built with the lock's setuptools and
# wheel (--no-build-isolation: no build environment is downloaded, nothing outside the lock is installed).
$(VENV)/.installed: $(LOCK) requirements/nodeps.txt pyproject.toml
	@if [ ! -x "$(PY)" ]; then \
	  interp=$$(PYENV_VERSION=$(PYTHON_VERSION) pyenv which python 2>/dev/null || command -v python$(PYTHON_VERSION) || command -v python3); \
	  echo "creating $(VENV) with $$interp"; \
	  "$$interp" -c 'import sys; assert sys.version_info[:2] == (3, 10), "dpbert needs Python 3.10 (tfx 1.16), got %s" % sys.version' && \
	  "$$interp" -m venv $(VENV); \
	fi
	$(PY) -m pip install -q --upgrade 'pip<25'
	$(PY) -m pip install -q --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps -r requirements/nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/dpbert run --output demo_output

# Headless Chromium + chromedriver for the dashboard's browser tests (Debian; idempotent, never fails).
browser:
	bash .ci/install-chromium.sh

# Two pytest-xdist workers (one TensorFlow thread each: tests/conftest.py); --dist loadgroup keeps the
# tests of one xdist_group (the shared tiny DAG run) on one worker.
PYTEST_XDIST := -n 2 --dist loadgroup

# The dev loop (docs/development.md): everything but the tests marked slow (subprocess and
# multi-process runs of code the in-process tests cover, the whole-DAG runs).
test: venv browser
	$(PY) -m pytest -q $(PYTEST_XDIST) -m "not slow" tests

# The slow tier only; CI runs `make test` then this (.ci/run).
test-slow: venv browser
	$(PY) -m pytest -q $(PYTEST_XDIST) -m slow tests

test-all: venv browser
	$(PY) -m pytest -q $(PYTEST_XDIST) tests

# The benchmarks that finish in minutes (every benchmark and its command: docs/benchmarks.md; the
# others run for tens of minutes to hours): the dataset budget's rules side by side (accounting only,
# seconds) and the DP-SGD step ÷ the non-DP step on the tiny model (--quick: 3 timed steps per mode;
# 3 min 21 s on 2 cores at load 6-7, 2026-11-28).
bench: venv
	$(PY) benchmarks/budget_filter_rules.py
	$(PY) benchmarks/dpsgd_step.py --quick --configs tiny --skip-trainable

lock:
	uv pip compile --python-version 3.10 --python-platform x86_64-manylinux_2_36 \
	  -c requirements/constraints-tfx116.txt requirements/requirements.in -o $(LOCK)

clean:
	rm -rf $(VENV) demo_output build *.egg-info
