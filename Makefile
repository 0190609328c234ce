# `make serve` and `make test` set everything up on a fresh machine (a .venv here) and are instant once it is.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Benchmark datasets: ../shared/data beside a team checkout, else ./data (`python -m training download`).
export DBF_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(abspath data))

MODELS := handwritten pie scene15 cub

.PHONY: serve test lint format bench docs clean models $(MODELS:%=model-%)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# onnxruntime's CPU build (pyproject's `cpu` extra), or its GPU build (`gpu`) where an NVIDIA driver answers;
# `make ORT=cpu ...` or `ORT=gpu` chooses. The two builds share the module's files: a switch removes the
# other first, and the stamp per choice makes a switch reinstall.
ifndef ORT
ORT := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
endif
ORT_OTHER := $(if $(filter gpu,$(ORT)),onnxruntime,onnxruntime-gpu)

$(VENV)/.onnxruntime-$(ORT): | $(BIN)/python
	if $(BIN)/python -m pip show --quiet $(ORT_OTHER) >/dev/null 2>&1; then \
		$(BIN)/python -m pip uninstall --quiet --yes $(ORT_OTHER); fi
	rm -f $(VENV)/.onnxruntime-*
	touch $@

# The service's dependencies only: serving never needs torch.
$(VENV)/.installed-serve: pyproject.toml constraints.txt $(VENV)/.onnxruntime-$(ORT) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(ORT)]'
	touch $@

# Everything: training (torch) and the development tools.
$(VENV)/.installed-dev: pyproject.toml constraints.txt $(VENV)/.onnxruntime-$(ORT) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[train,dev,$(ORT)]'
	touch $@ $(VENV)/.installed-serve

serve: $(VENV)/.installed-serve
	$(BIN)/python -m service $(ARGS)

# The suite in two processes (pytest-xdist), each test file whole in one of them: many tests wait on servers,
# Prometheus or Docker, and the other process runs meanwhile. `make test PYTEST_PROCESSES=0` runs it in one.
PYTEST_PROCESSES ?= 2

test: lint
	$(BIN)/python -m pytest -n $(PYTEST_PROCESSES) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating that as a failure" >&2; exit 1; fi; exit $$rc

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The docs site (docs/, mkdocs.yml), rebuilt on every edit; port 8001, beside the service's 8000.
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

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
