# The README's two commands: `make demo` and `make test`. Each creates .venv and installs the
# pinned requirements on first use (and again whenever requirements.txt changes).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
BENCH_VENV := .venv-bench
export PYTHONPATH := $(CURDIR)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv venv-cuda demo test test-all bench bench-deps bench-record bench-check bench-tables clean

$(INSTALLED): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	# dm-acme 0.4.0 for the ActorQ compatibility test (acme.core, EnvironmentLoop): without its
	# dependencies, whose dm-launchpad pin has no wheel for Python 3.11 (see DESIGN notes).
	$(PY) -m pip install --quiet --no-deps dm-acme==0.4.0
	touch $(INSTALLED)

venv: $(INSTALLED)

# On a CUDA machine only: JAX's CUDA 12 backend, so the ActorQ learner can run on the GPU
# (`--learner_device=gpu`) while actors stay on CPU.
venv-cuda: $(INSTALLED)
	$(PY) -m pip install --quiet -r requirements-cuda.txt

demo: $(INSTALLED)
	$(PY) -m launch.demo --workdir=runs/demo

test: $(INSTALLED)
	$(PY) -m pytest -m "not slow"

test-all: $(INSTALLED)
	$(PY) -m pytest

$(BENCH_VENV)/.installed: requirements-bench.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -r requirements-bench.txt
	touch $@

bench-deps: $(BENCH_VENV)/.installed

bench: $(INSTALLED) $(BENCH_VENV)/.installed
	$(PY) -m bench.inference --peer_python=$(BENCH_VENV)/bin/python
	$(PY) -m bench.int8_lean --peer_python=$(BENCH_VENV)/bin/python
	$(PY) -m bench.dqn_throughput
	$(PY) -m bench.train_throughput --case=all
	$(PY) -m bench.qat_overhead
	$(PY) -m bench.actorq
	$(PY) -m bench.offline_throughput --bf16 --peer_python=$(BENCH_VENV)/bin/python
	$(PY) -m bench.study_launch

# Store this machine kind's figures (results/bench/<kind>/), compare a fresh run with them (prints
# what moved by more than 15%; exit 1 when anything did), regenerate the README's tables.
bench-record: $(INSTALLED) $(BENCH_VENV)/.installed
	$(PY) -m bench.suite --record

bench-check: $(INSTALLED) $(BENCH_VENV)/.installed
	$(PY) -m bench.suite --check

bench-tables: $(INSTALLED)
	$(PY) -m bench.tables

clean:
	rm -rf runs MUJOCO_LOG.TXT
