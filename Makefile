# torchforge developer targets. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv demo test goldens bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install torchforge with its test dependencies

demo: $(STAMP)  ## the main job on the embedded default: render the default recipes into ./recipes, print the variant table
	$(BIN)/torchforge matrix
	$(BIN)/torchforge render --out recipes --force

test: $(STAMP)  ## run the whole test suite
	$(BIN)/python -m pytest -n 2 tests

goldens: $(STAMP)  ## regenerate the golden recipes and CI workflows (review the diff before committing)
	$(BIN)/python -m tests.golden.regenerate
	$(BIN)/python -m tests.golden.ci_regenerate

bench: $(STAMP)  ## run the benchmarks and print ratios
	$(BIN)/python -m bench

clean:  ## remove the virtualenv and generated output
	rm -rf $(VENV) recipes forge-channel build dist .pytest_cache
