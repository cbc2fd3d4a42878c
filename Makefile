# Two set-up commands (see README.md): `make run` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test quick lint bench docs-check

# test processes: one per core, at most 4 (each test process holds up to ~2.4 GB); each runs
# torch on its share of the cores (tests/conftest.py), so the processes do not oversubscribe them
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

# the editable install puts the `lora-gui` command in $(VENV)/bin and lets `python -m lora_gui`
# run from any folder (the dependencies come from requirements.txt, the line above it)
$(VENV)/.runtime: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime tests/requirements.txt
	$(PY) -m pip install -q -r tests/requirements.txt
	touch $@

run: $(VENV)/.runtime
	$(PY) app.py

lint: $(VENV)/.test
	$(PY) -m ruff check .

# the figures pages in docs/results/ are what bench/results/ makes (a second, no torch)
docs-check: $(VENV)/.runtime
	$(PY) -m bench.docs --check

test: $(VENV)/.test lint docs-check
	$(PY) -m pytest tests -q --durations=10 -n $(TEST_WORKERS) --dist loadscope

# the inner loop: everything but the slow and integration tests (launches, browser)
quick: $(VENV)/.test lint
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadscope -m "not slow and not integration"

bench: $(VENV)/.runtime
	$(PY) -m bench.memory.text_memory
