# Two commands do all set-up: `make train` and `make test`. Plain pip in a venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# A CPU build of torch from a local wheel folder (pip's find-links) when there is one;
# otherwise the range from pyproject.toml, which pip resolves from the index.
TORCH_WHEEL := $(firstword $(wildcard $(PIP_FIND_LINKS)/torch-*+cpu-cp3*.whl))
# Empty: lockstep train's default, the cartpole-fast preset; e.g. TRAIN_ARGS="--config cartpole-cleanrl".
TRAIN_ARGS ?=

.PHONY: install train test proto clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || \
	  { [ -n "$(TORCH_WHEEL)" ] && $(PIP) install "$(TORCH_WHEEL)" || $(PIP) install "torch>=2.2"; }
	$(PIP) install -e '.[test,all]'  # the optional extras too, so the suite skips nothing
	@touch $@

install: $(VENV)/.installed

train: install
	$(VENV)/bin/lockstep train $(TRAIN_ARGS)

test: install
	$(VENV)/bin/ruff check
	$(PY) -m pytest -q

# Regenerate the committed gRPC modules after editing the .proto file.
proto: install
	$(PY) -m lockstep.transport.generate

clean:
	rm -rf $(VENV) runs .pytest_cache
