# Two commands do all set-up: `make train` (the core, then CartPole) and `make test` (every extra, then the suite).
# Plain pip in a venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# A CPU build of torch from a local wheel folder (pip's find-links) when there is one;
# otherwise the range from pyproject.toml, which pip resolves from the index.
TORCH_WHEEL := $(firstword $(wildcard $(PIP_FIND_LINKS)/torch-*+cpu-cp3*.whl))
# Empty: lockstep train's default, the cartpole-fast preset; e.g. TRAIN_ARGS="--config cartpole-cleanrl".
TRAIN_ARGS ?=

.PHONY: install install-all node-actor train test test-fast proto clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# The core: what `lockstep train` needs for the default run (torch, gRPC, Gymnasium, TensorBoard).
$(VENV)/.core: $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || \
	  { [ -n "$(TORCH_WHEEL)" ] && $(PIP) install "$(TORCH_WHEEL)" || $(PIP) install "torch>=2.2"; }
	$(PIP) install -e .
	@touch $@

# Everything the suite uses: the test tools, every optional extra (so the suite skips nothing),
# and the benchmarks and model checker that live beside the runtime (dev/).
$(VENV)/.all: $(VENV)/.core dev/pyproject.toml
	$(PIP) install -e '.[test,all]' -e ./dev
	@touch $@

install: $(VENV)/.core

install-all: $(VENV)/.all node-actor

# The Node.js actor (examples/node-actor), whose test trains against a learner: its packages from the npm registry,
# at the versions of its package-lock.json. Without npm on this machine it is left out, and its test skips saying so.
NODE_ACTOR := examples/node-actor
ifneq ($(shell command -v npm 2>/dev/null),)
node-actor: $(NODE_ACTOR)/node_modules/.package-lock.json
$(NODE_ACTOR)/node_modules/.package-lock.json: $(NODE_ACTOR)/package-lock.json
	npm ci --prefix $(NODE_ACTOR) --no-audit --no-fund
else
node-actor:
	@echo "npm not found: examples/node-actor is not built and its test will skip (install Node.js 18 or newer)"
endif

train: install
	$(VENV)/bin/lockstep train $(TRAIN_ARGS)

test: install-all
	$(VENV)/bin/ruff check
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The inner loop: unit tests only (no learner processes, no training runs), under two minutes.
test-fast: install-all
	$(PY) -m pytest -q tests/unit

# Regenerate the committed gRPC modules after editing the .proto file.
proto: install-all
	$(PY) -m lockstep.transport.generate

clean:
	rm -rf $(VENV) runs .pytest_cache $(NODE_ACTOR)/node_modules
