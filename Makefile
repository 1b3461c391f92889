# Every target sets itself up on a fresh machine: a virtual environment in .venv, torch pinned
# first (constraints.txt: the project's machines find its CPU build locally; elsewhere set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, or pip takes the CUDA build), then the
# project with its dev extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make test-oldest`: the suite on the lowest Python and dependency versions the project
# declares (constraints-oldest.txt), in a virtual environment of its own; not run by CI
OLDEST_PYTHON ?= python3.10
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed

# Writers for test fixtures only: their declared dependencies would pull torchvision,
# numpy<2.2 and transformers<5, so they are installed without them.
FIXTURE_WRITERS := litdata==0.2.76 mosaicml-streaming==0.13.0
# Azurite, Azure's storage emulator, for the az:// tests (with the machine's Node.js)
AZURITE := npm install --prefix .azurite --no-audit --no-fund --silent azurite@3.35.0
# The hf extra's lowest huggingface_hub (what transformers 4.x takes), beside the suite's newer
# one: the tests that read hf:// with it put it first on PYTHONPATH in their subprocesses
HUB_LOWEST := .hub-lowest
HUB_LOWEST_PIP := -m pip install -q --no-deps --target $(HUB_LOWEST) huggingface_hub==0.34.0

.PHONY: install demo test test-oldest test-newest lint bench clean

$(STAMP): pyproject.toml constraints.txt setup.py zephon_torch/_native.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps $(FIXTURE_WRITERS)
	$(AZURITE)
	rm -rf $(HUB_LOWEST) && $(BIN)/python $(HUB_LOWEST_PIP)
	touch $(STAMP)

$(OLDEST_STAMP): pyproject.toml constraints-oldest.txt setup.py zephon_torch/_native.c
	$(OLDEST_PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q --upgrade pip
	$(OLDEST)/bin/python -m pip install -q -c constraints-oldest.txt 'torch==2.4.*'
	$(OLDEST)/bin/python -m pip install -q -c constraints-oldest.txt -e '.[dev]'
	$(OLDEST)/bin/python -m pip install -q -c constraints-oldest.txt --no-deps $(FIXTURE_WRITERS)
	test -d .azurite/node_modules || $(AZURITE)
	touch $(OLDEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zephon-torch demo

test: $(STAMP)
	test -d $(HUB_LOWEST)/huggingface_hub || $(BIN)/python $(HUB_LOWEST_PIP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-oldest: $(OLDEST_STAMP)
	test -d $(HUB_LOWEST)/huggingface_hub || $(OLDEST)/bin/python $(HUB_LOWEST_PIP)
	$(OLDEST)/bin/python -m pytest -q -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite on $(PYTHON) with the newest release of every dependency, upgraded at each run in
# .venv-newest (torch: the newest pip may take; moto kept at constraints.txt's pin; the fixture
# writers as above). Not part of `make test` nor CI: `PYTHON=python3.13 make test-newest`.
NEWEST := .venv-newest

$(NEWEST)/bin/python:
	$(PYTHON) -m venv $(NEWEST)

test-newest: $(NEWEST)/bin/python
	$(NEWEST)/bin/python -m pip install -q --upgrade pip
	grep -v '^torch' constraints.txt > $(NEWEST)/constraints.txt
	$(NEWEST)/bin/python -m pip install -q --upgrade torch
	$(NEWEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager \
		-c $(NEWEST)/constraints.txt -e '.[dev]'
	$(NEWEST)/bin/python -m pip install -q --no-deps $(FIXTURE_WRITERS)
	test -d .azurite/node_modules || $(AZURITE)
	test -d $(HUB_LOWEST)/huggingface_hub || $(NEWEST)/bin/python $(HUB_LOWEST_PIP)
	$(NEWEST)/bin/python --version
	$(NEWEST)/bin/python -m pip freeze | grep -iE '^(torch|torchdata|numpy|pyarrow|tokenizers|transformers|huggingface.hub|fsspec|s3fs|gcsfs|adlfs|lightning|vortex-data|zstandard|hypothesis|moto)=='
	# mypy for the Python it runs on: numpy 2.5's stubs (Python >= 3.12) read as 3.10's fail
	$(NEWEST)/bin/mypy --python-version $$($(NEWEST)/bin/python -c \
		'import sys; print("%d.%d" % sys.version_info[:2])')
	$(NEWEST)/bin/python -m pytest -q -n 2 tests -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) $(OLDEST) $(NEWEST) .azurite $(HUB_LOWEST) .pytest_cache .mypy_cache .ruff_cache build zephon_torch/_native.*.so
