# Two entry points: `make reproduce` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= results
# MNIST IDX files for the MNIST experiments: passed on when the directory exists (else $TARGETPO_MNIST_DIR is
# used, and without data the MNIST experiments are reported as not run, with how to provide it).
MNIST_DIR ?= ../shared/data/mnist
# paper (the default), open-questions (the paper's §6 questions), llm (the LLM length study) or all.
SUITE ?= paper
# Experiments run at once, each in its own process with one torch thread (empty: one per CPU core; 1: one after
# another). The results do not depend on it.
JOBS ?=

.PHONY: reproduce test install bench clean

# constraints.txt pins every package to the versions the tests run with (pyproject.toml keeps the ranges).
$(VENV)/.installed: pyproject.toml constraints.txt src/targetpo/__init__.py  # __init__: the version
	@echo "installing targetpo with every extra into $(VENV) (first time ~3 min)…"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -c constraints.txt --upgrade pip
	$(PY) -m pip install -c constraints.txt -e '.[all]'
	touch $@

install: $(VENV)/.installed

reproduce: $(VENV)/.installed
	$(VENV)/bin/targetpo reproduce --out $(OUT) --suite $(SUITE) $(if $(JOBS),--jobs $(JOBS),) $(if $(wildcard $(MNIST_DIR)),--data-dir $(MNIST_DIR),)

# -n auto: one pytest worker per core (pytest-xdist); `make test PYTEST_ARGS="-n 0"` runs in one process.
PYTEST_ARGS ?= -n auto
test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) benchmarks/objectives.py --write BENCHMARKS.md
	$(PY) benchmarks/tokens.py --threads 1 --write BENCHMARKS.md

clean:
	rm -rf $(VENV) $(OUT)
