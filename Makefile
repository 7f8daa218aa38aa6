# Two entry points: `make reproduce` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= results
# MNIST IDX files for the MNIST experiments: passed on when the directory exists (else $TARGETPO_MNIST_DIR is
# used, and without data the MNIST experiments are reported as not run, with how to provide it).
MNIST_DIR ?= ../shared/data/mnist

.PHONY: reproduce test install bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all]'
	touch $@

install: $(VENV)/.installed

reproduce: $(VENV)/.installed
	$(VENV)/bin/targetpo reproduce --out $(OUT) $(if $(wildcard $(MNIST_DIR)),--data-dir $(MNIST_DIR),)

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/objectives.py --write BENCHMARKS.md
	$(PY) benchmarks/tokens.py --threads 1 --write BENCHMARKS.md

clean:
	rm -rf $(VENV) $(OUT)
