# `make serve` and `make test` set everything up on a fresh machine (a .venv here) and are instant once it is.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Benchmark datasets: ../shared/data beside a team checkout, else ./data (`python -m training download`).
export DBF_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(abspath data))

MODELS := handwritten pie scene15 cub

.PHONY: serve test lint format bench clean models $(MODELS:%=model-%)

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

# The committed model repository, regenerated from the benchmark data (deterministic: the same bytes on a
# rerun with the same library versions). `make -j2 models` trains two at a time.
models: $(MODELS:%=model-%)
	$(BIN)/python -c "import manifest, sys; sys.stdout.write(manifest.json_schema_text())" > models/manifest.schema.json

$(MODELS:%=model-%): model-%: $(VENV)/.installed-dev
	$(BIN)/python -m training export --dataset $* --out models/$* --data-dir $(DBF_DATA_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
