# `make serve` and `make test` set everything up on a fresh machine (a .venv here) and are instant once it is.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Benchmark datasets: ../shared/data beside a team checkout, else ./data (`python -m training download`).
export DBF_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(abspath data))

.PHONY: serve test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The service's dependencies only: serving never needs torch.
$(VENV)/.installed-serve: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $@

# Everything: training (torch) and the development tools.
$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[train,dev]'
	touch $@ $(VENV)/.installed-serve

serve: $(VENV)/.installed-serve
	$(BIN)/python -m service $(ARGS)

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating that as a failure" >&2; exit 1; fi; exit $$rc

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks.fusion --torch
	$(BIN)/python -m benchmarks.training

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
