# torchforge developer targets. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv demo demo-repack repack-cuda-stack example docs test goldens bench bench-quick container-image container-check ci-local clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install torchforge with its test dependencies

demo: $(STAMP)  ## the main job on the embedded default: print the variant table, render the default recipes into ./recipes, then demo-repack
	$(BIN)/torchforge matrix
	$(BIN)/torchforge render --out recipes --force
	$(MAKE) --no-print-directory demo-repack

DEMO := .cache/demo
demo-repack: $(STAMP)  ## download the official torch 2.13.0 CPU wheel (~190 MB), repack it into ./forge-channel, install it with py-rattler, import it from a second venv (.cache/demo/py)
	$(BIN)/pip download torch==2.13.0 --no-deps --quiet -d $(DEMO)/wheels
	$(BIN)/torchforge repack $(DEMO)/wheels/torch-2.13.0*.whl --out forge-channel --replace
	$(BIN)/torchforge rpath audit forge-channel/linux-64/pytorch-2.13.0-whl_py3.11_cpu_0.conda
	test -x $(DEMO)/py/bin/python || ($(BIN)/python -m venv $(DEMO)/py && $(DEMO)/py/bin/pip install --quiet typing_extensions sympy networkx jinja2 filelock fsspec numpy)
	rm -rf $(DEMO)/env
	$(BIN)/python -c "from pathlib import Path; from torchforge.repack import install_from_channel; print(install_from_channel(Path('forge-channel'), Path('$(DEMO)/env')))"
	PYTHONPATH=$(DEMO)/env/lib/python3.11/site-packages $(DEMO)/py/bin/python -c "import torch; print(torch.__version__, torch.__file__); print('torch.ones(3).sum() =', torch.ones(3).sum().item())"

example: $(STAMP)  ## the README's quick start, offline, in a fresh ./try: stand-in channel, build, install, import, upload to file://, install, import
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
	  env -u LD_LIBRARY_PATH nice $(BIN)/torchforge verify $(STACK)/env --python $(STACK)/py312/bin/python --want cuda; \
	else echo "no Python 3.12 (PY312=...): torchforge verify of the prefix skipped"; fi

test: $(STAMP)  ## run the whole test suite
	$(BIN)/python -m pytest -n 2 tests

goldens: $(STAMP)  ## regenerate the golden recipes and CI workflows (review the diff before committing)
	$(BIN)/python -m tests.golden.regenerate
	$(BIN)/python -m tests.golden.ci_regenerate
	$(BIN)/python -m tests.golden.conda_forge_regenerate

bench: $(STAMP)  ## run the benchmarks and print ratios (the repack row fetches the CUDA stack of repack-cuda-stack once, 3.9 GB)
	BENCH_STACK_REQUEST=$(STACK_PYTORCH)/$(STACK_CUDA)/$(STACK_PY) $(BIN)/python -m bench

bench-quick: $(STAMP)  ## every benchmark once at small sizes (CI: a broken benchmark fails the run; no figures to quote)
	$(BIN)/python -m bench --quick

container-image: $(STAMP)  ## make the local podman build images for --container (rebuilds only what changed; root, podman, runc, debootstrap)
	$(BIN)/python -m tests.container_image

container-check: container-image  ## the real `torchforge build --container` builds with podman (tests/test_container_build.py)
	$(BIN)/python -m pytest -n 0 tests/test_container_build.py

ci-local: $(STAMP)  ## run `torchforge ci gitlab`'s pipeline for the torch_heavy fixture here, twice, with gitlab-ci-local + podman, and check its logs (.cache/ci-local); about 30 min
	nice $(BIN)/python -m pytest -n 0 -m ci_local tests/test_ci_local.py

clean:  ## remove the virtualenv and generated output
	rm -rf $(VENV) recipes forge-channel try build dist .pytest_cache
