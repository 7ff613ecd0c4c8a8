# torchforge developer targets. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv demo demo-repack demo-pypi repack-cuda-stack live-index-check example docs test goldens conda-forge-names bench bench-quick container-image container-check ci-local clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# the distribution was named torchforge before torchforge-conda: a venv made then still holds it
	$(BIN)/pip uninstall --quiet --yes torchforge 2>/dev/null || true
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install torchforge with its test dependencies

demo: $(STAMP)  ## the main job on the embedded default: print the variant table, render the default recipes into ./recipes, then demo-repack
	$(BIN)/torchforge matrix
	$(BIN)/torchforge render --out recipes --force
	$(MAKE) --no-print-directory demo-repack

DEMO := .cache/demo
DEMO_TORCH ?= 2.13.0
DEMO_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
DEMO_ARGS := --torch $(DEMO_TORCH) --cpu-index $(DEMO_CPU_INDEX) --work $(DEMO) --out forge-channel
demo-repack: $(STAMP)  ## fetch torch 2.13.0 (the CPU wheel, ~190 MB, from PyTorch's CPU index, else pip's index: it says which build came), repack it into ./forge-channel, audit it, install it with py-rattler, import it from a second venv (.cache/demo/py)
	$(BIN)/python scripts/demo_repack.py $(DEMO_ARGS)

demo-pypi: $(STAMP)  ## not in `make test` (~530 MB): demo-repack with pip's configuration set aside, as on a machine with stock PyPI
	env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	  $(BIN)/python scripts/demo_repack.py $(DEMO_ARGS)

example: $(STAMP)  ## the README's quick start, offline, in a fresh ./try: stand-in channel, build, install, import, upload to file://, install, import; its stack file; torch-scatter built for the repacked torch 2.13.0 CPU wheel (~5 min)
	rm -rf try
	$(BIN)/python -m tests.doccheck quickstart

docs: $(STAMP)  ## regenerate the data tables and output examples in README.md and docs/ (review the diff)
	$(BIN)/python -m tests.docgen

STACK := .cache/cu128
PY312 ?= $(shell command -v python3.12)
STACK_PYTORCH := 2.10.0
STACK_CUDA := 12.8
STACK_PY := 3.12
STACK_FETCH := --pytorch $(STACK_PYTORCH) --cuda $(STACK_CUDA) --py $(STACK_PY) --with torchvision,torchaudio --wheel-dir $(STACK)/wheels
repack-cuda-stack: $(STAMP)  ## not in `make test` (3.9 GB from PyPI): torch 2.10.0 CUDA 12.8 stack repacked both ways, audited, solved, installed, every DT_NEEDED checked
	nice $(BIN)/torchforge repack $(STACK_FETCH) --cuda-libs wheels --out $(STACK)/chan-wheels
	nice $(BIN)/torchforge repack $(STACK_FETCH) --cuda-libs conda-forge --out $(STACK)/chan-conda-forge
	for pkg in $(STACK)/chan-wheels/linux-64/*.conda $(STACK)/chan-conda-forge/linux-64/*.conda; do \
	  nice $(BIN)/torchforge rpath audit $$pkg || exit 1; done
	rm -rf $(STACK)/env $(STACK)/env-stand-ins $(STACK)/env-pkgs
	nice $(BIN)/python -m tests.stack_env $(STACK)/chan-wheels $(STACK)/env --cuda 12.8 --glibc 2.28
	@# With a Python 3.12 (PY312=/path/to/python3.12): import the stack from the prefix and run torchforge verify.
	if [ -n "$(PY312)" ]; then \
	  test -x $(STACK)/py312/bin/python || ($(PY312) -m venv $(STACK)/py312 && $(STACK)/py312/bin/pip install --quiet \
	    filelock typing_extensions sympy networkx jinja2 fsspec numpy pillow); \
	  env -u LD_LIBRARY_PATH nice $(BIN)/torchforge verify $(STACK)/env --python $(STACK)/py312/bin/python --want cuda --gpu-arch 9.0; \
	else echo "no Python 3.12 (PY312=...): torchforge verify of the prefix skipped"; fi

live-index-check: $(STAMP)  ## not in `make test` (asks PyPI): the stack's resolve today against the answer recorded in tests/fixtures/pip_resolve (RECORD=1 records today's)
	$(BIN)/python -m tests.recorded_index $(if $(RECORD),--record)

TESTS ?= tests
test: $(STAMP)  ## run the whole test suite (TESTS=tests/test_x.py: only those)
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(TESTS)

goldens: $(STAMP)  ## regenerate the golden recipes, CI workflows and dry runs (review the diff before committing)
	$(BIN)/python -m tests.golden.regenerate
	$(BIN)/python -m tests.golden.ci_regenerate
	$(BIN)/python -m tests.golden.conda_forge_regenerate
	$(BIN)/python -m tests.golden.dry_run_regenerate

conda-forge-names: $(STAMP)  ## rebuild torchforge/data/conda_forge_names.toml from the feedstock snapshots (fetch) and say what changed
	$(BIN)/python scripts/conda_forge_names.py --write

bench: $(STAMP)  ## run the benchmarks and print ratios (the repack row fetches the CUDA stack of repack-cuda-stack once, 3.9 GB)
	BENCH_STACK_REQUEST=$(STACK_PYTORCH)/$(STACK_CUDA)/$(STACK_PY) $(BIN)/python -m bench

BENCH ?=
bench-quick: $(STAMP)  ## every benchmark once at small sizes (CI: a broken benchmark fails the run; no figures to quote; BENCH=name: only those)
	$(BIN)/python -m bench --quick $(BENCH)

container-image: $(STAMP)  ## make the local podman build images for --container (rebuilds only what changed; root, podman, runc, debootstrap)
	$(BIN)/python -m tests.container_image

container-check: container-image  ## the real `torchforge build --container` builds with podman (both flavours)
	$(BIN)/python -m pytest -n 0 tests/test_container_build.py tests/test_container_conda_forge.py

ci-local: $(STAMP)  ## run `torchforge ci gitlab`'s pipelines here, twice each, with gitlab-ci-local + podman, and check their logs (.cache/ci-local): the official flavour's (torch_heavy) and the conda-forge flavour's 2.13.0 cpu one (torch_split); about 35 min
	$(BIN)/python -m tests.ci_local --check-tools
	env -u TORCHFORGE_NO_CONTAINER TORCHFORGE_STRICT_SKIPS=1 nice $(BIN)/python -m pytest -n 0 -m ci_local tests/test_ci_local.py

clean:  ## remove the virtualenv and generated output
	rm -rf $(VENV) recipes forge-channel try build dist .pytest_cache
