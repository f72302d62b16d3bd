# Two entry points: `make demo` (the main job) and `make test` (set up + whole suite).
# Each creates .venv from the requirements when it is missing or out of date.
# The interpreter .venv is made with: the first python3.11 on PATH (README: an optimised
# build runs the Python-heavy tools faster; `rm -rf .venv` before choosing another).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEMO_OUTPUT ?= demo_output
PYTEST_ARGS ?=
# The suite runs on this many processes (pytest-xdist; `--dist loadfile`: all tests of a
# module on one worker, so a module's fixtures (tiny trained runs, exports) are built once;
# `--no-loadscope-reorder`: the modules in collection order, the longest first
# (tests/conftest.py `LONGEST_MODULES`), not xdist's default of the most tests first;
# what several modules read is built once per session: tests/conftest.py `built_once`).
# Two: on a 2-core machine the processes the tests start (kills, serving, paper blocks)
# keep both cores busy while a test waits, and a third worker only adds contention (whole
# suite, AMD Zen 3, 2026-11-30, two runs each: 1,222 and 1,363 s, 2,326 and 2,553 CPU-s
# with 2 workers; 1,403 and 1,496 s, 2,755 and 2,892 CPU-s with 3; Intel Xeon, 2026-12-01:
# 525, 554 and 564 s with 2, 562 s with 3). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

.PHONY: demo test test-fast bench clean

$(VENV)/.runtime: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . || $(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt requirements-beam.txt requirements-reference.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	rm -rf $(VENV)/reference
	$(PY) -m pip install --quiet --target $(VENV)/reference -r requirements-reference.txt
	touch $@

demo: $(VENV)/.runtime
	$(PY) demo.py --output_dir=$(DEMO_OUTPUT)

test: $(VENV)/.dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: $(VENV)/.dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_OUTPUT) build *.egg-info
