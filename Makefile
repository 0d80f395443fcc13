# The two front-door commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
PIP_FLAGS ?= --disable-pip-version-check -q
# The versions of PyTorch (PyPI's Linux wheel, with its CUDA libraries) and of the test tools
# the project is tested with.
CONSTRAINTS := constraints.txt
# The suite runs on two workers (pytest-xdist); the tests that start servers keep to one worker
# per group (tests/engines, tests/cloud).
PYTEST_WORKERS ?= 2

.PHONY: demo test check lint typecheck unit slow bench gpu-prepare gpu-check clean help engines-fetch

help:
	@echo "make demo   - create $(VENV), install linstream, run the demo Beam job"
	@echo "make test   - create $(VENV), install test extras, run lint, types and the test suite"
	@echo "make check  - lint, types and the fast tier (unit and in-process stage tests, no whole jobs)"
	@echo "make bench  - run the benchmarks in tests/bench (slow)"
	@echo "make slow   - run the slow-marked tests (long sequences)"
	@echo "make engines-fetch - fetch Flink, Spark, Kafka and Prism for the engine tests (background)"
	@echo "make gpu-prepare - (with the network) fetch the device's wheels into build/whl, prepare the"
	@echo "              CPU references into build/gpu-check, print the carry size and device command"
	@echo "make gpu-check - the whole GPU check in one run (<= 9 min; exits 0 saying so without a GPU)"

$(VENV)/.created:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"linstream needs Python 3.11+, found {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) $(PIP_FLAGS) install --upgrade "pip>=24" "setuptools>=77" wheel
	touch $@

# The extras README's commands need (pandas reads the results).
DEMO_EXTRAS := pandas

$(VENV)/.demo: $(VENV)/.created pyproject.toml $(CONSTRAINTS)
	$(PIP) $(PIP_FLAGS) install -c $(CONSTRAINTS) -e '.[$(DEMO_EXTRAS)]'
	touch $@

$(VENV)/.test: $(VENV)/.created pyproject.toml $(CONSTRAINTS)
	$(PIP) $(PIP_FLAGS) install -c $(CONSTRAINTS) -e '.[test,torch,mkl,gcp,aws]'
	touch $@ $(VENV)/.demo

demo: $(VENV)/.demo
	$(BIN)/linstream demo

# mypy cannot follow setuptools' editable import hook, so it reads the sources through a
# small tree of links that spells out the package names (linstream.ops -> ops/, ...).
build/typecheck/linstream:
	mkdir -p $@
	ln -sfn ../../../ops $@/ops
	ln -sfn ../../../state $@/state
	ln -sfn ../../../pipeline $@/pipeline

lint: $(VENV)/.test build/typecheck/linstream
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd build/typecheck && PYTHONPATH=. ../../$(BIN)/lint-imports ../../pyproject.toml

typecheck: $(VENV)/.test build/typecheck/linstream
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml \
		-p linstream.ops -p linstream.state -p linstream.pipeline

unit: $(VENV)/.test
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

# The engines the engine tests (tests/engines/) run on: Beam's Flink and Spark job servers and a
# Kafka broker (jars, by mvn) and Prism (go install), into ~/.cache/linstream/engines.  Started
# in the background first, so that the slow fetches overlap lint, types and the rest of the
# suite; the engine tests run last and wait for them (deploy/engines/fetch.sh locks each piece).
ENGINES_LOG := build/engines-fetch.log
engines-fetch:
	@mkdir -p build
	@echo "fetching the engines in the background (log: $(ENGINES_LOG))"
	@nohup deploy/engines/fetch.sh >$(ENGINES_LOG) 2>&1 &

# In `make test` an engine that cannot be fetched fails its tests instead of skipping them.
test: export LINSTREAM_ENGINES := require
test: engines-fetch lint typecheck unit

# The fast tier: everything but the end-to-end tests (whole jobs on a runner, the command in a
# subprocess, servers); minutes where `make test` takes much longer.
check: lint typecheck
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow and not bench and not e2e"

slow: $(VENV)/.test
	$(BIN)/python -m pytest -m slow -s

bench: $(VENV)/.test
	$(BIN)/python -m pytest tests/bench -m bench -s -p no:randomly

# The GPU check: kernels and fla families, correctness then speed, under one 9-minute budget
# (tests/gpu/gpu_check_all.py; its docstring says what to carry to a machine with a device).
gpu-prepare: $(VENV)/.test
	$(BIN)/python tests/gpu/gpu_check_all.py --prepare

gpu-check: $(VENV)/.test
	PYTHONUNBUFFERED=1 $(BIN)/python tests/gpu/gpu_check_all.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
