# Every target sets itself up on a fresh machine: a virtual environment in .venv, torch pinned
# first (constraints.txt: the project's machines find its CPU build locally; elsewhere set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, or pip takes the CUDA build), then the
# project with its dev extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# Writers for test fixtures only: their declared dependencies would pull torchvision,
	# numpy<2.2 and transformers<5, so they are installed without them.
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0
	# Azurite, Azure's storage emulator, for the az:// tests (with the machine's Node.js)
	npm install --prefix .azurite --no-audit --no-fund --silent azurite@3.35.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zephon-torch demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) .azurite .pytest_cache .mypy_cache .ruff_cache
